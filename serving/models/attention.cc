#include "serving/models/attention.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "base/error.h"
#include "collectives/rank_context.h"
#include "dtensor/api.h"
#include "serving/models/rope.h"

namespace dtensor::serving {

namespace {

// The reference's RMS norm: in float32, the weight applied after casting back.
at::Tensor rms(const at::Tensor& x, const at::Tensor& w, double eps) {
  const at::Tensor f = x.to(at::kFloat);
  return w * (f * at::rsqrt(f.pow(2).mean({-1}, true) + eps)).to(x.scalar_type());
}

// This rank's q heads' kv head, as an index into its local kv heads: q heads are grouped by kv
// head in order (head g uses kv head g / (heads / kv_heads)).
at::Tensor kv_head_of_q(const AttentionShape& s, int64_t ranks, int64_t coordinate,
                        c10::Device device) {
  const int64_t local_q = s.heads / ranks, group = s.heads / s.kv_heads;
  const int64_t kv_first = s.kv_sharded ? coordinate * (s.kv_heads / ranks) : 0;
  std::vector<int64_t> idx;
  for (int64_t j = 0; j < local_q; ++j)
    idx.push_back((coordinate * local_q + j) / group - kv_first);
  return at::tensor(idx, at::kLong).to(device);
}

}  // namespace

at::Tensor paged_attention(const AttentionInputs& in, const PackedBatch& b, const AttentionShape& s,
                           const std::optional<DeviceMesh>& mesh) {
  const int64_t ranks = mesh ? mesh->size() : 1;
  int64_t coordinate = 0;
  if (mesh) {
    const int64_t rank = collectives::current_context().rank();
    coordinate = mesh->coordinate(rank).value().at(0);
  }
  const at::Tensor kv_of_q = kv_head_of_q(s, ranks, coordinate, b.write_rows.device());
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  const Placement kv_p = s.kv_sharded ? Shard(0) : Replicate();
  const Placement kv_cols = s.kv_sharded ? Shard(1) : Replicate();

  // The distributed inputs, in a fixed order; optional ones only when present.
  std::vector<at::Tensor> inputs = {in.q, in.k, in.v, in.k_pool, in.v_pool};
  std::vector<Placements> places = {{Shard(1)}, {kv_cols}, {kv_cols}, {kv_p}, {kv_p}};
  const bool bias = in.q_bias.defined(), norm = in.q_norm.defined();
  if (bias) {
    inputs.insert(inputs.end(), {in.q_bias, in.k_bias, in.v_bias});
    places.insert(places.end(), {{Shard(0)}, {kv_p}, {kv_p}});
  }
  if (norm) {
    inputs.insert(inputs.end(), {in.q_norm, in.k_norm});
    places.insert(places.end(), {{Replicate()}, {Replicate()}});
  }
  auto fn = [&](const std::vector<at::Tensor>& p) {
    const int64_t T = p[0].size(0), hd = s.head_dim;
    at::Tensor q = p[0], k = p[1], v = p[2];
    const at::Tensor &kp = p[3], &vp = p[4];
    size_t next = 5;
    if (bias) {
      q = q + p[next];
      k = k + p[next + 1];
      v = v + p[next + 2];
      next += 3;
    }
    q = q.view({T, -1, hd});
    k = k.view({T, -1, hd});
    v = v.view({T, -1, hd});
    if (norm) {
      q = rms(q, p[next], s.eps);
      k = rms(k, p[next + 1], s.eps);
    }
    q = apply_rope(q, b.cos, b.sin);
    k = apply_rope(k, b.cos, b.sin);
    kp.index_copy_(1, b.write_rows, k.transpose(0, 1));  // [kv, T, hd]
    vp.index_copy_(1, b.write_rows, v.transpose(0, 1));
    std::vector<at::Tensor> outs;
    for (size_t i = 0; i < b.begin.size(); ++i) {
      const int64_t n = b.count[i], L = b.start[i] + n;
      const at::Tensor qi = q.narrow(0, b.begin[i], n).transpose(0, 1);  // [h, n, hd]
      const at::Tensor keys = kp.index_select(1, b.read_rows[i]).index_select(0, kv_of_q);
      const at::Tensor vals = vp.index_select(1, b.read_rows[i]).index_select(0, kv_of_q);
      at::Tensor scores = at::matmul(qi, keys.transpose(-2, -1)) * scale;  // [h, n, L]
      // New token r (position start + r) sees positions 0..start + r.
      const at::Tensor mask = at::arange(L, b.write_rows.options()).view({1, L}) >
                              at::arange(b.start[i], L, b.write_rows.options()).view({n, 1});
      scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
      const at::Tensor attn = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
      outs.push_back(at::matmul(attn, vals).transpose(0, 1).reshape({n, -1}));  // [n, h*hd]
    }
    return std::vector<at::Tensor>{at::cat(outs, 0)};
  };
  if (!mesh) return fn(inputs).at(0);
  return api::local_map(fn, inputs, {{Shard(1)}}, places, /*redistribute_inputs=*/true).at(0);
}

}  // namespace dtensor::serving
