// The rule builders of the op table for indexing, embedding, norms, losses, attention,
// factories, dropout and the backward ops of views and indexing (op_builders.cc has the
// pointwise, reduction, view, matmul and cat families and the shared helpers).

#include <algorithm>
#include <stdexcept>

#include "base/error.h"
#include "sharding_prop/op_builders.h"

namespace dtensor::sharding::builders {

// An indexing op on a 0-dim self (ATen reads it as one element, dim 0 or -1): every input stays
// whole; the output has `out_shape` (0-dim, or gather's index shape).
BuiltRule on_scalar_self(const Metas& m, const std::vector<int64_t>& out_shape = {}) {
  Rule r;
  for (const TensorMeta& t : m) {
    TensorFactors f;
    for (const int64_t size : t.shape)
      f.push_back(size == 1 ? DimFactors{}
                            : DimFactors{r.add_factor(size, FactorKind::kReplicate)});
    r.inputs.push_back(std::move(f));
  }
  TensorFactors out;
  for (const int64_t size : out_shape)
    out.push_back(size == 1 ? DimFactors{}
                            : DimFactors{r.add_factor(size, FactorKind::kReplicate)});
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
  const DimFactors idx = len == 1 ? DimFactors{} : DimFactors{r.add_factor(len)};
  r.outputs[0].insert(r.outputs[0].begin() + d, idx);
  r.inputs.push_back(m[1].shape.empty() ? TensorFactors{} : TensorFactors{idx});
  return {std::move(r), {m[0].dtype}};
}

// gather(self, dim, index): ints: dim. Output = index's shape; dims where self and index agree
// shard together, the others (and `dim`) stay whole.
BuiltRule gather_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 2, "gather");
  if (m[0].ndim() == 0) return on_scalar_self(m, m[1].shape);
  const auto &s = m[0].shape, &ix = m[1].shape;
  if (s.size() != ix.size()) throw Error("gather: index and self need the same number of dims");
  const int64_t d = normalize_tensor_dim(arg(a, 0, "gather", "dim"), s.size(), "gather dim");
  Rule r;
  TensorFactors ts, ti;
  for (size_t k = 0; k < s.size(); ++k) {
    if (static_cast<int64_t>(k) != d && s[k] == ix[k]) {
      const DimFactors f = s[k] == 1 ? DimFactors{} : DimFactors{r.add_factor(s[k])};
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
    const DimFactors f = s == 1 ? DimFactors{} : DimFactors{r.add_factor(s)};
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
    const DimFactors f =
        g[k] == 1 ? DimFactors{} : DimFactors{r.add_factor(g[k], FactorKind::kContract)};
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
    const DimFactors f =
        s[d] == 1
            ? DimFactors{}
            : DimFactors{r.add_factor(s[d], norm ? FactorKind::kReplicate : FactorKind::kPass)};
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
  const bool ok = (self.size() == 2 && target == std::vector<int64_t>{self[0]}) ||
                  (self.size() == 1 && target.empty());
  if (!ok || (weight != nullptr && *weight != std::vector<int64_t>{self.back()})) {
    throw Error(std::string(op) + ": expects self [N, C] or [C], target [N] or [] " +
                "and weight [C]");
  }
}

// nll_loss_forward(self [N, C] or [C], target, weight?): ints: reduction (0 none, 1 mean,
// 2 sum). Outputs output, total_weight. The class dim stays whole; the batch dim shards with
// the targets: summed for reduction sum, kept for none, whole for mean (a mean over shards of
// unequal ignored counts is not the mean).
BuiltRule nll_loss_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 3, "nll_loss_forward");
  const int64_t reduction = arg(a, 0, "nll_loss_forward", "reduction");
  Rule r;
  const auto& s = m[0].shape;
  check_nll_shapes(s, m[1].shape, m.size() == 3 ? &m[2].shape : nullptr, "nll_loss_forward");
  const int c = r.add_factor(s.back(), FactorKind::kReplicate);
  TensorFactors self, target, out;
  if (s.size() == 2) {
    const FactorKind kind = reduction == 0   ? FactorKind::kPass
                            : reduction == 2 ? FactorKind::kContract
                                             : FactorKind::kReplicate;
    const DimFactors n = s[0] == 1 ? DimFactors{} : DimFactors{r.add_factor(s[0], kind)};
    self.push_back(n);
    target.push_back(n);
    if (reduction == 0) out.push_back(n);
    if (reduction == 0 && !n.empty()) r.output_sums = {{}, {n[0]}};
  }
  self.push_back({c});
  r.inputs = {self, target};
  if (m.size() == 3) r.inputs.push_back({{c}});
  r.outputs = {out, {}};
  return {std::move(r), {m[0].dtype, m[0].dtype}};
}

