#pragma once
// NOTE [fuzz property]: every parser fuzzed here documents one way to fail, dtensor::Error
// (NOTE [error convention]). For any input a parser must either return a value or throw
// dtensor::Error; anything else is a finding: another exception type (a bare c10::Error from a
// TORCH_CHECK or an internal assert, std::out_of_range, ...), a crash, or what ASan/UBSan report.
// Targets add value checks (a placement's text form parses back to the same value). A finding
// aborts, so libFuzzer saves the input as a crash file and the corpus replay test fails.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <typeinfo>

#include "base/error.h"

namespace dtensor::fuzz {

// `text` with non-printable bytes as \xNN, for messages.
inline std::string escaped(std::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

[[noreturn]] inline void finding(const std::string& what, std::string_view input) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n  input: \"%s\"\n", what.c_str(), escaped(input).c_str());
  std::fflush(stderr);
  std::abort();
}

// Runs `parse()`. Returns true when it returned, false when it threw dtensor::Error (the
// documented failure); any other exception is a finding about `input`.
template <class Parse>
bool parses(std::string_view input, Parse&& parse) {
  try {
    parse();
    return true;
  } catch (const dtensor::Error&) {
    return false;
  } catch (const std::exception& e) {
    finding(std::string("threw ") + typeid(e).name() + " instead of dtensor::Error: " + e.what(),
            input);
  } catch (...) {
    finding("threw a non-std::exception instead of dtensor::Error", input);
  }
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

}  // namespace dtensor::fuzz

// A value check: a finding naming `what` unless `cond` holds.
#define FUZZ_CHECK(cond, input, what)                                                     \
  do {                                                                                    \
    if (!(cond)) ::dtensor::fuzz::finding(std::string("check failed: ") + (what), input); \
  } while (false)
