#include "serving/models/hf_config.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>

#include "base/error.h"
#include "nlohmann/json.hpp"

namespace dtensor::serving {

namespace {

using json = nlohmann::json;

// Typed access to the fields of one config file; every error names the file and the field.
struct Fields {
  const json& j;
  const std::string& source;

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }
  int64_t integer(const char* key) const {
    DTENSOR_CHECK(has(key), source, ": field '", key, "' is missing");
    DTENSOR_CHECK(j.at(key).is_number_integer(), source, ": field '", key,
                  "' must be an integer, got ", j.at(key).dump());
    return j.at(key).get<int64_t>();
  }
  int64_t integer(const char* key, int64_t fallback) const {
    return has(key) ? integer(key) : fallback;
  }
  double number(const json& obj, const char* key, double fallback) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
    DTENSOR_CHECK(obj.at(key).is_number(), source, ": field '", key, "' must be a number, got ",
                  obj.at(key).dump());
    return obj.at(key).get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    DTENSOR_CHECK(j.at(key).is_boolean(), source, ": field '", key, "' must be a boolean, got ",
                  j.at(key).dump());
    return j.at(key).get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    DTENSOR_CHECK(j.at(key).is_string(), source, ": field '", key, "' must be a string, got ",
                  j.at(key).dump());
    return j.at(key).get<std::string>();
  }
  // A token id field: absent, one id, or a list of ids.
  std::vector<int64_t> ids(const char* key) const {
    std::vector<int64_t> out;
    if (!has(key)) return out;
    const json& v = j.at(key);
    if (v.is_number_integer()) return {v.get<int64_t>()};
    DTENSOR_CHECK(v.is_array(), source, ": field '", key, "' must be an id or a list of ids, got ",
                  v.dump());
    for (const json& e : v) {
      DTENSOR_CHECK(e.is_number_integer(), source, ": field '", key, "' holds a non-integer ",
                    e.dump());
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
  [[noreturn]] void refuse(const char* key, const std::string& why) const {
    fail(source, ": field '", key, "' = ", j.contains(key) ? j.at(key).dump() : "(absent)", ": ",
         why);
  }
};

void read_rope(const Fields& f, HfConfig& c) {
  // transformers 5: "rope_parameters" {rope_type, rope_theta, factor, ...}; older files:
  // "rope_theta" at the top and an optional "rope_scaling" {type or rope_type, factor, ...}.
  const char* key = f.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  c.rope_theta = f.number(f.j, "rope_theta", 10000.0);
  if (!f.has(key)) return;
  const json& r = f.j.at(key);
  DTENSOR_CHECK(r.is_object(), f.source, ": field '", key, "' must be an object, got ", r.dump());
  DTENSOR_CHECK(!r.contains("layer_types") && !r.contains("full_attention"), f.source, ": field '",
                key, "' holds per-layer-type rope settings, which these families do not use");
  for (const auto& item : r.items()) {
    static const char* const kKnown[] = {"rope_type",
                                         "type",
                                         "rope_theta",
                                         "factor",
                                         "low_freq_factor",
                                         "high_freq_factor",
                                         "original_max_position_embeddings"};
    const bool known = std::any_of(std::begin(kKnown), std::end(kKnown),
                                   [&](const char* k) { return item.key() == k; });
    const bool neutral = item.key() == "partial_rotary_factor" && item.value().is_number() &&
                         item.value().get<double>() == 1.0;
    DTENSOR_CHECK(known || neutral, f.source, ": field '", key, "' holds '", item.key(),
                  "' = ", item.value().dump(), ", which this rope does not implement");
  }
  c.rope_theta = f.number(r, "rope_theta", c.rope_theta);
  std::string type = "default";
  for (const char* k : {"rope_type", "type"}) {
    if (r.contains(k) && r.at(k).is_string()) type = r.at(k).get<std::string>();
  }
  if (type == "default") {
    const double factor = f.number(r, "factor", 1.0);
    DTENSOR_CHECK(factor == 1.0, f.source, ": field '", key, "' has factor ", factor,
                  " with rope type default, which no rope applies");
    return;
  }
  if (type != "llama3") {
    f.refuse(key, "rope type '" + type + "' is not implemented (supported: default, llama3)");
  }
  c.llama3_rope = true;
  c.rope_factor = f.number(r, "factor", 1.0);
  c.low_freq_factor = f.number(r, "low_freq_factor", 1.0);
  c.high_freq_factor = f.number(r, "high_freq_factor", 4.0);
  c.original_max_positions =
      static_cast<int64_t>(f.number(r, "original_max_position_embeddings", 8192));
  DTENSOR_CHECK(
      c.rope_factor > 0 && c.high_freq_factor != c.low_freq_factor && c.original_max_positions > 0,
      f.source, ": field '", key, "' has invalid llama3 parameters ", r.dump());
}

}  // namespace

int64_t HfConfig::max_context() const {
  return sliding_window > 0 ? std::min(max_positions, sliding_window) : max_positions;
}

HfConfig parse_hf_config(const std::string& text, const std::string& source) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  DTENSOR_CHECK(!j.is_discarded() && j.is_object(), source, ": not a JSON object");
  const Fields f{j, source};
  HfConfig c;
  DTENSOR_CHECK(f.has("architectures") && j.at("architectures").is_array() &&
                    j.at("architectures").size() == 1 && j.at("architectures")[0].is_string(),
                source, ": field 'architectures' must list one architecture, got ",
                f.has("architectures") ? j.at("architectures").dump() : "(absent)");
  c.architecture = j.at("architectures")[0].get<std::string>();
  if (c.architecture == "LlamaForCausalLM") {
    c.family = Family::kLlama;
  } else if (c.architecture == "MistralForCausalLM") {
    c.family = Family::kMistral;
  } else if (c.architecture == "Qwen2ForCausalLM") {
    c.family = Family::kQwen2;
  } else if (c.architecture == "Qwen3ForCausalLM") {
    c.family = Family::kQwen3;
  } else {
    f.refuse("architectures",
             "unsupported architecture (supported: LlamaForCausalLM, MistralForCausalLM, "
             "Qwen2ForCausalLM, Qwen3ForCausalLM)");
  }
  c.vocab = f.integer("vocab_size");
  c.hidden = f.integer("hidden_size");
  c.intermediate = f.integer("intermediate_size");
  c.layers = f.integer("num_hidden_layers");
  c.heads = f.integer("num_attention_heads");
  c.kv_heads = f.integer("num_key_value_heads", c.heads);
  DTENSOR_CHECK(c.vocab > 0 && c.hidden > 0 && c.intermediate > 0 && c.layers > 0 && c.heads > 0 &&
                    c.kv_heads > 0,
                source, ": sizes must be positive (vocab_size ", c.vocab, ", hidden_size ",
                c.hidden, ", intermediate_size ", c.intermediate, ", num_hidden_layers ", c.layers,
                ", num_attention_heads ", c.heads, ", num_key_value_heads ", c.kv_heads, ")");
  if (c.heads % c.kv_heads != 0) {
    f.refuse("num_key_value_heads",
             c10::str("num_attention_heads ", c.heads, " is not a multiple of it"));
  }
  DTENSOR_CHECK(f.has("head_dim") || c.hidden % c.heads == 0, source, ": hidden_size ", c.hidden,
                " is not a multiple of num_attention_heads ", c.heads, " and head_dim is absent");
  c.head_dim = f.integer("head_dim", c.hidden / c.heads);
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) f.refuse("head_dim", "rotary needs an even size");
  c.eps = f.number(j, "rms_norm_eps", 1e-6);
  c.max_positions = f.integer("max_position_embeddings");
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.dtype = f.string("dtype", f.string("torch_dtype", "float32"));
  if (c.dtype != "float32" && c.dtype != "bfloat16" && c.dtype != "float16") {
    f.refuse(f.has("dtype") ? "dtype" : "torch_dtype",
             "unsupported dtype (supported: float32, bfloat16, float16)");
  }
  c.bos_token_ids = f.ids("bos_token_id");
  c.eos_token_ids = f.ids("eos_token_id");
  if (f.string("hidden_act", "silu") != "silu") {
    f.refuse("hidden_act", "only silu (SwiGLU) is implemented");
  }
  read_rope(f, c);
  // Fields of related architectures that would change the math when a config of these families
  // carried them (NOTE [config fields that change the math]): refused unless neutral.
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping",
                          "query_pre_attn_scalar", "mrope_section"}) {
    if (f.has(key)) f.refuse(key, "not implemented by these families' forward");
  }
  for (const char* key : {"partial_rotary_factor", "logits_scaling", "embedding_multiplier",
                          "residual_multiplier", "attention_multiplier"}) {
    if (f.has(key) && f.number(j, key, 1.0) != 1.0) {
      f.refuse(key, "not implemented by these families' forward (only 1 is)");
    }
  }

  // Family differences (NOTE [config fields that change the math]).
  const bool attention_bias = f.boolean("attention_bias", false);
  if (c.family == Family::kLlama || c.family == Family::kMistral) {
    if (attention_bias) f.refuse("attention_bias", "attention biases are not implemented here");
    if (f.boolean("mlp_bias", false)) f.refuse("mlp_bias", "MLP biases are not implemented");
  }
  if (c.family == Family::kQwen3 && attention_bias) {
    f.refuse("attention_bias", "Qwen3 attention biases are not implemented");
  }
  c.qkv_bias = c.family == Family::kQwen2;
  c.qk_norm = c.family == Family::kQwen3;
  if (c.family == Family::kQwen2 || c.family == Family::kQwen3) {
    if (f.boolean("use_sliding_window", false)) {
      f.refuse("use_sliding_window", "sliding-window attention layers are not implemented");
    }
  } else if (c.family == Family::kMistral) {
    c.sliding_window = f.integer("sliding_window", 0);
    DTENSOR_CHECK(c.sliding_window >= 0, source, ": field 'sliding_window' is negative");
  }
  if (f.has("layer_types")) {
    const json& lt = j.at("layer_types");
    DTENSOR_CHECK(lt.is_array(), source, ": field 'layer_types' must be a list");
    for (const json& t : lt) {
      if (!t.is_string() || t.get<std::string>() != "full_attention") {
        f.refuse("layer_types", "only full_attention layers are implemented, got " + t.dump());
      }
    }
  }
  return c;
}

HfConfig read_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  DTENSOR_CHECK(in.good(), "cannot read ", path,
                ": a Hugging Face model directory holds config.json");
  std::stringstream text;
  text << in.rdbuf();
  return parse_hf_config(text.str(), path);
}

}  // namespace dtensor::serving
