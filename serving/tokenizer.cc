#include "serving/tokenizer.h"

#include <algorithm>

namespace dtensor::serving {
namespace {

constexpr size_t kMaxTail = 8;  // tokens kept for context when the window slides

// The length of `s` less a trailing UTF-8 sequence that more bytes could still complete.
size_t complete_prefix(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char b = s[n - back];
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look for its lead byte
    const size_t need = (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

std::string StreamDecoder::push(int64_t id) {
  // NOTE [streaming decode].
  window_.push_back(id);
  const std::string text = tokenizer_.decode(window_);
  if (text.size() <= prefix_.size() || complete_prefix(text) != text.size() ||
      ends_with_replacement(text))
    return "";
  std::string out = text.substr(prefix_.size());
  // Keep the shortest tail of the window that decodes alone to the end of `text`: a shorter one
  // would start inside a character (a lone continuation byte decodes as U+FFFD).
  for (size_t k = 1; k <= std::min<size_t>(kMaxTail, window_.size()); ++k) {
    const std::vector<int64_t> tail(window_.end() - k, window_.end());
    std::string tail_text = tokenizer_.decode(tail);
    if (tail_text.size() <= text.size() &&
        text.compare(text.size() - tail_text.size(), tail_text.size(), tail_text) == 0) {
      window_ = tail;
      prefix_ = std::move(tail_text);
      return out;
    }
  }
  prefix_ = text;  // no short tail decodes alone: keep the whole window
  return out;
}

std::string StreamDecoder::finish() {
  const std::string text = tokenizer_.decode(window_);
  std::string out = text.size() > prefix_.size() ? text.substr(prefix_.size()) : std::string();
  window_.clear();
  prefix_.clear();
  return out;
}

std::vector<int64_t> ByteTokenizer::encode(const std::string& text, bool) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(id));
    } else {
      out += "<|" + std::to_string(id) + "|>";
    }
  }
  return out;
}

}  // namespace dtensor::serving
