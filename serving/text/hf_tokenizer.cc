#include "serving/text/hf_tokenizer.h"

#include <sys/stat.h>
#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "base/error.h"
#include "serving/text/added_tokens.h"
#include "serving/text/bpe.h"
#include "serving/text/chat_template.h"
#include "serving/text/decoders.h"
#include "serving/text/pretokenize.h"
#include "serving/text/unicode.h"

namespace dtensor::serving {
namespace {

using nlohmann::json;
using namespace text;

struct NormalizerStep {
  enum class Kind { kPrepend, kReplace, kNfc } kind;
  std::u32string a, b;  // kPrepend: a; kReplace: a -> b
};

struct PreTokenizerStep {
  enum class Kind { kSplitPattern, kSplitLiteral, kByteLevel, kMetaspace, kDigits } kind;
  SplitPattern pattern = SplitPattern::kGpt2;
  std::u32string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false, use_regex = false;  // kByteLevel
  char32_t replacement = 0;                          // kMetaspace
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;
  bool individual_digits = false;
};

// A piece of text on its way to the model; `at_start`: it begins at offset 0 of the input (the
// Metaspace pre-tokenizer's prepend_scheme "first").
struct Piece {
  std::u32string text;
  bool at_start;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DTENSOR_CHECK(f.good(), "tokenizer: cannot read ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool is_dir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string str_field(const json& j, const char* key, const std::string& what) {
  DTENSOR_CHECK(j.contains(key) && j[key].is_string(), "tokenizer.json: ", what,
                " needs a string '", key, "'");
  return j[key].get<std::string>();
}

// A token given as a string or as an AddedToken object {"content": ...} (tokenizer_config.json).
std::optional<std::string> token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return std::nullopt;
}

char32_t one_char(const std::string& s, const std::string& what) {
  const std::u32string u = utf8_decode(s);
  DTENSOR_CHECK(u.size() == 1, "tokenizer.json: ", what, " must be one character, got '", s, "'");
  return u[0];
}

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const json& tok, const json& config, std::optional<std::string> chat_template);

  using Tokenizer::encode;
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int64_t> token_id(const std::string& token) const override;
  std::optional<int64_t> bos_id() const override { return bos_; }
  std::optional<int64_t> eos_id() const override { return eos_; }
  const ChatTemplate* chat_template() const override { return chat_.get(); }

 private:
  void parse_normalizer(const json& j);
  void parse_pre_tokenizer(const json& j);
  void parse_post_processor(const json& j);
  std::u32string normalize(std::u32string s) const;
  std::vector<Piece> pre_tokenize(Piece piece) const;
  void encode_segment(const std::string& raw, bool at_start, std::vector<int64_t>& ids) const;

  std::unique_ptr<Bpe> bpe_;
  std::vector<NormalizerStep> normalizers_;
  std::vector<PreTokenizerStep> pre_tokenizers_;
  std::vector<DecoderStep> decoders_;
  std::vector<int64_t> prefix_ids_, suffix_ids_;  // the post-processor's, around one sequence
  std::vector<AddedToken> added_;
  std::unordered_map<std::string, int64_t> added_by_content_;
  std::unordered_map<int64_t, size_t> added_by_id_;
  TokenTrie raw_trie_, normalized_trie_;
  int64_t vocab_size_ = 0;
  std::optional<int64_t> bos_, eos_;
  std::unique_ptr<ChatTemplate> chat_;
};

