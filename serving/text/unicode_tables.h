#pragma once
// Unicode data generated from Python's unicodedata by gen_unicode_tables.py (unicode_tables.cc):
// sorted, non-overlapping code point ranges and the canonical composition data NFC needs.

#include <cstddef>
#include <cstdint>

namespace dtensor::serving::text {

struct CodeRange {
  char32_t first, last;  // inclusive
};
struct CombiningRange {
  char32_t first, last;
  uint8_t ccc;  // the canonical combining class (nonzero) of every code point in the range
};
struct Decomposition {
  char32_t cp, first, second;  // second == 0: a singleton decomposition
};
struct Composition {
  char32_t first, second, composite;  // sorted by (first, second)
};

extern const CodeRange kLetterRanges[];  // general category L*
extern const size_t kLetterRangesSize;
extern const CodeRange kNumberRanges[];  // general category N*
extern const size_t kNumberRangesSize;
extern const CodeRange kWordRanges[];  // regex \w: Alphabetic, M, Nd, Pc, Join_Control
extern const size_t kWordRangesSize;
extern const CombiningRange kCombiningRanges[];
extern const size_t kCombiningRangesSize;
extern const Decomposition kDecompositions[];  // sorted by cp; Hangul syllables are algorithmic
extern const size_t kDecompositionsSize;
extern const Composition kCompositions[];  // the primary composites
extern const size_t kCompositionsSize;

}  // namespace dtensor::serving::text