// nll_loss_backward(grad_output, self, target, weight?, total_weight): ints: reduction.
BuiltRule nll_loss_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 4, 5, "nll_loss_backward");
  const int64_t reduction = arg(a, 0, "nll_loss_backward", "reduction");
  Rule r;
  const auto& s = m[1].shape;
  check_nll_shapes(s, m[2].shape, m.size() == 5 ? &m[3].shape : nullptr, "nll_loss_backward");
  const int c = r.add_factor(s.back(), FactorKind::kReplicate);
  TensorFactors self, target, grad;
  if (s.size() == 2) {
    const DimFactors n = s[0] == 1 ? DimFactors{} : DimFactors{r.add_factor(s[0])};
    self.push_back(n);
    target.push_back(n);
    if (reduction == 0) grad.push_back(n);
  }
  self.push_back({c});
  r.inputs = {grad, self, target};
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
    const DimFactors f = q[d] == 1 ? DimFactors{} : DimFactors{r.add_factor(q[d])};
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

// new_zeros/new_ones/new_empty/new_full(self, size): ints: the new sizes. Reads nothing of
// self: self stays as it is and the new tensor is replicated.
BuiltRule new_factory_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "new_*");
  Rule r;
  r.linearity = Linearity::kShapeOnly;
  r.output_shape_from_args = true;
  TensorFactors in, out;
  for (int64_t s : m[0].shape)
    in.push_back(s == 1 ? DimFactors{} : DimFactors{r.add_factor(s, FactorKind::kReplicate)});
  for (int64_t s : a.ints) {
    if (s < 0) throw Error("new_*: negative size " + std::to_string(s));
    out.push_back(s == 1 ? DimFactors{} : DimFactors{r.add_factor(s, FactorKind::kReplicate)});
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

// slice_backward(grad, input_sizes, dim, start, end, step): ints: dim, start, end, step,
// input_sizes... The grad is the slice of a zero tensor of input_sizes: like slice, reversed.
BuiltRule slice_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "slice_backward");
  if (a.ints.size() < 4) throw Error("slice_backward: needs dim, start, end, step, sizes");
  const std::vector<int64_t> sizes(a.ints.begin() + 4, a.ints.end());
  Rule r = slice_rule(sizes, a.ints[0], a.ints[1], a.ints[2], a.ints[3]);
  if (r.output_shape(0) != m[0].shape) throw Error("slice_backward: grad does not fit the slice");
  std::swap(r.inputs[0], r.outputs[0]);
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

