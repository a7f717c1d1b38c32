#include "serving/models/hf_weights.h"

#include <ATen/ATen.h>

#include "base/error.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/safetensors.h"
#include "dtensor/api.h"

namespace dtensor::serving {

bool kv_heads_sharded(const HfConfig& c, int64_t ranks) { return c.kv_heads % ranks == 0; }

std::map<std::string, WeightSpec> hf_weight_specs(const HfConfig& c, int64_t ranks) {
  const int64_t D = c.hidden, q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim;
  const Placement col = Shard(0), row = Shard(1), rep = Replicate();
  const Placement kv_p = kv_heads_sharded(c, ranks) ? col : rep;
  std::map<std::string, WeightSpec> out;
  out["model.embed_tokens.weight"] = {{c.vocab, D}, col};
  out["model.norm.weight"] = {{D}, rep};
  if (!c.tie_word_embeddings) out["lm_head.weight"] = {{c.vocab, D}, col};
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out[p + "input_layernorm.weight"] = {{D}, rep};
    out[p + "post_attention_layernorm.weight"] = {{D}, rep};
    out[p + "self_attn.q_proj.weight"] = {{q, D}, col};
    out[p + "self_attn.k_proj.weight"] = {{kv, D}, kv_p};
    out[p + "self_attn.v_proj.weight"] = {{kv, D}, kv_p};
    out[p + "self_attn.o_proj.weight"] = {{D, q}, row};
    if (c.qkv_bias) {
      out[p + "self_attn.q_proj.bias"] = {{q}, col};
      out[p + "self_attn.k_proj.bias"] = {{kv}, kv_p};
      out[p + "self_attn.v_proj.bias"] = {{kv}, kv_p};
    }
    if (c.qk_norm) {
      out[p + "self_attn.q_norm.weight"] = {{c.head_dim}, rep};
      out[p + "self_attn.k_norm.weight"] = {{c.head_dim}, rep};
    }
    out[p + "mlp.gate_proj.weight"] = {{c.intermediate, D}, col};
    out[p + "mlp.up_proj.weight"] = {{c.intermediate, D}, col};
    out[p + "mlp.down_proj.weight"] = {{D, c.intermediate}, row};
  }
  return out;
}

namespace {

// Keys a file may hold that carry no weight of the forward: rotary tables some exporters save,
// and lm_head.weight beside tied embeddings (equal to them).
bool ignorable(const std::string& key, const HfConfig& c) {
  if (key.find("rotary_emb.inv_freq") != std::string::npos) return true;
  return c.tie_word_embeddings && key == "lm_head.weight";
}

}  // namespace

std::map<std::string, at::Tensor> load_hf_weights(const std::string& dir, const HfConfig& c,
                                                  const std::optional<DeviceMesh>& mesh,
                                                  at::ScalarType dtype, c10::Device device) {
  checkpoint::Index index = checkpoint::read_index(dir);
  checkpoint::check_files(index);
  const auto specs = hf_weight_specs(c, mesh ? mesh->size() : 1);
  for (const auto& [key, rec] : index.tensors) {
    DTENSOR_CHECK(specs.count(key) || ignorable(key, c), index.source, ": tensor '", key,
                  "' is not a weight of ", c.architecture, " as configured (",
                  c.tie_word_embeddings ? "tied" : "untied",
                  " embeddings); is config.json this model's?");
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, spec] : specs) {
    const auto it = index.tensors.find(key);
    DTENSOR_CHECK(it != index.tensors.end(), index.source, ": weight '", key, "' is missing",
                  key == "lm_head.weight" ? " (config.json says tie_word_embeddings false)" : "");
    DTENSOR_CHECK(it->second.shape == spec.shape, index.source, ": weight '", key, "' has shape ",
                  checkpoint::shape_text(it->second.shape), ", config.json gives ",
                  checkpoint::shape_text(spec.shape));
    const at::ScalarType stored = checkpoint::scalar_type_of(it->second.dtype, index.source);
    DTENSOR_CHECK(at::isFloatingType(stored), index.source, ": weight '", key, "' is ",
                  it->second.dtype, ", not a floating type");
    const auto opts = at::TensorOptions().dtype(stored).device(device);
    at::Tensor t =
        mesh ? api::empty(spec.shape, *mesh, {spec.placement}, opts) : at::empty(spec.shape, opts);
    checkpoint::load_tensor(t, key, index);  // this rank's box only
    if (stored != dtype) t = t.to(dtype);
    out.emplace(key, std::move(t));
  }
  return out;
}

}  // namespace dtensor::serving
