#pragma once
// The server's tokenizer interface, the byte-level tokenizer of the demo model, and the
// streaming decoder every tokenizer shares. Hugging Face tokenizers: serving/text/hf_tokenizer.h.
//
// NOTE [byte tokenizer]: the demo model has no trained tokenizer, so text maps to token ids byte by
// byte: byte b is token b (0..255). Ids the model can produce above 255 (its vocabulary is
// larger) have no bytes; they decode as the text "<|id|>", so no generated token is silently
// dropped. A real tokenizer (BPE, SentencePiece) implements the same interface.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtensor::serving {

class ChatTemplate;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The ids of `text`, with the tokenizer's special tokens (bos) when add_special_tokens: the
  // reference's encode(text, add_special_tokens). encode(text) adds them, as the reference does
  // by default.
  std::vector<int64_t> encode(const std::string& text) const { return encode(text, true); }
  virtual std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const = 0;
  // The text of `ids` in order (a token may end in the middle of a UTF-8 sequence: the HTTP layer
  // replaces invalid sequences when it writes JSON; StreamDecoder holds such tails back).
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  // One more than the largest id the tokenizer knows.
  virtual int64_t vocab_size() const = 0;
  // The id of a token given by its text (special tokens: "<|eot_id|>"), or nullopt.
  virtual std::optional<int64_t> token_id(const std::string& token) const { return std::nullopt; }
  virtual std::optional<int64_t> bos_id() const { return std::nullopt; }
  virtual std::optional<int64_t> eos_id() const { return std::nullopt; }
  // The model's chat template (serving/text/chat_template.h), or nullptr when it has none.
  virtual const ChatTemplate* chat_template() const { return nullptr; }
};

// NOTE [streaming decode]: text streamed token by token must not split a character: a token can
// end inside a UTF-8 sequence (byte-level BPE) or be one byte of it (byte fallback, which decodes
// an incomplete sequence as U+FFFD per byte). push() decodes a window of ids that begins with
// a few tokens already emitted and returns the text past their own text only when it ends in a
// complete character that is not U+FFFD; otherwise it holds the ids until a later token
// completes the sequence. After emitting, the window keeps the shortest tail of ids whose text
// alone is the end of the emitted text (so it does not begin inside a character); decoding
// with that context keeps rules that depend on position (a leading space stripped) the same for
// the window and its prefix.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // The newly complete text after `id` (possibly empty).
  std::string push(int64_t id);
  // Whatever is held back, as decode gives it.
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  std::vector<int64_t> window_;  // emitted ids kept for context, then the held ones
  std::string prefix_;           // decode() of the emitted ids in window_
};

class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(int64_t vocab_size) : vocab_(vocab_size) {}
  using Tokenizer::encode;
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_; }

 private:
  int64_t vocab_;
};

}  // namespace dtensor::serving