HfTokenizer::HfTokenizer(const json& tok, const json& config,
                         std::optional<std::string> chat_template) {
  DTENSOR_CHECK(tok.is_object(), "tokenizer.json: not a JSON object");
  DTENSOR_CHECK(!tok.contains("truncation") || tok["truncation"].is_null(),
                "tokenizer.json: truncation ", tok["truncation"].dump(),
                " is not supported (the server refuses over-long prompts instead)");
  // The model.
  DTENSOR_CHECK(tok.contains("model") && tok["model"].is_object(), "tokenizer.json: no model");
  const json& m = tok["model"];
  const std::string type = m.value("type", std::string("BPE"));
  DTENSOR_CHECK(type == "BPE", "tokenizer.json: model.type '", type,
                "' is not supported (only BPE)");
  DTENSOR_CHECK(!m.contains("dropout") || m["dropout"].is_null(), "tokenizer.json: model.dropout ",
                m["dropout"].dump(), " is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    DTENSOR_CHECK(!m.contains(key) || m[key].is_null() || m[key] == "", "tokenizer.json: model.",
                  key, " ", m[key].dump(), " is not supported");
  }
  BpeOptions opts;
  if (m.contains("unk_token") && !m["unk_token"].is_null())
    opts.unk_token = m["unk_token"].get<std::string>();
  opts.fuse_unk = m.value("fuse_unk", false);
  opts.byte_fallback = m.value("byte_fallback", false);
  opts.ignore_merges = m.value("ignore_merges", false);
  std::unordered_map<std::string, int64_t> vocab;
  for (const auto& [token, id] : m.at("vocab").items()) vocab.emplace(token, id.get<int64_t>());
  std::vector<std::pair<std::string, std::string>> merges;
  for (const json& mg : m.at("merges")) {
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      DTENSOR_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                    "tokenizer.json: merge '", s, "' is not two tokens separated by a space");
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      DTENSOR_CHECK(mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string(),
                    "tokenizer.json: merge ", mg.dump(), " is not a pair of strings");
      merges.emplace_back(mg[0].get<std::string>(), mg[1].get<std::string>());
    }
  }
  bpe_ = std::make_unique<Bpe>(std::move(vocab), merges, opts);
  vocab_size_ = bpe_->max_id() + 1;

  parse_normalizer(tok.value("normalizer", json()));
  parse_pre_tokenizer(tok.value("pre_tokenizer", json()));
  decoders_ = parse_decoder(tok.value("decoder", json()));

  // Added tokens: a normalized token is matched in normalized text, so its own text is
  // normalized as the reference does.
  for (const json& a : tok.value("added_tokens", json::array())) {
    AddedToken t;
    t.id = a.at("id").get<int64_t>();
    t.content = a.at("content").get<std::string>();
    t.single_word = a.value("single_word", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.special = a.value("special", false);
    t.normalized = a.value("normalized", !t.special);
    const int index = static_cast<int>(added_.size());
    added_by_content_[t.content] = t.id;
    added_by_id_[t.id] = added_.size();
    if (t.normalized) {
      normalized_trie_.add(utf8_encode(normalize(utf8_decode(t.content))), index);
    } else {
      raw_trie_.add(t.content, index);
    }
    vocab_size_ = std::max(vocab_size_, t.id + 1);
    added_.push_back(std::move(t));
  }
  parse_post_processor(tok.value("post_processor", json()));

  if (config.is_object()) {
    if (auto b = token_text(config.value("bos_token", json()))) bos_ = token_id(*b);
    if (auto e = token_text(config.value("eos_token", json()))) eos_ = token_id(*e);
    if (chat_template) {
      chat_ = std::make_unique<ChatTemplate>(ChatTemplate::recognize(
          *chat_template, token_text(config.value("bos_token", json())).value_or(""),
          token_text(config.value("eos_token", json())).value_or("")));
    }
  }
}

void HfTokenizer::parse_normalizer(const json& j) {
  if (j.is_null()) return;
  const std::string type = str_field(j, "type", "a normalizer");
  if (type == "Sequence") {
    for (const json& n : j.at("normalizers")) parse_normalizer(n);
  } else if (type == "Prepend") {
    normalizers_.push_back(
        {NormalizerStep::Kind::kPrepend, utf8_decode(str_field(j, "prepend", "Prepend")), {}});
  } else if (type == "Replace") {
    const json& p = j.at("pattern");
    DTENSOR_CHECK(p.contains("String"), "tokenizer.json: normalizer Replace with pattern ",
                  p.dump(), " is not supported (only a String pattern)");
    normalizers_.push_back({NormalizerStep::Kind::kReplace,
                            utf8_decode(p["String"].get<std::string>()),
                            utf8_decode(str_field(j, "content", "Replace"))});
  } else if (type == "NFC") {
    normalizers_.push_back({NormalizerStep::Kind::kNfc, {}, {}});
  } else {
    fail("tokenizer.json: normalizer type '", type,
         "' is not supported (supported: Sequence, Prepend, Replace, NFC)");
  }
}

