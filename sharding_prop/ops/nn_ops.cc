// Layers and their backward ops: embedding, layer/batch/group norm, nll and elementwise losses,
// scaled dot product attention and dropout (families "embedding", "norm", "loss", "attention";
// dropout is "pointwise").

#include <c10/core/DeviceType.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "sharding_prop/ops/family.h"

namespace dtensor::sharding::ops {
namespace {

// embedding(weight [V, D], indices): a row-sharded weight gives a Partial(sum) output, computed
// by a masked lookup (rows this rank does not hold contribute zeros: REFERENCE.md §1).
BuiltRule embedding_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 2, 2, "embedding");
  if (m[0].shape.size() != 2) throw Error("embedding: weight must be 2-D");
  Rule r;
  const int v = r.add_factor(m[0].shape[0], FactorKind::kContract);
  const int dd = r.add_factor(m[0].shape[1]);
  TensorFactors idx, out;
  for (int64_t s : m[1].shape) {
    const DimFactors f = r.add_dim(s);
    idx.push_back(f);
    out.push_back(f);
  }
  out.push_back({dd});
  r.inputs = {{{v}, {dd}}, idx};
  r.outputs = {out};
  return {std::move(r), {m[0].dtype}};
}

// embedding_dense_backward(grad [..., D], indices [...]): ints: num_weights. Sharding the
// lookups sums partial weight gradients.
BuiltRule embedding_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 2, "embedding_dense_backward");
  Rule r;
  const auto& g = m[0].shape;
  if (g.empty() || std::vector<int64_t>(g.begin(), g.end() - 1) != m[1].shape) {
    throw Error("embedding_dense_backward: grad must be indices' shape + [D]");
  }
  TensorFactors tg, ti;
  for (size_t k = 0; k + 1 < g.size(); ++k) {
    const DimFactors f = r.add_dim(g[k], FactorKind::kContract);
    tg.push_back(f);
    ti.push_back(f);
  }
  const int dd = r.add_factor(g.back());
  tg.push_back({dd});
  const int v =
      r.add_factor(arg(a, 0, "embedding_dense_backward", "num_weights"), FactorKind::kReplicate);
  r.inputs = {tg, ti};
  r.outputs = {{{v}, {dd}}};
  return {std::move(r), {m[0].dtype}};
}

// native_layer_norm(input, weight?, bias?): ints: the number of normalised (trailing) dims.
// Outputs: out, mean, rstd (mean/rstd keep the leading dims, size 1 in the normalised ones).
BuiltRule layer_norm_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 3, "native_layer_norm");
  const auto& s = m[0].shape;
  const int64_t k = arg(a, 0, "native_layer_norm", "normalized dims");
  if (k < 1 || k > static_cast<int64_t>(s.size()))
    throw Error("native_layer_norm: bad normalized_shape");
  Rule r;
  TensorFactors in, stat;
  const size_t lead = s.size() - k;
  for (size_t d = 0; d < s.size(); ++d) {
    const bool norm = d >= lead;
    const DimFactors f = r.add_dim(s[d], norm ? FactorKind::kReplicate : FactorKind::kPass);
    in.push_back(f);
    stat.push_back(norm ? DimFactors{} : f);
  }
  r.inputs.push_back(in);
  for (size_t i = 1; i < m.size(); ++i)
    r.inputs.push_back(TensorFactors(in.begin() + lead, in.end()));
  r.outputs = {in, stat, stat};
  return {std::move(r), {m[0].dtype, m[0].dtype, m[0].dtype}};
}

