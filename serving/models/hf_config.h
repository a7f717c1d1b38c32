#pragma once
// A Hugging Face model's config.json as the serving model reads it: the decoder-only families
// LlamaForCausalLM (Llama 2, 3, 3.1/3.2 with rope_scaling "llama3"), MistralForCausalLM,
// Qwen2ForCausalLM (q/k/v biases) and Qwen3ForCausalLM (per-head q/k RMS norms).
//
// NOTE [config fields that change the math]
// Every field of these configs is either read (sizes, eps, rope, tying, dtype, token ids), known
// not to change inference (dropout, initializer_range, use_cache, ...), or checked to hold the
// value this forward implements; anything else is refused at start with an error naming the
// field and its value, so a model never serves with silently different math. Refused: an
// architecture other than the four; hidden_act other than silu; rope types other than
// default/llama3; attention_bias or mlp_bias on Llama and Mistral; attention_bias on Qwen3;
// sliding-window layers (Qwen's use_sliding_window, any layer_types entry other than
// full_attention); fields of related architectures (logit soft-capping, partial rotary, Granite's
// multipliers, mrope) and rope settings this rope does not read. Mistral's sliding_window W is not
// refused: attention over at most W positions is full attention, so the served context is capped at
// W (HfConfig::max_context). transformers 5 writes rope settings as "rope_parameters" (rope_theta
// inside); older files have "rope_theta" and "rope_scaling" at the top: both are read.

#include <cstdint>
#include <string>
#include <vector>

namespace dtensor::serving {

enum class Family { kLlama, kMistral, kQwen2, kQwen3 };

struct HfConfig {
  std::string architecture;  // "LlamaForCausalLM", ...
  Family family = Family::kLlama;
  int64_t vocab = 0;
  int64_t hidden = 0;        // hidden_size
  int64_t intermediate = 0;  // intermediate_size
  int64_t layers = 0;        // num_hidden_layers
  int64_t heads = 0;         // num_attention_heads
  int64_t kv_heads = 0;      // num_key_value_heads (GQA; 1: MQA)
  int64_t head_dim = 0;      // head_dim, else hidden / heads
  double eps = 1e-6;         // rms_norm_eps
  double rope_theta = 10000.0;
  // rope type "llama3" (Llama 3.1/3.2): frequencies rescaled as NOTE [llama3 rope] says.
  bool llama3_rope = false;
  double rope_factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
  int64_t max_positions = 0;   // max_position_embeddings
  int64_t sliding_window = 0;  // 0: none (Mistral's caps the context)
  bool tie_word_embeddings = false;
  bool qkv_bias = false;          // Qwen2
  bool qk_norm = false;           // Qwen3
  std::string dtype = "float32";  // torch_dtype / dtype as written ("bfloat16", ...)
  std::vector<int64_t> bos_token_ids, eos_token_ids;

  // The longest context this config allows: max_position_embeddings, capped at a sliding window.
  int64_t max_context() const;
};

// Parses `dir`/config.json. Throws dtensor::Error naming the file and the field for a missing or
// mistyped required field, an unknown architecture, or a field value that changes the math
// (NOTE [config fields that change the math]).
HfConfig read_hf_config(const std::string& dir);
// The same from the JSON text (`source` names it in errors).
HfConfig parse_hf_config(const std::string& json_text, const std::string& source);

}  // namespace dtensor::serving
