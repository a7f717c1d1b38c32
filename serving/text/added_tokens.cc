#include "serving/text/added_tokens.h"

#include "serving/text/unicode.h"

namespace dtensor::serving::text {
namespace {

// The code point ending at byte `end` / starting at byte `begin` of valid UTF-8 `s`.
char32_t cp_before(const std::string& s, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return utf8_decode(s.substr(b, end - b))[0];
}
char32_t cp_after(const std::string& s, size_t begin) {
  size_t e = begin + 1;
  while (e < s.size() && (static_cast<unsigned char>(s[e]) & 0xC0) == 0x80) ++e;
  return utf8_decode(s.substr(begin, e - begin))[0];
}

}  // namespace

std::vector<std::pair<std::string, int>> split_added(const std::string& s, const TokenTrie& trie,
                                                     const std::vector<AddedToken>& added) {
  std::vector<std::pair<std::string, int>> out;
  if (s.empty()) return out;
  if (trie.empty()) {
    out.emplace_back(s, -1);
    return out;
  }
  size_t at = 0;
  for (const TokenTrie::Match& m : trie.find(s)) {
    if (m.begin < at) continue;  // inside a previous token's stripped whitespace
    const AddedToken& t = added[m.index];
    size_t begin = m.begin, end = m.end;
    if (t.single_word) {
      const bool left_ok = begin == 0 || !is_word_char(cp_before(s, begin));
      const bool right_ok = end == s.size() || !is_word_char(cp_after(s, end));
      if (!left_ok || !right_ok) continue;
    }
    if (t.lstrip) {
      while (begin > at && is_whitespace(cp_before(s, begin))) {
        const char32_t c = cp_before(s, begin);
        begin -= c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
      }
    }
    if (t.rstrip) {
      while (end < s.size() && is_whitespace(cp_after(s, end))) {
        const char32_t c = cp_after(s, end);
        end += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
      }
    }
    if (begin > at) out.emplace_back(s.substr(at, begin - at), -1);
    out.emplace_back(std::string(), m.index);
    at = end;
  }
  if (at < s.size()) out.emplace_back(s.substr(at), -1);
  return out;
}

}  // namespace dtensor::serving::text
