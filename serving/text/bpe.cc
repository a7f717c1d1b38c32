#include "serving/text/bpe.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <queue>
#include <tuple>

#include "base/error.h"

namespace dtensor::serving::text {
namespace {

constexpr size_t kCacheLimit = 1 << 16;  // words; the cache is cleared when it grows past this

uint64_t pair_key(int64_t a, int64_t b) {
  return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b);
}

size_t utf8_len(unsigned char b) {
  return b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
}

}  // namespace

Bpe::Bpe(std::unordered_map<std::string, int64_t> vocab,
         const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  for (const auto& [token, id] : vocab_) {
    DTENSOR_CHECK(id >= 0 && id < (int64_t{1} << 32), "tokenizer.json: model.vocab id ", id,
                  " of '", token, "' is out of range");
    vocab_r_[id] = token;
    max_id_ = std::max(max_id_, id);
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(name);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  if (options_.unk_token) {
    auto it = vocab_.find(*options_.unk_token);
    DTENSOR_CHECK(it != vocab_.end(), "tokenizer.json: model.unk_token '", *options_.unk_token,
                  "' is not in the vocabulary");
    unk_id_ = it->second;
  }
  DTENSOR_CHECK(merges.size() < size_t(std::numeric_limits<int32_t>::max()),
                "tokenizer.json: too many merges");
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    DTENSOR_CHECK(ia != vocab_.end() && ib != vocab_.end(), "tokenizer.json: merge ", rank, " ('",
                  a, "', '", b, "') names a token not in the vocabulary");
    DTENSOR_CHECK(ic != vocab_.end(), "tokenizer.json: merge ", rank, " ('", a, "', '", b,
                  "') makes '", a + b, "', which is not in the vocabulary");
    // The first rank of a pair wins, as in the reference (later duplicates are ignored).
    merges_.emplace(pair_key(ia->second, ib->second),
                    std::make_pair(static_cast<int32_t>(rank), ic->second));
  }
}

std::optional<int64_t> Bpe::token_to_id(const std::string& token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int64_t id) const {
  auto it = vocab_r_.find(id);
  return it == vocab_r_.end() ? nullptr : &it->second;
}

std::vector<int64_t> Bpe::tokenize(const std::string& word) const {
  if (word.empty()) return {};
  if (options_.ignore_merges) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) return {it->second};
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) return it->second;
  }
  std::vector<int64_t> ids = merge_word(word);
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() >= kCacheLimit) cache_.clear();
  cache_.emplace(word, ids);
  return ids;
}

std::vector<int64_t> Bpe::merge_word(const std::string& word) const {
  // The initial symbols (NOTE [bpe merges]).
  std::vector<int64_t> syms;
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    const size_t n = std::min(utf8_len(static_cast<unsigned char>(word[i])), word.size() - i);
    const std::string ch = word.substr(i, n);
    i += n;
    if (auto it = vocab_.find(ch); it != vocab_.end()) {
      syms.push_back(it->second);
      last_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : ch) syms.push_back(byte_ids_[b]);
        last_unk = false;
        continue;
      }
    }
    if (unk_id_) {
      if (!(options_.fuse_unk && last_unk)) syms.push_back(*unk_id_);
      last_unk = true;
    }
    // Without an unknown token the character is dropped, as the reference does.
  }
  // Lowest (rank, position) first through a heap over a linked list of symbols: O(n log n), as
  // a segment without a pre-tokenizer (SentencePiece-style) is one long word.
  const size_t n = syms.size();
  if (n < 2) return syms;
  std::vector<size_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t k = 0; k < n; ++k) {
    prev[k] = k - 1;  // wraps for k == 0: never read as a symbol
    next[k] = k + 1;
  }
  using Entry = std::tuple<int32_t, size_t, int64_t, int64_t>;  // rank, left, left id, right id
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  const auto push = [&](size_t left) {
    if (left >= n || next[left] >= n) return;
    auto it = merges_.find(pair_key(syms[left], syms[next[left]]));
    if (it != merges_.end()) heap.emplace(it->second.first, left, syms[left], syms[next[left]]);
  };
  for (size_t k = 0; k + 1 < n; ++k) push(k);
  while (!heap.empty()) {
    const auto [rank, left, a, b] = heap.top();
    heap.pop();
    const size_t right = next[left];
    // Stale entries: a symbol of the pair was merged away or changed since it was pushed.
    if (!alive[left] || right >= n || syms[left] != a || syms[right] != b) continue;
    syms[left] = merges_.at(pair_key(a, b)).second;
    alive[right] = false;
    next[left] = next[right];
    if (next[right] < n) prev[next[right]] = left;
    if (left > 0) {
      size_t p = prev[left];
      if (p < n) push(p);
    }
    push(left);
  }
  std::vector<int64_t> out;
  for (size_t k = 0; k < n; k = next[k]) out.push_back(syms[k]);
  return out;
}

}  // namespace dtensor::serving::text
