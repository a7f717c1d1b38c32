#pragma once
// One layer's attention over the paged KV cache (NOTE [paged KV cache] in kv_cache.h) for a
// packed batch: the tokens of every sequence of a step in one [T, ...] tensor, each sequence
// attending causally to its cached positions and its own new ones.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "device_mesh/device_mesh.h"

namespace dtensor::serving {

// What a step's tokens are, the same on every rank (plain tensors on the model's device).
struct PackedBatch {
  std::vector<int64_t> begin;         // each sequence's first token in the packed T
  std::vector<int64_t> count;         // its new tokens
  std::vector<int64_t> start;         // the position of its first new token
  at::Tensor write_rows;              // [T] pool rows of the new tokens' positions
  std::vector<at::Tensor> read_rows;  // per sequence: pool rows of positions 0..start+count-1
  at::Tensor cos, sin;                // [T, head_dim] rotary rows of the tokens' positions
};

// One layer's attention tensors. q [T, heads*hd] is column-sharded (Shard(1)); k, v
// [T, kv_heads*hd] are Shard(1) or replicated, as are their biases and the pools
// [kv_heads, rows, hd] (NOTE [GQA heads across ranks] in hf_weights.h). Undefined tensors: no
// bias, no q/k norm.
struct AttentionInputs {
  at::Tensor q, k, v;
  at::Tensor q_bias, k_bias, v_bias;
  at::Tensor q_norm, k_norm;  // [hd], replicated (Qwen3)
  at::Tensor k_pool, v_pool;
};

struct AttentionShape {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  double eps = 1e-6;  // of the q/k norms
  bool kv_sharded = true;
};

// Adds the biases, normalizes q and k per head, applies rotary, writes k and v into the pools at
// write_rows, and attends: softmax(q k^T / sqrt(hd)) v with a causal mask, in float32 softmax as
// the reference. Returns [T, heads*hd] sharded like q (Shard(1) on `mesh`). Everything runs on
// this rank's heads alone (one local computation, NOTE [local chains] in serving/llama.cc).
at::Tensor paged_attention(const AttentionInputs& in, const PackedBatch& batch,
                           const AttentionShape& shape, const std::optional<DeviceMesh>& mesh);

}  // namespace dtensor::serving
