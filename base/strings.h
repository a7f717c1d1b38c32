#pragma once
// Text helpers for error messages and printing, shared by every package.

#include <cstdint>
#include <string>
#include <vector>

namespace dtensor {

inline std::string to_text(int64_t v) { return std::to_string(v); }
inline std::string to_text(const std::string& s) { return s; }

// "1,2,3" (or with another separator).
template <typename T>
std::string join(const std::vector<T>& items, const char* sep = ",") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += to_text(items[i]);
  }
  return out;
}

}  // namespace dtensor
