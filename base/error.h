#pragma once
// NOTE [error convention]
// One exception type for everything a caller can get wrong or a peer can cause:
//   - User errors (bad arguments, unsupported layouts, an op without a rule, a collective that
//     failed or timed out) throw dtensor::Error, through DTENSOR_CHECK(cond, parts...) or
//     dtensor::fail(parts...). The message says what was asked and what exists: the op or
//     collective, the placements, the group and the rank.
//   - dtensor::Error derives from c10::Error, so `catch (const c10::Error&)` catches it like any
//     TORCH_CHECK failure. It reaches Python as RuntimeError whichever way it travels: through a
//     torch op (torch maps c10::Error to RuntimeError) or through the pybind11 bindings
//     (std::exception -> RuntimeError). Its what() is the message alone: no backtrace is
//     captured, so an error costs a string, not a stack walk.
//   - Broken internal invariants are TORCH_INTERNAL_ASSERT (a bug in the engine, not the caller).
//   - Searches over candidates (propagation, redistribute planning) return std::optional and
//     never catch: an exception in them is a real error and propagates.
//   - dtensor::InvalidValue, a dtensor::Error, marks the few bad values PyTorch reports as
//     ValueError; the bindings raise it as ValueError.
// Pure-Python checks in the `dtensor` package raise what PyTorch raises there (TypeError for a
// wrong type, KeyError for an unknown mesh dim name, ValueError for a bad value).

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <string>

namespace dtensor {

class Error : public c10::Error {
 public:
  explicit Error(std::string message);
  // The message alone (c10::Error's what() appends a backtrace).
  const char* what() const noexcept override { return what_without_backtrace(); }
};

// A bad value where PyTorch raises ValueError (from_local's metadata check): reaches Python as
// ValueError through the pybind11 bindings (python/csrc/bindings.cc registers the translation).
class InvalidValue : public Error {
 public:
  using Error::Error;
};

// Throws dtensor::Error with the parts concatenated (c10::str: strings, numbers, sizes).
template <typename... Args>
[[noreturn]] void fail(const Args&... parts) {
  throw Error(c10::str(parts...));
}

}  // namespace dtensor

// Throws dtensor::Error(c10::str(parts...)) unless `cond` holds. The parts are evaluated only on
// failure.
#define DTENSOR_CHECK(cond, ...)                             \
  do {                                                       \
    if (C10_UNLIKELY(!(cond))) ::dtensor::fail(__VA_ARGS__); \
  } while (false)
