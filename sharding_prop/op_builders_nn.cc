// The rule builders of the op table for indexing, embedding, layer norm, nll, attention,
// factories, dropout and the backward ops of views and indexing (op_builders.cc has the
// pointwise, reduction, view, matmul and cat families and the shared helpers;
// op_builders_layers.cc convolution, group norm and the elementwise losses).

#include <algorithm>
#include <stdexcept>

#include "base/error.h"
#include "sharding_prop/op_builders.h"

namespace dtensor::sharding::builders {

// An indexing op on a 0-dim self (ATen reads it as one element, dim 0 or -1): every input stays
// whole; the output has `out_shape` (0-dim, or gather's index shape).
BuiltRule on_scalar_self(const Metas& m, const std::vector<int64_t>& out_shape) {
  Rule r;
  for (const TensorMeta& t : m) {
    TensorFactors f;
    for (const int64_t size : t.shape) f.push_back(r.add_dim(size, FactorKind::kReplicate));
    r.inputs.push_back(std::move(f));
  }
  TensorFactors out;
  for (const int64_t size : out_shape) out.push_back(r.add_dim(size, FactorKind::kReplicate));
  r.outputs = {std::move(out)};
  return {std::move(r), {m[0].dtype}};
}

// index_select(self, dim, index): ints: dim. The output's dim follows the 1-D index.
BuiltRule index_select_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 2, "index_select");
  if (m[0].ndim() == 0) return on_scalar_self(m);
  const auto& s = m[0].shape;
  if (m[1].shape.size() > 1) throw Error("index_select: index must be 1-D");
  const int64_t d =
      normalize_tensor_dim(arg(a, 0, "index_select", "dim"), s.size(), "index_select dim");
  Rule r = select_rule(s, d);  // self's dim replicated, removed
  const int64_t len = m[1].shape.empty() ? 1 : m[1].shape[0];
  const DimFactors idx = r.add_dim(len);
  r.outputs[0].insert(r.outputs[0].begin() + d, idx);
  r.inputs.push_back(m[1].shape.empty() ? TensorFactors{} : TensorFactors{idx});
  return {std::move(r), {m[0].dtype}};
}

// gather(self, dim, index): ints: dim. Output = index's shape; dims where self and index agree
// shard together, the others (and `dim`) stay whole.
BuiltRule gather_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 2, "gather");
  // A 0-dim self, or an empty index (ATen skips its shape checks then: the result is an empty
  // tensor of the index's shape; torch 2.11's op_db has gather([5], 0, [2, 0])).
  if (m[0].ndim() == 0 || m[1].numel() == 0) return on_scalar_self(m, m[1].shape);
  const auto &s = m[0].shape, &ix = m[1].shape;
  if (s.size() != ix.size()) throw Error("gather: index and self need the same number of dims");
  const int64_t d = normalize_tensor_dim(arg(a, 0, "gather", "dim"), s.size(), "gather dim");
  Rule r;
  TensorFactors ts, ti;
  for (size_t k = 0; k < s.size(); ++k) {
    if (static_cast<int64_t>(k) != d && s[k] == ix[k]) {
      const DimFactors f = r.add_dim(s[k]);
      ts.push_back(f);
      ti.push_back(f);
    } else {
      ts.push_back({r.add_factor(s[k], FactorKind::kReplicate)});
      ti.push_back({r.add_factor(
          ix[k], static_cast<int64_t>(k) == d ? FactorKind::kPass : FactorKind::kReplicate)});
    }
  }
  r.inputs = {ts, ti};
  r.outputs = {ti};
  return {std::move(r), {m[0].dtype}};
}

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

namespace {

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

}  // namespace

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

// new_zeros/new_ones/new_empty/new_full/new_empty_strided(self, size): ints: the new sizes.
// Reads nothing of self: self stays as it is. A new tensor of self's shape is laid out as self's
// Shards (as PyTorch's), one of another shape is replicated; a Partial self gives Replicate.
BuiltRule new_factory_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "new_*");
  Rule r;
  r.linearity = Linearity::kShapeOnly;
  r.output_shape_from_args = true;
  for (int64_t s : a.ints) {
    if (s < 0) throw Error("new_*: negative size " + std::to_string(s));
  }
  const bool same_shape = a.ints == m[0].shape;
  const FactorKind kind = same_shape ? FactorKind::kPass : FactorKind::kReplicate;
  TensorFactors in, out;
  for (int64_t s : m[0].shape) in.push_back(r.add_dim(s, kind));
  if (same_shape) {
    out = in;
  } else {
    for (int64_t s : a.ints) out.push_back(r.add_dim(s, FactorKind::kReplicate));
  }
  r.inputs = {in};
  r.outputs = {out};
  return {std::move(r), {m[0].dtype}};
}

