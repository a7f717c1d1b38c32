#pragma once
// The BPE model of Hugging Face's tokenizer.json (model.type "BPE"): a vocabulary, merges by
// rank, byte fallback (<0xXX> tokens for characters outside the vocabulary), an unknown token
// (fused or not), and ignore_merges (a word found whole in the vocabulary is one token).
//
// NOTE [bpe merges]: a word starts as one symbol per character (or per byte token under byte
// fallback); the adjacent pair of lowest merge rank merges, leftmost first among equal ranks,
// until no adjacent pair has a merge. This is the order of the reference's priority queue
// (rank, then position) without dropout. Results are cached per word: pre-tokenized words repeat.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dtensor::serving::text {

struct BpeOptions {
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class Bpe {
 public:
  // `merges`: pairs of token strings, rank = position. Every pair and its concatenation must be
  // in the vocabulary.
  Bpe(std::unordered_map<std::string, int64_t> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);

  // The ids of one pre-tokenized word (UTF-8, in the model's alphabet).
  std::vector<int64_t> tokenize(const std::string& word) const;

  std::optional<int64_t> token_to_id(const std::string& token) const;
  const std::string* id_to_token(int64_t id) const;  // nullptr when unknown
  int64_t max_id() const { return max_id_; }

 private:
  std::vector<int64_t> merge_word(const std::string& word) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<int64_t, std::string> vocab_r_;
  // (left id, right id) packed into 64 bits -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int64_t>> merges_;
  BpeOptions options_;
  std::optional<int64_t> unk_id_;
  int64_t byte_ids_[256];  // <0xXX> token ids, -1 when absent
  int64_t max_id_ = -1;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

}  // namespace dtensor::serving::text
