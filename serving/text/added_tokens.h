#pragma once
// Added tokens (tokenizer.json's "added_tokens") and cutting them out of text before the model
// sees it (NOTE [hf tokenizer pipeline], steps 1 and 2).

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dtensor::serving::text {

struct AddedToken {
  int64_t id;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// A byte trie of added tokens' texts, matched leftmost-longest without overlaps (the reference's
// Aho-Corasick with MatchKind::LeftmostLongest).
class TokenTrie {
 public:
  void add(const std::string& s, int index) {
    int node = 0;
    for (unsigned char c : s) {
      auto it = nodes_[node].next.find(c);
      if (it == nodes_[node].next.end()) {
        nodes_.push_back({});
        it = nodes_[node].next.emplace(c, static_cast<int>(nodes_.size()) - 1).first;
      }
      node = it->second;
    }
    nodes_[node].index = index;
  }
  bool empty() const { return nodes_[0].next.empty(); }
  struct Match {
    size_t begin, end;
    int index;
  };
  std::vector<Match> find(const std::string& s) const {
    std::vector<Match> out;
    for (size_t i = 0; i < s.size();) {
      int node = 0, best = -1;
      size_t best_end = 0;
      for (size_t k = i; k < s.size(); ++k) {
        auto it = nodes_[node].next.find(static_cast<unsigned char>(s[k]));
        if (it == nodes_[node].next.end()) break;
        node = it->second;
        if (nodes_[node].index >= 0) {
          best = nodes_[node].index;
          best_end = k + 1;
        }
      }
      if (best >= 0) {
        out.push_back({i, best_end, best});
        i = best_end;
      } else {
        ++i;
      }
    }
    return out;
  }

 private:
  struct Node {
    std::map<unsigned char, int> next;
    int index = -1;
  };
  std::vector<Node> nodes_{1};
};

// The pieces of `s` around the added tokens `trie` finds: text (index -1) and added tokens (their
// index in `added`), honouring single_word, lstrip and rstrip as the reference does.
std::vector<std::pair<std::string, int>> split_added(const std::string& s, const TokenTrie& trie,
                                                     const std::vector<AddedToken>& added);

}  // namespace dtensor::serving::text