// An entry whose op no layout runs: raises "no sharding rule: <why>".
RuleBuilder no_rule(const char* why) {
  return [why](const Metas&, const LayoutArgs&) -> BuiltRule { fail("no sharding rule: ", why); };
}

// native_dropout(input) -> (out, mask): elementwise.
BuiltRule dropout_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 1, 1, "native_dropout");
  Rule r = pointwise_rule(shapes_of(m), Linearity::kNone);
  r.outputs.push_back(r.outputs[0]);
  return {std::move(r), {m[0].dtype, c10::kBool}};
}

// histc(self, bins, min, max): ints: bins, min == max. With a range given (min != max) the bins
// are fixed, so each rank counts its piece and the counts sum: every dim of self contracts with
// sum (a Shard input gives Partial(sum), as PyTorch's). Without one (min == max) the range is
// self's own minimum and maximum, which a piece does not know: self stays whole.
BuiltRule histc_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "histc");
  if (a.ints.size() < 2) throw Error("histc: needs bins and min == max");
  const FactorKind kind = a.ints[1] == 0 ? FactorKind::kContract : FactorKind::kReplicate;
  Rule r;
  TensorFactors in;
  for (int64_t s : m[0].shape) in.push_back(r.add_dim(s, kind));
  r.inputs = {in};
  r.outputs = {{r.add_dim(a.ints[0], FactorKind::kReplicate)}};
  return same_dtype(std::move(r), m);
}

// slice_backward(grad, input_sizes, dim, start, end, step): ints: dim, start, end, step,
// input_sizes... The grad is the slice of a zero tensor of input_sizes: like slice, reversed. The
// grad's sliced dim contracts with sum: a rank holding a piece of it writes that piece where it
// lands in the zeros (Execution::kSliceBackwardAtOffset), and the ranks' results sum to the
// whole, so a grad sharded there gives a Partial(sum) result with no communication (as the
// slice's gradient needs no gather before it flows on).
BuiltRule slice_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "slice_backward");
  if (a.ints.size() < 4) throw Error("slice_backward: needs dim, start, end, step, sizes");
  const std::vector<int64_t> sizes(a.ints.begin() + 4, a.ints.end());
  Rule r = slice_rule(sizes, a.ints[0], a.ints[1], a.ints[2], a.ints[3]);
  if (r.output_shape(0) != m[0].shape) throw Error("slice_backward: grad does not fit the slice");
  std::swap(r.inputs[0], r.outputs[0]);
  const int64_t d =
      normalize_tensor_dim(a.ints[0], static_cast<int64_t>(sizes.size()), "slice_backward dim");
  const DimFactors& grad_dim = r.inputs[0][d];
  if (grad_dim.size() == 1 && grad_dim != r.outputs[0][d]) {  // a real slice
    r.factors[grad_dim[0]].kind = FactorKind::kContract;
    r.factors[grad_dim[0]].reduce = ReduceOp::kSum;
  }
  return same_dtype(std::move(r), m);
}

// select_backward(grad, input_sizes, dim, index): ints: dim, input_sizes...
BuiltRule select_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "select_backward");
  if (a.ints.empty()) throw Error("select_backward: needs dim, sizes");
  const std::vector<int64_t> sizes(a.ints.begin() + 1, a.ints.end());
  Rule r = select_rule(sizes, a.ints[0]);
  if (r.output_shape(0) != m[0].shape)
    throw Error("select_backward: grad does not fit the selection");
  std::swap(r.inputs[0], r.outputs[0]);
  return same_dtype(std::move(r), m);
}

