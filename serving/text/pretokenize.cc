#include "serving/text/pretokenize.h"

#include <algorithm>
#include <array>

#include "serving/text/unicode.h"

namespace dtensor::serving::text {
namespace {

struct Family {
  bool ci_contractions;    // (?i:...)
  bool any_letter_prefix;  // [^\r\n\p{L}\p{N}]?\p{L}+ rather than ` ?\p{L}+`
  int max_digits;          // 0: ` ?\p{N}+`
  bool newlines;           // `[\r\n]*` after other characters, and the `\s*[\r\n]+` alternative
};

Family family(SplitPattern p) {
  switch (p) {
    case SplitPattern::kGpt2:
      return {false, false, 0, false};
    case SplitPattern::kLlama3:
      return {true, true, 3, true};
    case SplitPattern::kQwen2:
      return {true, true, 1, true};
  }
  return {};
}

bool is_newline(char32_t c) { return c == '\r' || c == '\n'; }
bool is_other(char32_t c) { return !is_whitespace(c) && !is_letter(c) && !is_number(c); }

// Simple case folding of the contraction letters (U+017F LATIN SMALL LETTER LONG S folds to s).
char32_t fold(char32_t c, bool ci) {
  if (!ci) return c;
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c == 0x17F) return 's';
  return c;
}

size_t match_contraction(const std::u32string& s, size_t i, bool ci) {
  if (s[i] != '\'' || i + 1 >= s.size()) return 0;
  const char32_t a = fold(s[i + 1], ci);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= s.size()) return 0;
  const char32_t b = fold(s[i + 2], ci);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

template <typename Pred>
size_t run(const std::u32string& s, size_t i, Pred pred, size_t max = std::u32string::npos) {
  size_t j = i;
  while (j < s.size() && j - i < max && pred(s[j])) ++j;
  return j - i;
}

// The length of the match at `i`, or 0.
size_t match_at(const Family& f, const std::u32string& s, size_t i) {
  if (size_t n = match_contraction(s, i, f.ci_contractions)) return n;
  const size_t n = s.size();
  const char32_t c = s[i];
  const bool next_exists = i + 1 < n;
  // letters
  if (f.any_letter_prefix) {
    if (!is_newline(c) && !is_letter(c) && !is_number(c) && next_exists && is_letter(s[i + 1]))
      return 1 + run(s, i + 1, is_letter);
  } else if (c == ' ' && next_exists && is_letter(s[i + 1])) {
    return 1 + run(s, i + 1, is_letter);
  }
  if (is_letter(c)) return run(s, i, is_letter);
  // numbers
  if (f.max_digits == 0) {
    if (c == ' ' && next_exists && is_number(s[i + 1])) return 1 + run(s, i + 1, is_number);
    if (is_number(c)) return run(s, i, is_number);
  } else if (is_number(c)) {
    return run(s, i, is_number, f.max_digits);
  }
  // other characters
  size_t other = 0;
  if (c == ' ' && next_exists && is_other(s[i + 1])) {
    other = 1 + run(s, i + 1, is_other);
  } else if (is_other(c)) {
    other = run(s, i, is_other);
  }
  if (other) return f.newlines ? other + run(s, i + other, is_newline) : other;
  // whitespace
  const size_t ws = run(s, i, is_whitespace);
  if (ws == 0) return 0;
  if (f.newlines) {
    size_t last_newline = std::u32string::npos;
    for (size_t k = i; k < i + ws; ++k)
      if (is_newline(s[k])) last_newline = k;
    if (last_newline != std::u32string::npos) return last_newline + 1 - i;
  }
  if (i + ws == n) return ws;  // \s+(?!\S) at the end of the text
  if (ws >= 2) return ws - 1;  // \s+(?!\S) gives back the space before a non-space
  return ws;                   // \s+
}

}  // namespace

std::optional<SplitPattern> recognize_split_pattern(const std::string& regex) {
  static const std::string kGpt2 =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  static const std::string kLlama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static const std::string kQwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (regex == kGpt2) return SplitPattern::kGpt2;
  if (regex == kLlama3) return SplitPattern::kLlama3;
  if (regex == kQwen2) return SplitPattern::kQwen2;
  return std::nullopt;
}

std::vector<Span> find_pattern_matches(SplitPattern pattern, const std::u32string& s) {
  const Family f = family(pattern);
  std::vector<Span> out;
  for (size_t i = 0; i < s.size();) {
    const size_t len = match_at(f, s, i);
    if (len == 0) {
      ++i;
      continue;
    }
    out.emplace_back(i, i + len);
    i += len;
  }
  return out;
}

std::vector<Span> find_literal_matches(const std::u32string& literal, const std::u32string& s) {
  std::vector<Span> out;
  if (literal.empty()) return out;
  for (size_t i = s.find(literal); i != std::u32string::npos; i = s.find(literal, i)) {
    out.emplace_back(i, i + literal.size());
    i += literal.size();
  }
  return out;
}

std::optional<SplitBehavior> parse_split_behavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return std::nullopt;
}

std::vector<Span> split_spans(size_t n, const std::vector<Span>& matches, SplitBehavior behavior,
                              bool invert) {
  // The whole string as alternating (span, is delimiter) parts.
  std::vector<std::pair<Span, bool>> parts;
  size_t at = 0;
  for (const Span& m : matches) {
    if (m.first > at) parts.push_back({{at, m.first}, invert});
    if (m.second > m.first) parts.push_back({m, !invert});
    at = m.second;
  }
  if (at < n) parts.push_back({{at, n}, invert});
  std::vector<Span> out;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& [span, delim] : parts)
        if (!delim) out.push_back(span);
      break;
    case SplitBehavior::kIsolated:
      for (const auto& [span, delim] : parts) out.push_back(span);
      break;
    case SplitBehavior::kContiguous: {
      bool prev_delim = false;
      for (const auto& [span, delim] : parts) {
        if (delim && prev_delim && !out.empty()) {
          out.back().second = span.second;
        } else {
          out.push_back(span);
        }
        prev_delim = delim;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_delim = false;
      for (const auto& [span, delim] : parts) {
        if (delim && !prev_delim && !out.empty()) {
          out.back().second = span.second;
        } else {
          out.push_back(span);
        }
        prev_delim = delim;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_delim = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        const auto& [span, delim] = *it;
        if (delim && !prev_delim && !out.empty()) {
          out.back().first = span.first;
        } else {
          out.push_back(span);
        }
        prev_delim = delim;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  return out;
}

namespace {

struct ByteTables {
  std::array<char32_t, 256> to_char{};
  std::array<int, 0x144> to_byte{};  // the alphabet lies below U+0144
  ByteTables() {
    to_byte.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      to_byte[to_char[b]] = b;
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}

}  // namespace

char32_t byte_to_char(unsigned char b) { return byte_tables().to_char[b]; }

int char_to_byte(char32_t c) { return c < 0x144 ? byte_tables().to_byte[c] : -1; }

}  // namespace dtensor::serving::text
