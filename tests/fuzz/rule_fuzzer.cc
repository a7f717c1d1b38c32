// Fuzz target: dtensor::sharding::parse_rule (sharding_prop/rule.h), the text a custom op's rule is
// registered with (sharding::register_rule, dtensor's Python register_sharding_rule).
//
// Input: "<rule text>" or "<rule text>\n<shapes>", shapes one comma list per input joined by ';'
// ("4,3;3,5"; an empty list is a 0-dim input). Without a shapes line every input gets a shape
// that fits the text (letter c has size 1 + c % 4), so most inputs reach past the shape checks.
// Property (NOTE [fuzz property]): a Rule or dtensor::Error; a parsed rule is well formed (one
// input per shape, every factor index valid, the output shape from the factors' sizes) and its
// text form (Rule::to_string) parses back, against the same shapes, to the same text.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sharding_prop/rule.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using Shapes = std::vector<std::vector<int64_t>>;

// "4,3;3,5" -> {{4,3},{3,5}}; items that are not small integers become 1 (the shapes only steer
// the parser; they are not what is fuzzed).
Shapes parse_shapes(std::string_view text) {
  Shapes shapes(1);
  int64_t value = 0;
  bool in_number = false;
  auto flush = [&] {
    if (in_number) shapes.back().push_back(value);
    value = 0;
    in_number = false;
  };
  for (char c : text) {
    if (c >= '0' && c <= '9') {
      value = value * 10 + (c - '0');
      if (value > (int64_t{1} << 40)) value = 1;
      in_number = true;
    } else if (c == ',') {
      flush();
    } else if (c == ';') {
      flush();
      shapes.emplace_back();
    }
  }
  flush();
  return shapes;
}

// One shape per comma-separated input of the text before "->", one dim per character.
Shapes shapes_for(std::string_view rule) {
  const size_t arrow = rule.find("->");
  const std::string_view ins = rule.substr(0, arrow == std::string_view::npos ? 0 : arrow);
  Shapes shapes(1);
  for (char c : ins) {
    if (c == ',') {
      shapes.emplace_back();
    } else if (c != ' ' && c != '\t') {
      shapes.back().push_back(1 + static_cast<unsigned char>(c) % 4);
    }
  }
  return shapes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtensor;
  using namespace dtensor::sharding;
  const std::string_view input = fuzz::as_text(data, size);
  const size_t newline = input.find('\n');
  const std::string_view text = input.substr(0, newline);
  const Shapes shapes = newline == std::string_view::npos ? shapes_for(text)
                                                          : parse_shapes(input.substr(newline + 1));
  Rule rule;
  if (!fuzz::parses(input, [&] { rule = parse_rule(text, shapes); })) return 0;

  FUZZ_CHECK(rule.inputs.size() == shapes.size() && rule.outputs.size() == 1, input,
             "tensor count");
  for (const auto* group : {&rule.inputs, &rule.outputs}) {
    for (const TensorFactors& t : *group) {
      for (const DimFactors& dim : t) {
        for (int f : dim) {
          FUZZ_CHECK(f >= 0 && static_cast<size_t>(f) < rule.factors.size(), input,
                     "factor index " + std::to_string(f));
        }
      }
    }
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    FUZZ_CHECK(rule.inputs[i].size() == shapes[i].size(), input, "input " + std::to_string(i));
    for (size_t d = 0; d < shapes[i].size(); ++d) {
      int64_t size = 1;
      for (int f : rule.inputs[i][d]) size *= rule.factors[f].size;
      FUZZ_CHECK(size == shapes[i][d], input, "input dim size");
    }
  }
  (void)rule.output_shape(0);

  const std::string round = rule.to_string();
  Rule again;
  FUZZ_CHECK(fuzz::parses(input, [&] { again = parse_rule(round, shapes); }), input,
             "to_string '" + round + "' does not parse");
  FUZZ_CHECK(again.to_string() == round, input,
             "'" + round + "' parses back as '" + again.to_string() + "'");
  return 0;
}
