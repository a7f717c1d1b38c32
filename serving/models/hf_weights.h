#pragma once
// The Hugging Face weights of a model directory (model.safetensors, or shards listed by
// model.safetensors.index.json) as distributed tensors on a 1-D tensor-parallel mesh, each rank
// reading only its piece.
//
// NOTE [HF tensor parallelism]
// The layout of NOTE [serving tensor parallelism] (serving/llama.h) under Hugging Face names:
// q_proj, gate_proj, up_proj Shard(0) (column-wise), o_proj, down_proj Shard(1) (row-wise),
// embed_tokens and lm_head Shard(0) (vocabulary rows), norms (and Qwen3's q_norm/k_norm)
// replicated, biases as their weight's rows. Each weight is made as an empty distributed tensor
// of its placement; the engine's shard arithmetic (the spec's local box) says which rows or
// columns this rank holds, and the checkpoint reader preads exactly those bytes into the piece.
// No slicing is written here.
//
// NOTE [GQA heads across ranks]
// k_proj and v_proj (and their biases, and the KV cache) are Shard(0) when num_key_value_heads
// divides by the ranks: each rank then holds the kv heads its q heads use (q heads are
// grouped by kv head in order). Otherwise (fewer kv heads than ranks, or not a multiple) they are
// replicated: every rank computes and caches all kv heads, and its q heads pick theirs. The
// replicated choice costs kv_heads / (kv_heads / ranks) more k/v compute and cache per rank but
// no communication, and is what TP engines do for MQA (vLLM replicates kv heads when ranks
// outnumber them).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "device_mesh/device_mesh.h"
#include "layout/placement.h"
#include "serving/models/hf_config.h"

namespace dtensor::serving {

struct WeightSpec {
  std::vector<int64_t> shape;
  Placement placement;
};

// Whether k/v heads are sharded over `ranks` ranks (NOTE [GQA heads across ranks]).
bool kv_heads_sharded(const HfConfig& config, int64_t ranks);

// Every weight the model reads, by Hugging Face name, with its global shape and placement on a
// `ranks`-rank mesh. lm_head.weight is absent when the embeddings are tied.
std::map<std::string, WeightSpec> hf_weight_specs(const HfConfig& config, int64_t ranks);

// Loads the weights of `dir` (distributed on `mesh`, plain tensors without one) in `dtype`
// (converted after reading when the file holds another), on `device`. Throws naming the tensor
// and the file for a missing tensor, a shape that differs from the config's, or a tensor the
// model does not know (another architecture's weights).
std::map<std::string, at::Tensor> load_hf_weights(const std::string& dir, const HfConfig& config,
                                                  const std::optional<DeviceMesh>& mesh,
                                                  at::ScalarType dtype, c10::Device device);

}  // namespace dtensor::serving