// native_layer_norm_backward(grad_out, input, mean, rstd, weight?, bias?): ints: the number of
// normalised dims. Outputs grad_input, grad_weight, grad_bias: the last two sum over the leading
// dims, so sharding those leaves them Partial(sum).
BuiltRule layer_norm_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 4, 6, "native_layer_norm_backward");
  Metas fwd = {m[1]};
  for (size_t i = 4; i < m.size(); ++i) fwd.push_back(m[i]);
  BuiltRule f = layer_norm_of(fwd, a);
  const TensorFactors in = f.rule.inputs[0], stat = f.rule.outputs[1];
  const size_t lead = in.size() - a.ints[0];
  Rule r = f.rule;
  r.inputs = {in, in, stat, stat};
  for (size_t i = 4; i < m.size(); ++i)
    r.inputs.push_back(TensorFactors(in.begin() + lead, in.end()));
  const TensorFactors wshape(in.begin() + lead, in.end());
  r.outputs = {in, wshape, wshape};
  std::vector<int> sums;
  for (size_t d = 0; d < lead; ++d) sums.insert(sums.end(), in[d].begin(), in[d].end());
  r.output_sums = {{}, sums, sums};
  return {std::move(r), {m[0].dtype, m[0].dtype, m[0].dtype}};
}

void check_nll_shapes(const std::vector<int64_t>& self, const std::vector<int64_t>& target,
                      const std::vector<int64_t>* weight, const char* op) {
  // self [C], [N, C] or [N, C, d...] (nll_loss2d: [N, C, H, W]); target self without C.
  std::vector<int64_t> want = self;
  if (!want.empty()) want.erase(want.begin() + (self.size() == 1 ? 0 : 1));
  const int64_t classes = self.empty() ? 0 : self[self.size() == 1 ? 0 : 1];
  if (self.empty() || target != want ||
      (weight != nullptr && *weight != std::vector<int64_t>{classes})) {
    throw Error(std::string(op) + ": expects self [C], [N, C] or [N, C, d...], target self's " +
                "shape without C, and weight [C]");
  }
}

// The factors of nll's self: the class dim (whole) and the others (batch and spatial), each
// `kind`; `batch` receives the latter, in order.
TensorFactors nll_self(Rule& r, const std::vector<int64_t>& s, FactorKind kind, int* c,
                       TensorFactors* batch) {
  TensorFactors self;
  const size_t class_dim = s.size() == 1 ? 0 : 1;
  for (size_t k = 0; k < s.size(); ++k) {
    if (k == class_dim) {
      *c = r.add_factor(s[k], FactorKind::kReplicate);
      self.push_back({*c});
    } else {
      self.push_back(r.add_dim(s[k], kind));
      batch->push_back(self.back());
    }
  }
  return self;
}

// nll_loss_forward / nll_loss2d_forward(self [C], [N, C] or [N, C, H, W], target, weight?):
// ints: reduction (0 none, 1 mean, 2 sum). Outputs output, total_weight. The class dim stays
// whole; the other dims shard with the targets: summed for reduction sum, kept for none, whole
// for mean (a mean over shards of unequal ignored counts is not the mean).
BuiltRule nll_loss_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 3, "nll_loss_forward");
  const int64_t reduction = arg(a, 0, "nll_loss_forward", "reduction");
  Rule r;
  check_nll_shapes(m[0].shape, m[1].shape, m.size() == 3 ? &m[2].shape : nullptr,
                   "nll_loss_forward");
  const FactorKind kind = reduction == 0   ? FactorKind::kPass
                          : reduction == 2 ? FactorKind::kContract
                                           : FactorKind::kReplicate;
  int c = -1;
  TensorFactors target;
  const TensorFactors self = nll_self(r, m[0].shape, kind, &c, &target);
  const TensorFactors out = reduction == 0 ? target : TensorFactors{};
  if (reduction == 0) {
    std::vector<int> sums;
    for (const DimFactors& f : target) sums.insert(sums.end(), f.begin(), f.end());
    r.output_sums = {{}, sums};
  }
  r.inputs = {self, target};
  if (m.size() == 3) r.inputs.push_back({{c}});
  r.outputs = {out, {}};
  return {std::move(r), {m[0].dtype, m[0].dtype}};
}

