// StreamDecoder (NOTE [streaming decode]): a 4-byte emoji split over byte tokens reaches the
// client whole, never as U+FFFD or half a sequence, and the streamed pieces add up to decode() of
// all ids.

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "serving/text/hf_tokenizer.h"
#include "serving/tokenizer.h"

namespace dtensor::serving {
namespace {

const std::string kEmoji = "\xF0\x9F\x98\x80";  // U+1F600
const std::string kReplacement = "\xEF\xBF\xBD";

// A SentencePiece-style tokenizer.json (Llama 2's layout) whose vocabulary has no emoji, so the
// emoji encodes as four byte-fallback tokens.
std::string byte_fallback_tokenizer() {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "</s>": 2)";
  char name[16];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab += ", \"" + std::string(name) + "\": " + std::to_string(3 + b);
  }
  vocab += R"(, "▁": 259, "h": 260, "i": 261, "hi": 262, "▁hi": 263)";
  const std::string json = R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [
      {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
      {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
      {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
    "normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "▁"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": null,
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
      "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
      "vocab": {)" + vocab +
                           R"(},
      "merges": [["h", "i"], ["▁", "hi"]]}})";
  return json;
}

std::vector<std::string> stream(const Tokenizer& tok, const std::vector<int64_t>& ids) {
  StreamDecoder d(tok);
  std::vector<std::string> pieces;
  for (int64_t id : ids) pieces.push_back(d.push(id));
  pieces.push_back(d.finish());
  return pieces;
}

TEST(StreamDecoder, EmojiOverByteFallbackTokens) {
  const std::string path = testing::TempDir() + "/byte_fallback_tokenizer.json";
  std::ofstream(path) << byte_fallback_tokenizer();
  const auto tok = load_hf_tokenizer(path);
  const std::vector<int64_t> ids = tok->encode("hi " + kEmoji + " hi", true);
  // <s>, "▁hi", "▁", the emoji's four bytes, "▁hi".
  ASSERT_EQ(ids, (std::vector<int64_t>{1, 263, 259, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80, 263}));
  // decode() of the prefix ending inside the emoji shows U+FFFD per byte (the reference does):
  // the stream must not send those.
  EXPECT_EQ(tok->decode({263, 259, 3 + 0xF0, 3 + 0x9F}), "hi " + kReplacement + kReplacement);
  const std::vector<std::string> pieces = stream(*tok, ids);
  std::string joined;
  for (const std::string& p : pieces) {
    EXPECT_EQ(p.find(kReplacement), std::string::npos) << p;
    joined += p;
  }
  EXPECT_EQ(joined, tok->decode(ids));
  EXPECT_EQ(joined, "<s> hi " + kEmoji + " hi");  // the reference strips no space after <s>
  // The emoji arrives whole with its last byte token, nothing before it.
  EXPECT_EQ(pieces[3], "");
  EXPECT_EQ(pieces[4], "");
  EXPECT_EQ(pieces[5], "");
  EXPECT_EQ(pieces[6], kEmoji);
  std::remove(path.c_str());
}

TEST(StreamDecoder, EmojiOverRawBytes) {
  // The byte tokenizer's decode gives raw bytes: a partial sequence is held back.
  ByteTokenizer tok(512);
  const std::vector<int64_t> ids = tok.encode("a" + kEmoji + "b");
  const std::vector<std::string> pieces = stream(tok, ids);
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "", kEmoji, "b", ""}));
}

TEST(StreamDecoder, FinishReturnsAnIncompleteTail) {
  ByteTokenizer tok(512);
  StreamDecoder d(tok);
  EXPECT_EQ(d.push(0xF0), "");
  EXPECT_EQ(d.push(0x9F), "");
  EXPECT_EQ(d.finish(), "\xF0\x9F");
}

}  // namespace
}  // namespace dtensor::serving