void HfTokenizer::parse_pre_tokenizer(const json& j) {
  if (j.is_null()) return;
  const std::string type = str_field(j, "type", "a pre_tokenizer");
  PreTokenizerStep s;
  if (type == "Sequence") {
    for (const json& p : j.at("pretokenizers")) parse_pre_tokenizer(p);
    return;
  } else if (type == "Split") {
    const json& p = j.at("pattern");
    if (p.contains("Regex")) {
      const std::string re = p["Regex"].get<std::string>();
      auto family = recognize_split_pattern(re);
      DTENSOR_CHECK(family, "tokenizer.json: pre_tokenizer Split with Regex '", re,
                    "' is not supported (supported: the patterns of GPT-2, Llama 3 and Qwen2; "
                    "NOTE [split patterns])");
      s.kind = PreTokenizerStep::Kind::kSplitPattern;
      s.pattern = *family;
    } else {
      DTENSOR_CHECK(p.contains("String"), "tokenizer.json: pre_tokenizer Split pattern ", p.dump(),
                    " is not supported");
      s.kind = PreTokenizerStep::Kind::kSplitLiteral;
      s.literal = utf8_decode(p["String"].get<std::string>());
    }
    const std::string behavior = str_field(j, "behavior", "Split");
    auto b = parse_split_behavior(behavior);
    DTENSOR_CHECK(b, "tokenizer.json: Split behavior '", behavior, "' is not supported");
    s.behavior = *b;
    s.invert = j.value("invert", false);
  } else if (type == "ByteLevel") {
    s.kind = PreTokenizerStep::Kind::kByteLevel;
    s.add_prefix_space = j.value("add_prefix_space", true);
    s.use_regex = j.value("use_regex", true);
  } else if (type == "Metaspace") {
    s.kind = PreTokenizerStep::Kind::kMetaspace;
    s.replacement = one_char(str_field(j, "replacement", "Metaspace"), "Metaspace's replacement");
    if (j.contains("prepend_scheme")) {
      const std::string scheme = j["prepend_scheme"].get<std::string>();
      if (scheme == "always") {
        s.prepend = PreTokenizerStep::Prepend::kAlways;
      } else if (scheme == "first") {
        s.prepend = PreTokenizerStep::Prepend::kFirst;
      } else if (scheme == "never") {
        s.prepend = PreTokenizerStep::Prepend::kNever;
      } else {
        fail("tokenizer.json: Metaspace prepend_scheme '", scheme, "' is not supported");
      }
    } else {
      s.prepend = j.value("add_prefix_space", true) ? PreTokenizerStep::Prepend::kAlways
                                                    : PreTokenizerStep::Prepend::kNever;
    }
    s.split = j.value("split", true);
  } else if (type == "Digits") {
    s.kind = PreTokenizerStep::Kind::kDigits;
    s.individual_digits = j.value("individual_digits", false);
  } else {
    fail("tokenizer.json: pre_tokenizer type '", type,
         "' is not supported (supported: Sequence, Split, ByteLevel, Metaspace, Digits)");
  }
  pre_tokenizers_.push_back(s);
}