// nll_loss_backward / nll_loss2d_backward(grad_output, self, target, weight?, total_weight):
// ints: reduction.
BuiltRule nll_loss_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 4, 5, "nll_loss_backward");
  const int64_t reduction = arg(a, 0, "nll_loss_backward", "reduction");
  Rule r;
  check_nll_shapes(m[1].shape, m[2].shape, m.size() == 5 ? &m[3].shape : nullptr,
                   "nll_loss_backward");
  int c = -1;
  TensorFactors target;
  const TensorFactors self = nll_self(r, m[1].shape, FactorKind::kPass, &c, &target);
  r.inputs = {reduction == 0 ? target : TensorFactors{}, self, target};
  if (m.size() == 5) r.inputs.push_back({{c}});
  r.inputs.push_back({});  // total_weight: a scalar
  r.outputs = {self};
  return {std::move(r), {m[1].dtype}};
}

// ATen's fused CPU attention (SDPA's flash path on the CPU) and its backward:
//   forward   q [b, hq, s, d], k [b, hk, t, d], v [b, hk, t, e][, mask] -> out [b, hq, s, e],
//             logsumexp [b, hq, s] (float32)
//   backward  grad_out, q, k, v, out, logsumexp[, mask] -> dq, dk, dv
// The batch shards; the heads shard when q and k/v have as many (with fewer k/v heads, GQA, a
// piece of q's heads needs other k/v heads than the same piece of k/v's: whole). The query rows s
// shard only without a mask and not causal: the kernel's causal mask counts rows from the
// piece's first, and a mask spans (s, t). Without a mask each query row's attention reads its
// own row only, so a rank with some rows computes exactly their output and log-sum-exp, and in
// backward their dq and their share of dk/dv: those sum over s. t, d and e stay whole.
// With a mask every factor stays whole (the mask's dims would need the same pieces).
struct FlashFactors {
  TensorFactors q, k, v, out, lse, mask;
  int s = -1;
};

FlashFactors flash_factors(Rule& r, const Metas& m, size_t at, bool causal, bool masked,
                           const char* op) {
  const auto &q = m[at].shape, &k = m[at + 1].shape, &v = m[at + 2].shape;
  if (q.size() != 4 || k.size() != 4 || v.size() != 4 || q[0] != k[0] || k[0] != v[0] ||
      k[1] != v[1] || k[2] != v[2] || q[3] != k[3]) {
    throw Error(std::string(op) + ": q, k, v must be [b, h, s, d], [b, h, t, d], [b, h, t, e]");
  }
  const FactorKind whole = FactorKind::kReplicate;
  FlashFactors f;
  const DimFactors b = r.add_dim(q[0], masked ? whole : FactorKind::kPass);
  const bool shared_heads = q[1] == k[1] && !masked;
  const DimFactors hq = r.add_dim(q[1], shared_heads ? FactorKind::kPass : whole);
  const DimFactors hk = shared_heads ? hq : r.add_dim(k[1], whole);
  f.s = r.add_factor(q[2], causal || masked ? whole : FactorKind::kPass);
  const DimFactors t = r.add_dim(k[2], whole), d = r.add_dim(q[3], whole),
                   e = r.add_dim(v[3], whole);
  // ATen's CPU flash kernel divides by a piece's sizes (SIGFPE on an empty piece): the shardable
  // factors split only evenly, so no rank's piece is empty (a size-1 batch over 4 ranks moves).
  for (const int x : {b[0], hq[0], f.s}) r.factors[x].even_only = true;
  f.q = {b, hq, {f.s}, d};
  f.k = {b, hk, t, d};
  f.v = {b, hk, t, e};
  f.out = {b, hq, {f.s}, e};
  f.lse = {b, hq, {f.s}};
  if (masked) {
    for (const int64_t size : m[m.size() - 1].shape) f.mask.push_back(r.add_dim(size, whole));
  }
  return f;
}