// scatter_add / scatter.src (self, index, src) and index_add (self, index, source): ints: dim.
// Along `dim` everything stays whole; other dims shard together where their sizes agree.
BuiltRule scatter_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 3, 3, "scatter");
  const auto &s = m[0].shape, &ix = m[1].shape, &src = m[2].shape;
  if (ix.size() != s.size() || src.size() != s.size()) {
    throw Error("scatter: self, index and src need the same number of dims");
  }
  const int64_t d = normalize_tensor_dim(arg(a, 0, "scatter", "dim"), s.size(), "scatter dim");
  Rule r;
  TensorFactors ts, ti, tsrc;
  for (size_t k = 0; k < s.size(); ++k) {
    if (static_cast<int64_t>(k) != d && s[k] == ix[k] && ix[k] == src[k]) {
      const DimFactors f = s[k] == 1 ? DimFactors{} : DimFactors{r.add_factor(s[k])};
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
  const DimFactors rows =
      len == 1 ? DimFactors{} : DimFactors{r.add_factor(len, FactorKind::kContract)};
  for (size_t k = 0; k < s.size(); ++k) {
    if (static_cast<int64_t>(k) == d) {
      ts.push_back({r.add_factor(s[k], FactorKind::kReplicate)});
      tsrc.push_back(rows);
    } else if (s[k] == src[k]) {
      const DimFactors f = s[k] == 1 ? DimFactors{} : DimFactors{r.add_factor(s[k])};
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
      const DimFactors f = sizes[k] == 1 ? DimFactors{} : DimFactors{r.add_factor(sizes[k])};
      grad.push_back(f);
      out.push_back(f);
      grad_shape.push_back(sizes[k]);
      continue;
    }
    out.push_back(sizes[d] == 1 ? DimFactors{}
                                : DimFactors{r.add_factor(sizes[d], FactorKind::kReplicate)});
    if (!keepdim) continue;
    const int64_t kept = static_cast<int64_t>(m[0].shape.size()) > d ? m[0].shape[d] : 1;
    grad.push_back(kept == 1 ? DimFactors{}
                             : DimFactors{r.add_factor(kept, FactorKind::kReplicate)});
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

namespace dtensor::sharding::builders {

namespace {

// The factors of a convolution's tensors: batch (pass), input channels, output channels (pass,
// or whole with groups), kernel and spatial dims (whole). Weight is [Cout, Cin/g, k...], or
// [Cin, Cout/g, k...] when transposed; an unbatched input has no batch dim.
struct ConvFactors {
  Rule r;
  TensorFactors input, weight, output;
  DimFactors batch, cin, cout;
};

ConvFactors conv_factors(const TensorMeta& input, const TensorMeta& weight, bool transposed,
                         int64_t groups, FactorKind cin_kind) {
  if (weight.ndim() < 3 || (input.ndim() != weight.ndim() && input.ndim() != weight.ndim() - 1))
    throw Error(
        "convolution: weight must be [out, in, kernel...] and input [batch, in, spatial...]");
  ConvFactors c;
  auto factor = [&](int64_t size, FactorKind kind) {
    return size == 1 ? DimFactors{} : DimFactors{c.r.add_factor(size, kind)};
  };
  const bool batched = input.ndim() == weight.ndim();
  const int64_t ch = batched ? 1 : 0;  // the input's channel dim
  const bool grouped = groups != 1;
  c.batch = batched ? factor(input.shape[0], FactorKind::kPass) : DimFactors{};
  c.cin = factor(input.shape[ch], grouped ? FactorKind::kReplicate : cin_kind);
  const int64_t out_channels = transposed ? weight.shape[1] * groups : weight.shape[0];
  c.cout = factor(out_channels, grouped ? FactorKind::kReplicate : FactorKind::kPass);
  // ATen refuses a weight with no channels: channels shard only evenly (no rank's piece empty).
  for (const DimFactors* f : {&c.cin, &c.cout})
    for (const int k : *f) c.r.factors[k].even_only = true;
  auto whole = [&](int64_t size) { return factor(size, FactorKind::kReplicate); };
  if (batched) c.input.push_back(c.batch);
  c.input.push_back(c.cin);
  for (int64_t d = ch + 1; d < input.ndim(); ++d) c.input.push_back(whole(input.shape[d]));
  const DimFactors w0 = grouped ? whole(weight.shape[0]) : (transposed ? c.cin : c.cout);
  const DimFactors w1 = grouped ? whole(weight.shape[1]) : (transposed ? c.cout : c.cin);
  c.weight = {w0, w1};
  for (int64_t d = 2; d < weight.ndim(); ++d) c.weight.push_back(whole(weight.shape[d]));
  if (batched) c.output.push_back(c.batch);
  c.output.push_back(c.cout);
  for (int64_t d = ch + 1; d < input.ndim(); ++d) c.output.push_back({});  // set by the caller
  return c;
}

}  // namespace

// convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
// groups): ints: transposed, groups, then len(stride), stride..., and the same for padding,
// dilation and output_padding (a list of one applies to every spatial dim). A batch-sharded input
// gives a batch-sharded output, an output-channel-sharded weight (and bias) a channel-sharded
// output, input channels sharded on both input and weight a Partial(sum) output (the bias then
// joins on one rank). With groups, channels stay whole; channels shard only evenly.
BuiltRule convolution_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 3, "convolution");
  const bool transposed = arg(a, 0, "convolution", "transposed") != 0;
  const int64_t groups = arg(a, 1, "convolution", "groups");
  ConvFactors c = conv_factors(m[0], m[1], transposed, groups, FactorKind::kContract);
  Rule r = std::move(c.r);
  // The output's spatial sizes, computed here (ATen's meta kernel for convolution exists only in
  // Python's registrations, so a C++ program could not ask it).
  std::vector<std::vector<int64_t>> lists;
  for (size_t i = 2; i < a.ints.size();) {
    const int64_t n = a.ints[i];
    lists.emplace_back(a.ints.begin() + i + 1, a.ints.begin() + i + 1 + n);
    i += 1 + n;
  }
  if (lists.size() != 4)
    throw Error("convolution: needs stride, padding, dilation, output_padding");
  auto list_at = [&](size_t list, size_t i) -> int64_t {
    const auto& l = lists[list];
    if (l.empty()) return list == 0 || list == 2 ? 1 : 0;
    return l[std::min(i, l.size() - 1)];
  };
  const int64_t spatial = m[1].ndim() - 2, first = m[0].ndim() - spatial;
  for (int64_t i = 0; i < spatial; ++i) {
    const int64_t in = m[0].shape[first + i], k = m[1].shape[2 + i];
    const int64_t s = list_at(0, i), p = list_at(1, i), d = list_at(2, i), op = list_at(3, i);
    const int64_t out = transposed ? (in - 1) * s - 2 * p + d * (k - 1) + op + 1
                                   : (in + 2 * p - d * (k - 1) - 1) / s + 1;
    if (out < 0) throw Error("convolution: the output would have a negative size");
    c.output[first + i] =
        out == 1 ? DimFactors{} : DimFactors{r.add_factor(out, FactorKind::kReplicate)};
  }
  r.inputs = {c.input, c.weight};
  if (m.size() == 3) {
    if (m[2].ndim() != 1) throw Error("convolution: bias must be 1-D");
    r.inputs.push_back({c.cout});
    r.partial_with_contract = {false, false, true};
  }
  r.outputs = {c.output};
  return {std::move(r), {promoted(m)}};
}

// convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
// transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias):
// ints: transposed, groups. grad_input sums over output channels and the weight gradients over
// the batch: sharding those leaves them Partial(sum).
BuiltRule convolution_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 3, 3, "convolution_backward");
  const bool transposed = arg(a, 0, "convolution_backward", "transposed") != 0;
  const int64_t groups = arg(a, 1, "convolution_backward", "groups");
  ConvFactors c = conv_factors(m[1], m[2], transposed, groups, FactorKind::kPass);
  Rule r = std::move(c.r);
  TensorFactors grad_output = c.output;
  for (size_t d = grad_output.size() - (m[1].ndim() - (m[1].ndim() == m[2].ndim() ? 2 : 1));
       d < grad_output.size(); ++d) {
    const int64_t size = m[0].shape[d];
    grad_output[d] =
        size == 1 ? DimFactors{} : DimFactors{r.add_factor(size, FactorKind::kReplicate)};
  }
  r.inputs = {grad_output, c.input, c.weight};
  r.outputs = {c.input, c.weight, {c.cout}};
  r.output_sums = {c.cout, c.batch, c.batch};
  return {std::move(r), {m[1].dtype, m[2].dtype, m[2].dtype}};
}

}  // namespace dtensor::sharding::builders

