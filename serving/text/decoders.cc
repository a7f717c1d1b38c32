#include "serving/text/decoders.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "serving/text/pretokenize.h"
#include "serving/text/unicode.h"

namespace dtensor::serving::text {
namespace {

using nlohmann::json;

const char kReplacementChar[] = "\xEF\xBF\xBD";

char32_t single_char(const json& j, const std::string& what) {
  DTENSOR_CHECK(j.is_string(), "tokenizer.json: ", what, " must be a string");
  const std::u32string s = utf8_decode(j.get<std::string>());
  DTENSOR_CHECK(s.size() == 1, "tokenizer.json: ", what, " must be one character, got '",
                j.get<std::string>(), "'");
  return s[0];
}

// The length of the valid UTF-8 sequence at `i`, or the negated length of the maximal prefix of
// one (at least 1) when it is invalid.
int sequence_at(const std::string& s, size_t i) {
  const unsigned char b = s[i];
  if (b < 0x80) return 1;
  int len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return -k;
    const unsigned char c = s[i + k];
    if (c < lo || c > hi) return -k;
    lo = 0x80;
    hi = 0xBF;
  }
  return len;
}

std::string byte_level_decode(const std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& t : tokens) {
    const std::u32string chars = utf8_decode(t);
    std::string mapped;
    bool all = true;
    for (char32_t c : chars) {
      const int b = char_to_byte(c);
      if (b < 0) {
        all = false;
        break;
      }
      mapped.push_back(static_cast<char>(b));
    }
    bytes += all ? mapped : t;  // a token outside the alphabet stays as it is
  }
  return utf8_lossy(bytes);
}

std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  std::string bytes;
  const auto flush = [&] {
    if (bytes.empty()) return;
    if (valid_utf8(bytes)) {
      out.push_back(bytes);
    } else {
      for (size_t k = 0; k < bytes.size(); ++k) out.push_back(kReplacementChar);
    }
    bytes.clear();
  };
  for (std::string& t : tokens) {
    const bool is_byte = t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
                         isxdigit(static_cast<unsigned char>(t[3])) &&
                         isxdigit(static_cast<unsigned char>(t[4]));
    if (is_byte) {
      bytes.push_back(static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  return out;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  size_t at = 0;
  for (size_t i = s.find(from); i != std::string::npos; i = s.find(from, at)) {
    out.append(s, at, i - at);
    out += to;
    at = i + from.size();
  }
  out.append(s, at, std::string::npos);
  return out;
}

void parse_into(const json& j, std::vector<DecoderStep>& steps) {
  DTENSOR_CHECK(j.is_object() && j.contains("type"), "tokenizer.json: a decoder has no type");
  const std::string type = j["type"].get<std::string>();
  DecoderStep s{};
  if (type == "Sequence") {
    for (const json& d : j.at("decoders")) parse_into(d, steps);
    return;
  } else if (type == "ByteLevel") {
    s.kind = DecoderStep::Kind::kByteLevel;
  } else if (type == "Replace") {
    s.kind = DecoderStep::Kind::kReplace;
    const json& p = j.at("pattern");
    DTENSOR_CHECK(p.contains("String"), "tokenizer.json: decoder Replace with pattern ", p.dump(),
                  " is not supported (only a String pattern)");
    s.from = p["String"].get<std::string>();
    s.to = j.at("content").get<std::string>();
  } else if (type == "ByteFallback") {
    s.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    s.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Strip") {
    s.kind = DecoderStep::Kind::kStrip;
    s.content = single_char(j.at("content"), "decoder Strip's content");
    s.start = j.at("start").get<size_t>();
    s.stop = j.at("stop").get<size_t>();
  } else if (type == "Metaspace") {
    s.kind = DecoderStep::Kind::kMetaspace;
    s.replacement = single_char(j.at("replacement"), "decoder Metaspace's replacement");
    if (j.contains("prepend_scheme")) {
      const std::string scheme = j["prepend_scheme"].get<std::string>();
      DTENSOR_CHECK(scheme == "always" || scheme == "first" || scheme == "never",
                    "tokenizer.json: decoder Metaspace prepend_scheme '", scheme,
                    "' is not supported");
      s.prepend = scheme != "never";
    } else {
      s.prepend = j.value("add_prefix_space", true);
    }
  } else {
    fail("tokenizer.json: decoder type '", type,
         "' is not supported (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, "
         "Metaspace)");
  }
  steps.push_back(s);
}

}  // namespace

bool valid_utf8(const std::string& bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const int n = sequence_at(bytes, i);
    if (n < 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_lossy(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const int n = sequence_at(bytes, i);
    if (n > 0) {
      out.append(bytes, i, n);
      i += n;
    } else {
      out += kReplacementChar;
      i += -n;
    }
  }
  return out;
}

std::vector<DecoderStep> parse_decoder(const json& j) {
  std::vector<DecoderStep> steps;
  if (!j.is_null()) parse_into(j, steps);
  return steps;
}

std::string run_decoder(const std::vector<DecoderStep>& steps, std::vector<std::string> tokens) {
  if (steps.empty()) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const DecoderStep& s : steps) {
    switch (s.kind) {
      case DecoderStep::Kind::kByteLevel:
        tokens = {byte_level_decode(tokens)};
        break;
      case DecoderStep::Kind::kReplace:
        for (std::string& t : tokens) t = replace_all(std::move(t), s.from, s.to);
        break;
      case DecoderStep::Kind::kByteFallback:
        tokens = byte_fallback(std::move(tokens));
        break;
      case DecoderStep::Kind::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens = {all};
        break;
      }
      case DecoderStep::Kind::kStrip:
        for (std::string& t : tokens) {
          const std::u32string c = utf8_decode(t);
          size_t b = 0, e = c.size();
          while (b < s.start && b < e && c[b] == s.content) ++b;
          for (size_t k = 0; k < s.stop && e > b && c[e - 1] == s.content; ++k) --e;
          t = utf8_encode(c.substr(b, e - b));
        }
        break;
      case DecoderStep::Kind::kMetaspace:
        // The reference drops the replacement characters of the first token and makes the
        // others spaces (prepend_scheme "never": spaces everywhere).
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::u32string out;
          for (char32_t c : utf8_decode(tokens[i])) {
            if (c != s.replacement) {
              out.push_back(c);
            } else if (!(i == 0 && s.prepend)) {
              out.push_back(' ');
            }
          }
          tokens[i] = utf8_encode(out);
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace dtensor::serving::text