// ints: is_causal, whether attn_mask is given.
BuiltRule flash_cpu_of(const Metas& m, const LayoutArgs& a) {
  const char* op = "_scaled_dot_product_flash_attention_for_cpu";
  const bool causal = arg(a, 0, op, "is_causal") != 0, masked = arg(a, 1, op, "attn_mask") != 0;
  need_inputs(m, masked ? 4 : 3, masked ? 4 : 3, op);
  Rule r;
  FlashFactors f = flash_factors(r, m, 0, causal, masked, op);
  r.inputs = {f.q, f.k, f.v};
  if (masked) r.inputs.push_back(f.mask);
  r.outputs = {f.out, f.lse};
  return {std::move(r), {m[0].dtype, c10::kFloat}};
}

BuiltRule flash_cpu_backward_of(const Metas& m, const LayoutArgs& a) {
  const char* op = "_scaled_dot_product_flash_attention_for_cpu_backward";
  const bool causal = arg(a, 0, op, "is_causal") != 0, masked = arg(a, 1, op, "attn_mask") != 0;
  need_inputs(m, masked ? 7 : 6, masked ? 7 : 6, op);
  Rule r;
  FlashFactors f = flash_factors(r, m, 1, causal, masked, op);
  r.inputs = {f.out, f.q, f.k, f.v, f.out, f.lse};
  if (masked) r.inputs.push_back(f.mask);
  r.outputs = {f.q, f.k, f.v};
  r.output_sums = {{}, {f.s}, {f.s}};  // dk and dv sum over the query rows; dq keeps them
  return {std::move(r), {m[1].dtype, m[2].dtype, m[3].dtype}};
}

// _scaled_dot_product_attention(q [.., s, d], k [.., t, d], v [.., t, e]) -> (out [.., s, e],
// attn [.., s, t]): batch and head dims and the query rows shard; t (softmax) and d stay whole.
BuiltRule sdpa_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 3, 3, "_scaled_dot_product_attention");
  const auto &q = m[0].shape, &k = m[1].shape, &v = m[2].shape;
  if (q.size() < 2 || k.size() != q.size() || v.size() != q.size()) {
    throw Error("_scaled_dot_product_attention: q, k, v need equal ranks >= 2");
  }
  Rule r;
  TensorFactors tq, tk, tv;
  for (size_t d = 0; d + 2 < q.size(); ++d) {
    if (q[d] != k[d] || q[d] != v[d])
      throw Error("_scaled_dot_product_attention: batch dims differ");
    const DimFactors f = r.add_dim(q[d]);
    tq.push_back(f);
    tk.push_back(f);
    tv.push_back(f);
  }
  TensorFactors out = tq, attn = tq;
  const int s = r.add_factor(q[q.size() - 2]);
  const int t = r.add_factor(k[k.size() - 2], FactorKind::kReplicate);
  const int d = r.add_factor(q.back(), FactorKind::kReplicate);
  const int e = r.add_factor(v.back());
  tq.insert(tq.end(), {{s}, {d}});
  tk.insert(tk.end(), {{t}, {d}});
  tv.insert(tv.end(), {{t}, {e}});
  out.insert(out.end(), {{s}, {e}});
  attn.insert(attn.end(), {{s}, {t}});
  r.inputs = {tq, tk, tv};
  r.outputs = {out, attn};
  return {std::move(r), {m[0].dtype, m[0].dtype}};
}

// native_dropout(input) -> (out, mask): elementwise.
BuiltRule dropout_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 1, 1, "native_dropout");
  Rule r = pointwise_rule(shapes_of(m), Linearity::kNone);
  r.outputs.push_back(r.outputs[0]);
  return {std::move(r), {m[0].dtype, c10::kBool}};
}