namespace dtensor::sharding::builders {

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

}  // namespace dtensor::sharding::builders

namespace dtensor::sharding::builders {

namespace {

// Group norm's factors: the batch dim passes; channels, spatial dims and groups stay whole.
struct GroupNormFactors {
  Rule r;
  TensorFactors input, channels, stats;  // [N, C, *], [C], [N, group]
  DimFactors batch;
};

GroupNormFactors group_norm_factors(const TensorMeta& input, int64_t group) {
  if (input.ndim() < 2) throw Error("native_group_norm: input must be [N, C, *]");
  GroupNormFactors g;
  auto factor = [&](int64_t size, FactorKind kind) {
    return size == 1 ? DimFactors{} : DimFactors{g.r.add_factor(size, kind)};
  };
  g.batch = factor(input.shape[0], FactorKind::kPass);
  g.input.push_back(g.batch);
  const DimFactors c = factor(input.shape[1], FactorKind::kReplicate);
  g.input.push_back(c);
  for (int64_t d = 2; d < input.ndim(); ++d)
    g.input.push_back(factor(input.shape[d], FactorKind::kReplicate));
  g.channels = {c};
  g.stats = {g.batch, factor(group, FactorKind::kReplicate)};
  return g;
}

}  // namespace

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

}  // namespace dtensor::sharding::builders
