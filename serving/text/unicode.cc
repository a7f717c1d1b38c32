#include "serving/text/unicode.h"

#include <algorithm>

#include "base/error.h"
#include "serving/text/unicode_tables.h"

namespace dtensor::serving::text {
namespace {

bool in_ranges(const CodeRange* r, size_t n, char32_t c) {
  const CodeRange* end = r + n;
  const CodeRange* it =
      std::upper_bound(r, end, c, [](char32_t v, const CodeRange& x) { return v < x.first; });
  return it != r && c <= (it - 1)->last;
}

// Hangul syllables compose and decompose algorithmically (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t ccc(char32_t c) {
  if (c < 0x300) return 0;
  const CombiningRange* end = kCombiningRanges + kCombiningRangesSize;
  const CombiningRange* it = std::upper_bound(
      kCombiningRanges, end, c, [](char32_t v, const CombiningRange& x) { return v < x.first; });
  return it != kCombiningRanges && c <= (it - 1)->last ? (it - 1)->ccc : 0;
}

void decompose(char32_t c, std::u32string& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* end = kDecompositions + kDecompositionsSize;
  const Decomposition* it = std::lower_bound(
      kDecompositions, end, c, [](const Decomposition& x, char32_t v) { return x.cp < v; });
  if (it == end || it->cp != c) {
    out.push_back(c);
    return;
  }
  decompose(it->first, out);
  if (it->second) decompose(it->second, out);
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const Composition* end = kCompositions + kCompositionsSize;
  const Composition* it =
      std::lower_bound(kCompositions, end, std::make_pair(a, b),
                       [](const Composition& x, const std::pair<char32_t, char32_t>& v) {
                         return x.first < v.first || (x.first == v.first && x.second < v.second);
                       });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = s[i];
    int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    DTENSOR_CHECK(len > 0 && i + len <= s.size(), "tokenizer: invalid UTF-8 at byte ", i);
    char32_t cp = len == 1 ? b : b & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      const unsigned char c = s[i + k];
      DTENSOR_CHECK((c & 0xC0) == 0x80, "tokenizer: invalid UTF-8 at byte ", i + k);
      cp = (cp << 6) | (c & 0x3F);
    }
    DTENSOR_CHECK(cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF) &&
                      (len == 1 || cp >= (len == 2   ? 0x80u
                                          : len == 3 ? 0x800u
                                                     : 0x10000u)),
                  "tokenizer: invalid UTF-8 at byte ", i);
    out.push_back(cp);
    i += len;
  }
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

size_t utf8_complete_prefix(const std::string& s) {
  // Look back at most 3 bytes for the lead byte of a sequence still missing continuation bytes.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char b = s[n - back];
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for its lead
    const size_t need = (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

bool is_letter(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  return in_ranges(kLetterRanges, kLetterRangesSize, c);
}

bool is_number(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return in_ranges(kNumberRanges, kNumberRangesSize, c);
}

bool is_word_char(char32_t c) {
  if (c < 0x80)
    return ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c >= '0' && c <= '9') || c == '_';
  return in_ranges(kWordRanges, kWordRangesSize, c);
}

bool is_whitespace(char32_t c) {
  // The White_Space property (PropList.txt): what Oniguruma's \s matches in Unicode text.
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

std::u32string nfc(const std::u32string& s) {
  // Below U+0300 every code point has class 0 and is its own NFC, and none is the second of a
  // composition pair (gen_unicode_tables.py's tables; nfc_test in hf_text_test.py checks).
  if (std::all_of(s.begin(), s.end(), [](char32_t c) { return c < 0x300; })) return s;
  std::u32string d;
  d.reserve(s.size());
  for (char32_t c : s) decompose(c, d);
  // Canonical order: a stable sort of each run of nonzero classes.
  for (size_t i = 0; i < d.size();) {
    if (ccc(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && ccc(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j,
                     [](char32_t a, char32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  // Canonical composition: each character composes with the last starter unless a character
  // between them blocks it (class 0, or a class not below its own).
  std::u32string out;
  out.reserve(d.size());
  size_t starter = std::u32string::npos;
  int last_class = -1;
  for (char32_t c : d) {
    const int cc = ccc(c);
    if (starter != std::u32string::npos &&
        (last_class < cc || (last_class == 0 && out.size() == starter + 1))) {
      if (char32_t comp = compose(out[starter], c)) {
        out[starter] = comp;
        continue;
      }
    }
    if (cc == 0) {
      starter = out.size();
      last_class = 0;
    } else {
      last_class = cc;
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace dtensor::serving::text