// Elementwise losses (mse, smooth_l1, huber, soft_margin, binary_cross_entropy[_with_logits])
// over up to `n` broadcasting tensors: ints: reduction (0 none, 1 mean, 2 sum). None is
// elementwise. Sum and mean reduce every dim: a sharded dim leaves the loss Partial(sum), or
// Partial(avg) when the split is even (a mean of unequal pieces' means is not the mean). A
// backward (grad_output first, 0-dim unless none) is elementwise for none and sum; for mean it
// scales by the element count, which a piece does not know, so its inputs stay whole.
RuleBuilder elementwise_loss(size_t n, bool backward) {
  return [=](const Metas& m, const LayoutArgs& a) {
    need_inputs(m, backward ? 2 : 1, n, "loss");
    const int64_t reduction = arg(a, 0, "loss", "reduction");
    if (reduction < 0 || reduction > 2) throw Error("loss: reduction must be 0, 1 or 2");
    Rule r = pointwise_rule(shapes_of(m), Linearity::kNone);
    if (backward && reduction == 1) {
      for (Factor& f : r.factors) f.kind = FactorKind::kReplicate;
    } else if (!backward && reduction != 0) {
      for (Factor& f : r.factors) {
        f.kind = FactorKind::kContract;
        f.reduce = reduction == 1 ? ReduceOp::kAvg : ReduceOp::kSum;
      }
      r.outputs = {TensorFactors{}};
    }
    return BuiltRule{std::move(r), {promoted(m)}};
  };
}

// Group norm's factors: the batch dim passes; channels, spatial dims and groups stay whole.
struct GroupNormFactors {
  Rule r;
  TensorFactors input, channels, stats;  // [N, C, *], [C], [N, group]
  DimFactors batch;
};

GroupNormFactors group_norm_factors(const TensorMeta& input, int64_t group) {
  if (input.ndim() < 2) throw Error("native_group_norm: input must be [N, C, *]");
  GroupNormFactors g;
  g.batch = g.r.add_dim(input.shape[0], FactorKind::kPass);
  g.input.push_back(g.batch);
  const DimFactors c = g.r.add_dim(input.shape[1], FactorKind::kReplicate);
  g.input.push_back(c);
  for (int64_t d = 2; d < input.ndim(); ++d)
    g.input.push_back(g.r.add_dim(input.shape[d], FactorKind::kReplicate));
  g.channels = {c};
  g.stats = {g.batch, g.r.add_dim(group, FactorKind::kReplicate)};
  return g;
}

// native_group_norm(input, weight, bias, N, C, HxW, group, eps) -> (out, mean, rstd): ints:
// group. Statistics are per (sample, group): the batch dim passes (N is made local: the first
// output's first size), the rest stays whole.
BuiltRule group_norm_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 3, "native_group_norm");
  GroupNormFactors g = group_norm_factors(m[0], arg(a, 0, "native_group_norm", "group"));
  Rule r = std::move(g.r);
  r.inputs = {g.input};
  for (size_t i = 1; i < m.size(); ++i) r.inputs.push_back(g.channels);
  r.outputs = {g.input, g.stats, g.stats};
  return {std::move(r), {m[0].dtype, m[0].dtype, m[0].dtype}};
}

// native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, mask) ->
// (grad_input, grad_weight, grad_bias): ints: group. The weight gradients sum over the batch:
// a sharded batch leaves them Partial(sum).
BuiltRule group_norm_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 4, 5, "native_group_norm_backward");
  GroupNormFactors g = group_norm_factors(m[1], arg(a, 0, "native_group_norm_backward", "group"));
  Rule r = std::move(g.r);
  r.inputs = {g.input, g.input, g.stats, g.stats};
  if (m.size() == 5) r.inputs.push_back(g.channels);
  r.outputs = {g.input, g.channels, g.channels};
  r.output_sums = {{}, g.batch, g.batch};
  return {std::move(r), {m[1].dtype, m[1].dtype, m[1].dtype}};
}