void HfTokenizer::parse_post_processor(const json& j) {
  if (j.is_null()) return;
  const std::string type = str_field(j, "type", "a post_processor");
  if (type == "Sequence") {
    for (const json& p : j.at("processors")) parse_post_processor(p);
  } else if (type == "ByteLevel") {
    // Offsets only: no ids change.
  } else if (type == "TemplateProcessing") {
    DTENSOR_CHECK(prefix_ids_.empty() && suffix_ids_.empty(),
                  "tokenizer.json: more than one TemplateProcessing post_processor");
    const json& specials = j.value("special_tokens", json::object());
    bool seen_sequence = false;
    for (const json& item : j.at("single")) {
      if (item.contains("Sequence")) {
        DTENSOR_CHECK(item["Sequence"].value("id", std::string("A")) == "A" && !seen_sequence,
                      "tokenizer.json: TemplateProcessing single ", j["single"].dump(),
                      " is not supported (one sequence $A)");
        seen_sequence = true;
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].at("id").get<std::string>();
        DTENSOR_CHECK(specials.contains(name), "tokenizer.json: TemplateProcessing names '", name,
                      "', which is not in its special_tokens");
        for (const json& id : specials[name].at("ids"))
          (seen_sequence ? suffix_ids_ : prefix_ids_).push_back(id.get<int64_t>());
      } else {
        fail("tokenizer.json: TemplateProcessing item ", item.dump(), " is not supported");
      }
    }
  } else {
    fail("tokenizer.json: post_processor type '", type,
         "' is not supported (supported: Sequence, ByteLevel, TemplateProcessing)");
  }
}

std::optional<int64_t> HfTokenizer::token_id(const std::string& token) const {
  auto it = added_by_content_.find(token);
  if (it != added_by_content_.end()) return it->second;
  return bpe_->token_to_id(token);
}

std::u32string HfTokenizer::normalize(std::u32string s) const {
  for (const NormalizerStep& n : normalizers_) {
    switch (n.kind) {
      case NormalizerStep::Kind::kPrepend:
        if (!s.empty()) s = n.a + s;
        break;
      case NormalizerStep::Kind::kReplace: {
        if (n.a.empty()) break;
        std::u32string out;
        size_t at = 0;
        for (size_t i = s.find(n.a); i != std::u32string::npos; i = s.find(n.a, at)) {
          out.append(s, at, i - at);
          out += n.b;
          at = i + n.a.size();
        }
        out.append(s, at, std::u32string::npos);
        s = std::move(out);
        break;
      }
      case NormalizerStep::Kind::kNfc:
        s = nfc(s);
        break;
    }
  }
  return s;
}

