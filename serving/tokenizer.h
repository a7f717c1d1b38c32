#pragma once
// The server's tokenizer interface and the byte-level tokenizer it uses.
//
// NOTE [byte tokenizer]: the demo model has no trained tokenizer, so text maps to token ids byte by
// byte: byte b is token b (0..255). Ids the model can produce above 255 (its vocabulary is
// larger) have no bytes; they decode as the text "<|id|>", so no generated token is silently
// dropped. A real tokenizer (BPE, SentencePiece) implements the same interface.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtensor::serving {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  // The text of `ids` in order (a token may end in the middle of a UTF-8 sequence: the HTTP layer
  // replaces invalid sequences when it writes JSON).
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(int64_t vocab_size) : vocab_(vocab_size) {}
  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_; }

 private:
  int64_t vocab_;
};

}  // namespace dtensor::serving