// native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, ...): ints:
// training, then whether weight, bias, running_mean, running_var are given, then the input's
// device type. The channel dim (1) passes with the per-channel tensors; the running statistics
// keep their placements (written in training). In training the statistics span the other dims,
// which stay whole; in eval every dim passes. Outputs: the result, and save_mean/save_invstd:
// [C] in training; in eval empty on the CPU, but [C] (unwritten) from CUDA's kernel.
BuiltRule batch_norm_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 5, "native_batch_norm");
  if (m[0].ndim() < 2 || a.ints.size() != 6) {
    throw Error("native_batch_norm: expects an input of at least 2 dims");
  }
  const bool training = a.ints[0] != 0;
  Rule r;
  TensorFactors in;
  DimFactors c;
  for (int64_t k = 0; k < m[0].ndim(); ++k) {
    in.push_back(
        r.add_dim(m[0].shape[k], training && k != 1 ? FactorKind::kReplicate : FactorKind::kPass));
    if (k == 1) c = in.back();
  }
  mark_even(r, in);
  r.inputs = {in};
  r.written_inputs = {false};
  for (size_t i = 1; i < m.size(); ++i) {
    if (m[i].shape != std::vector<int64_t>{m[0].shape[1]}) {
      throw Error("native_batch_norm: weight, bias and running statistics must have C elements");
    }
    r.inputs.push_back({c});
  }
  // Which given tensor is a running statistic: those after the given weight and bias.
  const size_t stats_from = 1 + static_cast<size_t>(a.ints[1] + a.ints[2]);
  // Kept in eval too (the kernel reads them only): the schema cannot say when it writes.
  for (size_t i = 1; i < m.size(); ++i) r.written_inputs.push_back(i >= stats_from);
  const bool stats_of_c = training || a.ints[5] == static_cast<int64_t>(c10::DeviceType::CUDA);
  const TensorFactors saved =
      stats_of_c ? TensorFactors{c} : TensorFactors{r.add_dim(0, FactorKind::kReplicate)};
  r.outputs = {in, saved, saved};
  r.metadata_from_rule = !training;
  const c10::ScalarType stat =
      m[0].dtype == c10::kHalf || m[0].dtype == c10::kBFloat16 ? c10::kFloat : m[0].dtype;
  return {std::move(r), {m[0].dtype, stat, stat}};
}

// native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?, save_mean?,
// save_invstd?, train, eps, output_mask): ints: train. The channel dim passes with the
// per-channel tensors (an empty saved statistic of eval stays whole). In training the other dims
// stay whole; in eval they pass, and grad_weight and grad_bias sum over them (Partial(sum)).
BuiltRule batch_norm_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 7, "native_batch_norm_backward");
  if (m[1].ndim() < 2 || m[0].shape != m[1].shape) {
    throw Error("native_batch_norm_backward: grad_out and input need one shape of >= 2 dims");
  }
  const bool training = arg(a, 0, "native_batch_norm_backward", "train") != 0;
  Rule r;
  TensorFactors in;
  DimFactors c;
  std::vector<int> sums;
  for (int64_t k = 0; k < m[1].ndim(); ++k) {
    in.push_back(
        r.add_dim(m[1].shape[k], training && k != 1 ? FactorKind::kReplicate : FactorKind::kPass));
    if (k == 1) c = in.back();
    if (k != 1 && !in.back().empty()) sums.push_back(in.back()[0]);
  }
  mark_even(r, in);
  r.inputs = {in, in};
  for (size_t i = 2; i < m.size(); ++i) {
    r.inputs.push_back(m[i].shape == std::vector<int64_t>{m[1].shape[1]}
                           ? TensorFactors{c}
                           : dims_of(r, m[i].shape, FactorKind::kReplicate));
  }
  r.outputs = {in, {c}, {c}};
  if (!training) r.output_sums = {{}, sums, sums};
  return {std::move(r), {m[1].dtype, m[1].dtype, m[1].dtype}};
}

