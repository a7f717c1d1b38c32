#include "base/error.h"

#include <type_traits>

namespace dtensor {
namespace {

// c10::Error's "no backtrace": an empty string in libtorch 1.x, a null pointer in 2.x (where the
// backtrace became a lazily computed value). The GPU check builds against 2.x (NOTE [GPU check]).
auto no_backtrace() {
  if constexpr (std::is_constructible_v<c10::Error, std::string, std::string>) {
    return std::string();
  } else {
    return nullptr;
  }
}

}  // namespace

Error::Error(std::string message) : c10::Error(std::move(message), no_backtrace()) {}

}  // namespace dtensor
