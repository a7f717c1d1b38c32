#pragma once
// Stable hashing helpers. Stable means "the same value in every process and build", which group
// names and spec ids need (std::hash gives no such promise for strings).

#include <cstdint>
#include <string_view>

namespace dtensor {

constexpr uint64_t kFnvOffset = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnvOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

inline uint64_t fnv1a(std::string_view s, uint64_t h = kFnvOffset) {
  return fnv1a(s.data(), s.size(), h);
}

inline uint64_t fnv1a_int(int64_t v, uint64_t h = kFnvOffset) { return fnv1a(&v, sizeof(v), h); }

// boost::hash_combine's mixing, widened to 64 bits.
inline size_t hash_combine(size_t seed, size_t v) {
  return seed ^ (v + 0x9e3779b97f4a7c15ull + (seed << 12) + (seed >> 4));
}

}  // namespace dtensor
