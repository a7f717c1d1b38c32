#pragma once
// The decoders of tokenizer.json (NOTE [hf tokenizer pipeline]): each step maps the list of token
// strings to a new list, as the reference's decode_chain does; the text is their concatenation.

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dtensor::serving::text {

struct DecoderStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind;
  std::string from, to;        // kReplace
  char32_t content = 0;        // kStrip: the character stripped
  size_t start = 0, stop = 0;  // kStrip: at most this many from each end
  char32_t replacement = 0;    // kMetaspace
  bool prepend = true;         // kMetaspace: prepend_scheme is not "never"
};

// The steps of a "decoder" object (Sequence flattened); throws naming an unsupported type.
std::vector<DecoderStep> parse_decoder(const nlohmann::json& j);

// The text of `tokens` under `steps` (no steps: the tokens joined by spaces, as the reference).
std::string run_decoder(const std::vector<DecoderStep>& steps, std::vector<std::string> tokens);

// Bytes as UTF-8 with each maximal invalid subsequence replaced by U+FFFD (Rust's
// String::from_utf8_lossy, which the reference's ByteLevel decoder uses).
std::string utf8_lossy(const std::string& bytes);
bool valid_utf8(const std::string& bytes);

}  // namespace dtensor::serving::text