void add_nn(Adder& add) {
  add("aten::embedding", "embedding", {}, embedding_of, same_shape, Execution::kMaskedEmbedding);
  add("aten::embedding_dense_backward", "embedding", {int_arg("num_weights")},
      embedding_backward_of, local_shape("num_weights", LocalShapeArg::Kind::kFirstSize));
  add("aten::native_layer_norm", "norm", {count_arg("normalized_shape")}, layer_norm_of);
  add("aten::native_layer_norm_backward", "norm", {count_arg("normalized_shape")},
      layer_norm_backward_of);
  add("aten::nll_loss_forward", "loss", {int_arg("reduction")}, nll_loss_of);
  add("aten::nll_loss_backward", "loss", {int_arg("reduction")}, nll_loss_backward_of);
  add("aten::nll_loss2d_forward", "loss", {int_arg("reduction")}, nll_loss_of);
  add("aten::nll_loss2d_backward", "loss", {int_arg("reduction")}, nll_loss_backward_of);
  add("aten::_scaled_dot_product_attention", "attention", {}, sdpa_of);
  add("aten::_scaled_dot_product_attention_math", "attention", {}, sdpa_of);
  add("aten::_scaled_dot_product_flash_attention_for_cpu", "attention",
      {int_arg("is_causal"), present_arg("attn_mask")}, flash_cpu_of, same_shape,
      Execution::kRingAttention);
  add("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention",
      {int_arg("is_causal"), present_arg("attn_mask")}, flash_cpu_backward_of, same_shape,
      Execution::kRingAttentionBackward);
}

// Elementwise losses and their backward ops (reduction decides: elementwise_loss).
void add_losses(Adder& add) {
  const std::vector<LayoutArg> reduction = {int_arg("reduction")};
  for (const char* op : {"mse_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss"}) {
    add(std::string("aten::") + op, "loss", reduction, elementwise_loss(2, false));
  }
  add("aten::binary_cross_entropy", "loss", reduction, elementwise_loss(3, false));
  add("aten::binary_cross_entropy_with_logits", "loss", reduction, elementwise_loss(4, false));
  // huber_loss_backward is left to the fallback: torch 1.13's Python meta registration of it
  // raises TypeError (a meta run of it fails in Python processes).
  for (const char* op :
       {"mse_loss_backward", "soft_margin_loss_backward", "smooth_l1_loss_backward"}) {
    add(std::string("aten::") + op, "loss", reduction, elementwise_loss(3, true));
  }
  add("aten::binary_cross_entropy_backward", "loss", reduction, elementwise_loss(4, true));
}

void add_batch_norm(Adder& add) {
  add("aten::native_batch_norm", "norm",
      {int_arg("training"), present_arg("weight"), present_arg("bias"), present_arg("running_mean"),
       present_arg("running_var"), device_arg("input")},
      batch_norm_of);
  add("aten::native_batch_norm_backward", "norm", {int_arg("train")}, batch_norm_backward_of);
}

void add_group_norm(Adder& add) {
  add("aten::native_group_norm", "norm", {int_arg("group")}, group_norm_of,
      local_shape("N", LocalShapeArg::Kind::kFirstSize));
  add("aten::native_group_norm_backward", "norm", {int_arg("group")}, group_norm_backward_of,
      local_shape("N", LocalShapeArg::Kind::kFirstSize));
}

void add_dropout(Adder& add) {
  add("aten::native_dropout", "pointwise", {}, dropout_of, same_shape, Execution::kDropout);
  add("aten::native_dropout_backward", "pointwise", {}, pointwise(2, lin));
}

}  // namespace

void add_nn_ops(Adder& add) {
  add_nn(add);
  add_losses(add);
  add_group_norm(add);
  add_batch_norm(add);
  add_dropout(add);
}

}  // namespace dtensor::sharding::ops
