#pragma once
// A small tensor-parallel model written once for plain and distributed tensors alike: a 2-layer
// MLP and a one-block transformer (RMS norm, causal attention, MLP, residuals), plus the
// tensor-parallel layouts of their parameters (ColwiseParallel / RowwiseParallel's). Used by the
// model tests, the dispatch benchmark and the training demo.

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "dtensor/api.h"

namespace dtensor::examples {

using Params = std::map<std::string, at::Tensor>;

// Deterministic values in [-0.5, 0.5] (no generator involved).
inline at::Tensor values(const std::vector<int64_t>& shape, int64_t salt,
                         at::ScalarType dtype = at::kDouble) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return (at::sin(at::arange(numel, at::kDouble) * 1.37 + salt * 0.71) * 0.5)
      .reshape(shape)
      .to(dtype);
}

inline at::Tensor mlp(const at::Tensor& x, const Params& p) {
  const at::Tensor h = at::relu(at::linear(x, p.at("w1"), p.at("b1")));
  return at::linear(h, p.at("w2"), p.at("b2"));
}

inline at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& g) {
  return x * at::rsqrt(x.pow(2).mean({-1}, true) + 1e-6) * g;
}

// x: [B, S, D]; `mask` [S, S] is true where attention is not allowed. Heads are split from the
// (column-sharded) q/k/v projections' outputs, so each tensor-parallel rank holds whole heads.
// Heads go first ([H, B, S, hd]): matmul folds its batch dims into one, and a fold whose leading
// dim is the sharded one stays sharded, while folding (B, H) with H sharded is no Shard
// placement and would gather.
inline at::Tensor transformer_block(const at::Tensor& x, const Params& p, const at::Tensor& mask,
                                    int64_t heads) {
  const int64_t B = x.size(0), S = x.size(1), D = x.size(2), hd = D / heads;
  const at::Tensor n1 = rms_norm(x, p.at("g1"));
  auto split = [&](const at::Tensor& t) { return t.view({B, S, heads, hd}).permute({2, 0, 1, 3}); };
  const at::Tensor q = split(at::linear(n1, p.at("wq")));
  const at::Tensor k = split(at::linear(n1, p.at("wk")));
  const at::Tensor v = split(at::linear(n1, p.at("wv")));
  const at::Tensor scores =
      at::matmul(q, k.transpose(-2, -1)).div(std::sqrt(static_cast<double>(hd)));
  const at::Tensor attn = at::softmax(scores.masked_fill(mask, -1e9), -1);
  const at::Tensor ctx = at::matmul(attn, v).permute({1, 2, 0, 3}).reshape({B, S, D});
  const at::Tensor h = x + at::linear(ctx, p.at("wo"));
  const at::Tensor n2 = rms_norm(h, p.at("g2"));
  return h + at::linear(at::silu(at::linear(n2, p.at("w1"))), p.at("w2"));
}

inline Params mlp_params(int64_t D, int64_t H, at::ScalarType dtype = at::kDouble) {
  return {{"w1", values({H, D}, 1, dtype)},
          {"b1", values({H}, 2, dtype)},
          {"w2", values({D, H}, 3, dtype)},
          {"b2", values({D}, 4, dtype)}};
}

inline Params block_params(int64_t D, int64_t H, at::ScalarType dtype = at::kDouble) {
  return {{"g1", values({D}, 1, dtype) + 1}, {"wq", values({D, D}, 2, dtype)},
          {"wk", values({D, D}, 3, dtype)},  {"wv", values({D, D}, 4, dtype)},
          {"wo", values({D, D}, 5, dtype)},  {"g2", values({D}, 6, dtype) + 1},
          {"w1", values({H, D}, 7, dtype)},  {"w2", values({D, H}, 8, dtype)}};
}

// Tensor-parallel placements on the last mesh dim: colwise weights (and their biases) Shard(0),
// rowwise weights Shard(1), everything else replicated. The other mesh dims replicate.
inline std::map<std::string, Placements> tp_layout(int64_t mesh_ndim,
                                                   const std::vector<std::string>& colwise,
                                                   const std::vector<std::string>& rowwise) {
  std::map<std::string, Placements> out;
  auto on_tp = [&](Placement p) {
    Placements pl(mesh_ndim, Replicate());
    pl.back() = p;
    return pl;
  };
  for (const auto& n : colwise) out[n] = on_tp(Shard(0));
  for (const auto& n : rowwise) out[n] = on_tp(Shard(1));
  return out;
}

inline std::map<std::string, Placements> mlp_layout(int64_t mesh_ndim) {
  return tp_layout(mesh_ndim, {"w1", "b1"}, {"w2"});
}

inline std::map<std::string, Placements> block_layout(int64_t mesh_ndim) {
  return tp_layout(mesh_ndim, {"wq", "wk", "wv", "w1"}, {"wo", "w2"});
}

// Distributes `global` (every rank passes the same values) by `layout` (absent: replicated);
// leaves require grad when `requires_grad`.
inline Params distribute_params(const Params& global, const DeviceMesh& mesh,
                                const std::map<std::string, Placements>& layout,
                                bool requires_grad) {
  Params out;
  for (const auto& [name, t] : global) {
    const auto it = layout.find(name);
    const Placements pl = it == layout.end() ? Placements(mesh.ndim(), Replicate()) : it->second;
    out[name] = api::distribute_tensor(t.clone().requires_grad_(requires_grad), mesh, pl);
  }
  return out;
}

}  // namespace dtensor::examples
