// Fuzz target: dtensor::parse_placement / parse_placements (layout/placement.h), the syntax of
// every --placements / --from / --to flag and of the Python bindings' placement strings.
// Property (NOTE [fuzz property]): a value or dtensor::Error; a parsed value's text form
// (to_string) parses back to the same value, as one placement and as a list.

#include <cstddef>
#include <cstdint>
#include <string>

#include "layout/placement.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtensor;
  const std::string_view input = fuzz::as_text(data, size);

  Placement one;
  if (fuzz::parses(input, [&] { one = parse_placement(input); })) {
    const std::string text = one.to_string();
    Placement again;
    FUZZ_CHECK(fuzz::parses(input, [&] { again = parse_placement(text); }), input,
               "to_string '" + text + "' does not parse");
    FUZZ_CHECK(again == one, input, "'" + text + "' parses to " + again.to_string());
  }

  Placements list;
  if (fuzz::parses(input, [&] { list = parse_placements(input); })) {
    const std::string text = to_string(list);  // "[S(0),R]"
    Placements again;
    FUZZ_CHECK(fuzz::parses(input, [&] { again = parse_placements(text); }), input,
               "to_string '" + text + "' does not parse");
    FUZZ_CHECK(again == list, input, "'" + text + "' parses to " + to_string(again));
    // Without the brackets too (how the flags print a default).
    const std::string bare = text.substr(1, text.size() - 2);
    FUZZ_CHECK(fuzz::parses(input, [&] { again = parse_placements(bare); }) && again == list, input,
               "'" + bare + "' does not parse back");
  }
  return 0;
}