// scatter / scatter_add / scatter_reduce (self, index[, src]): ints: dim. Along `dim` everything
// stays whole; other dims shard together where their sizes agree (each output element takes only
// index entries of its own coordinates there, whatever the reduction).
BuiltRule scatter_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 3, "scatter");
  // A 0-dim self (index and src of <= 1 element), or an empty index (self unchanged: ATen skips
  // the shape checks; the backward of gather with an empty index).
  if (m[0].ndim() == 0 || m[1].numel() == 0) return on_scalar_self(m, m[0].shape);
  // The .value overloads scatter a Scalar: no src tensor.
  const auto &s = m[0].shape, &ix = m[1].shape, &src = m.size() == 3 ? m[2].shape : m[1].shape;
  if (ix.size() != s.size() || src.size() != s.size()) {
    throw Error("scatter: self, index and src need the same number of dims");
  }
  const int64_t d = normalize_tensor_dim(arg(a, 0, "scatter", "dim"), s.size(), "scatter dim");
  Rule r;
  TensorFactors ts, ti, tsrc;
  for (size_t k = 0; k < s.size(); ++k) {
    if (static_cast<int64_t>(k) != d && s[k] == ix[k] && ix[k] == src[k]) {
      const DimFactors f = r.add_dim(s[k]);
      ts.push_back(f);
      ti.push_back(f);
      tsrc.push_back(f);
    } else {
      ts.push_back({r.add_factor(s[k], FactorKind::kReplicate)});
      ti.push_back({r.add_factor(ix[k], FactorKind::kReplicate)});
      tsrc.push_back({r.add_factor(src[k], FactorKind::kReplicate)});
    }
  }
  r.inputs = {ts, ti, tsrc};
  if (m.size() == 2) r.inputs.pop_back();
  r.outputs = {ts};
  return {std::move(r), {m[0].dtype}};
}

BuiltRule index_add_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 3, 3, "index_add");
  if (m[0].ndim() == 0) return on_scalar_self(m);
  const auto &s = m[0].shape, &src = m[2].shape;
  const int64_t d = normalize_tensor_dim(arg(a, 0, "index_add", "dim"), s.size(), "index_add dim");
  if (src.size() != s.size() || m[1].shape.size() > 1) {
    throw Error("index_add: source must have self's dims and index must be 1-D");
  }
  Rule r;
  TensorFactors ts, tsrc;
  // The additions along `dim` land on the rows the index names: source rows and index entries
  // shard together, which leaves self's rows Partial(sum).
  const int64_t len = m[1].shape.empty() ? 1 : m[1].shape[0];
  const DimFactors rows = r.add_dim(len, FactorKind::kContract);
  for (size_t k = 0; k < s.size(); ++k) {
    if (static_cast<int64_t>(k) == d) {
      ts.push_back({r.add_factor(s[k], FactorKind::kReplicate)});
      tsrc.push_back(rows);
    } else if (s[k] == src[k]) {
      const DimFactors f = r.add_dim(s[k]);
      ts.push_back(f);
      tsrc.push_back(f);
    } else {
      throw Error("index_add: source and self differ outside dim");
    }
  }
  r.inputs = {ts, m[1].shape.empty() ? TensorFactors{} : TensorFactors{rows}, tsrc};
  r.outputs = {ts};
  r.partial_with_contract = {true, false, false};  // self joins the Partial sum on one rank
  return {std::move(r), {m[0].dtype}};
}

// value_selecting_reduction_backward(grad, dim, indices, sizes, keepdim): ints: dim, keepdim,
// sizes... (max.dim's and min.dim's backward): a scatter of grad along dim into zeros(sizes).
BuiltRule value_selecting_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 2, "value_selecting_reduction_backward");
  if (a.ints.size() < 2)
    throw Error("value_selecting_reduction_backward: needs dim, keepdim, sizes");
  const std::vector<int64_t> sizes(a.ints.begin() + 2, a.ints.end());
  const int64_t nd = static_cast<int64_t>(sizes.size());
  if (nd == 0) return on_scalar_self(m);  // a 0-dim input: its one element
  const int64_t d = normalize_tensor_dim(a.ints[0], nd, "value_selecting_reduction_backward dim");
  const bool keepdim = a.ints[1] != 0;
  // grad and indices: `sizes` without `dim` (keepdim false), or with `dim` of any size k (sort,
  // topk: k values per row). `dim` stays whole; the other dims pass to the output.
  Rule r;
  TensorFactors grad, out;
  std::vector<int64_t> grad_shape;
  for (int64_t k = 0; k < nd; ++k) {
    if (k != d) {
      const DimFactors f = r.add_dim(sizes[k]);
      grad.push_back(f);
      out.push_back(f);
      grad_shape.push_back(sizes[k]);
      continue;
    }
    out.push_back(r.add_dim(sizes[d], FactorKind::kReplicate));
    if (!keepdim) continue;
    const int64_t kept = static_cast<int64_t>(m[0].shape.size()) > d ? m[0].shape[d] : 1;
    grad.push_back(r.add_dim(kept, FactorKind::kReplicate));
    grad_shape.push_back(kept);
  }
  if (grad_shape != m[0].shape || m[1].shape != m[0].shape) {
    throw Error("value_selecting_reduction_backward: grad/indices do not fit sizes");
  }
  r.inputs = {grad, grad};
  r.outputs = {out};
  return {std::move(r), {m[0].dtype}};
}

}  // namespace dtensor::sharding::builders