std::vector<Piece> HfTokenizer::pre_tokenize(Piece piece) const {
  std::vector<Piece> pieces{std::move(piece)};
  for (const PreTokenizerStep& step : pre_tokenizers_) {
    std::vector<Piece> next;
    for (Piece& p : pieces) {
      std::u32string& s = p.text;
      std::vector<Span> spans;
      switch (step.kind) {
        case PreTokenizerStep::Kind::kSplitPattern:
          spans = split_spans(s.size(), find_pattern_matches(step.pattern, s), step.behavior,
                              step.invert);
          break;
        case PreTokenizerStep::Kind::kSplitLiteral:
          spans = split_spans(s.size(), find_literal_matches(step.literal, s), step.behavior,
                              step.invert);
          break;
        case PreTokenizerStep::Kind::kByteLevel:
          if (step.add_prefix_space && (s.empty() || s[0] != ' ')) s.insert(s.begin(), ' ');
          spans = step.use_regex
                      ? split_spans(s.size(), find_pattern_matches(SplitPattern::kGpt2, s),
                                    SplitBehavior::kIsolated, false)
                      : std::vector<Span>{{0, s.size()}};
          break;
        case PreTokenizerStep::Kind::kMetaspace: {
          for (char32_t& c : s)
            if (c == ' ') c = step.replacement;
          const bool prepend = step.prepend == PreTokenizerStep::Prepend::kAlways ||
                               (step.prepend == PreTokenizerStep::Prepend::kFirst && p.at_start);
          if (prepend && (s.empty() || s[0] != step.replacement))
            s.insert(s.begin(), step.replacement);
          spans = step.split
                      ? split_spans(s.size(),
                                    find_literal_matches(std::u32string(1, step.replacement), s),
                                    SplitBehavior::kMergedWithNext, false)
                      : std::vector<Span>{{0, s.size()}};
          break;
        }
        case PreTokenizerStep::Kind::kDigits: {
          std::vector<Span> digits;
          for (size_t i = 0; i < s.size(); ++i)
            if (is_number(s[i])) digits.emplace_back(i, i + 1);
          spans = split_spans(
              s.size(), digits,
              step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
              false);
          break;
        }
      }
      for (const Span& sp : spans) {
        if (sp.second <= sp.first) continue;
        Piece q{s.substr(sp.first, sp.second - sp.first), p.at_start && sp.first == 0};
        if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
          std::u32string mapped;
          for (unsigned char b : utf8_encode(q.text)) mapped.push_back(byte_to_char(b));
          q.text = std::move(mapped);
        }
        next.push_back(std::move(q));
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

void HfTokenizer::encode_segment(const std::string& raw, bool at_start,
                                 std::vector<int64_t>& ids) const {
  const std::string normalized = utf8_encode(normalize(utf8_decode(raw)));
  bool first = true;
  for (auto& [text, index] : split_added(normalized, normalized_trie_, added_)) {
    if (index >= 0) {
      ids.push_back(added_[index].id);
    } else {
      for (const Piece& p : pre_tokenize({utf8_decode(text), at_start && first})) {
        const std::vector<int64_t> w = bpe_->tokenize(utf8_encode(p.text));
        ids.insert(ids.end(), w.begin(), w.end());
      }
    }
    first = false;
  }
}

std::vector<int64_t> HfTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  // NOTE [hf tokenizer pipeline].
  std::vector<int64_t> ids;
  if (add_special_tokens) ids = prefix_ids_;
  bool first = true;
  for (auto& [segment, index] : split_added(text, raw_trie_, added_)) {
    if (index >= 0) {
      ids.push_back(added_[index].id);
    } else {
      encode_segment(segment, first, ids);
    }
    first = false;
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int64_t>& ids) const {
  // Added tokens go through the decoder with the model's tokens, as the reference does (its
  // Strip and Metaspace decoders see them as the first token).
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    auto added = added_by_id_.find(id);
    if (added != added_by_id_.end()) {
      tokens.push_back(added_[added->second].content);
    } else if (const std::string* t = bpe_->id_to_token(id)) {
      tokens.push_back(*t);
    }
    // Ids outside the vocabulary have no text; the reference skips them too.
  }
  return run_decoder(decoders_, std::move(tokens));
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  const bool dir = is_dir(path);
  const std::string tok_path = dir ? path + "/tokenizer.json" : path;
  const std::string base = dir ? path : path.substr(0, path.find_last_of('/') + 1);
  const std::string prefix = dir ? base + "/" : base;
  json tok = json::parse(read_file(tok_path), nullptr, /*allow_exceptions=*/false);
  DTENSOR_CHECK(!tok.is_discarded(), "tokenizer: ", tok_path, " is not valid JSON");
  json config;
  std::optional<std::string> chat;
  if (exists(prefix + "tokenizer_config.json")) {
    config = json::parse(read_file(prefix + "tokenizer_config.json"), nullptr, false);
    DTENSOR_CHECK(!config.is_discarded(), "tokenizer: ", prefix,
                  "tokenizer_config.json is not valid JSON");
    const json& t = config.value("chat_template", json());
    if (t.is_string()) {
      chat = t.get<std::string>();
    } else if (t.is_array()) {
      // Named templates: the one called "default".
      for (const json& named : t)
        if (named.value("name", std::string()) == "default") chat = named.at("template");
    }
  }
  if (exists(prefix + "chat_template.jinja")) chat = read_file(prefix + "chat_template.jinja");
  if (!config.is_object()) config = json::object();
  return std::make_unique<HfTokenizer>(tok, config, chat);
}

}  // namespace dtensor::serving
