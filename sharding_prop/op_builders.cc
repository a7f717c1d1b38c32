// The rule builders of the op table (op_registry.cc): one per op family, each turning the
// input metas and layout arguments into a Rule and output dtypes. The table names them; this file
// says how each family maps dims.

#include "sharding_prop/op_builders.h"

#include <algorithm>
#include <stdexcept>

namespace dtensor::sharding::builders {

Shapes shapes_of(const Metas& m) {
  Shapes s;
  for (const auto& x : m) s.push_back(x.shape);
  return s;
}

c10::ScalarType promoted(const Metas& m) {
  c10::ScalarType t = m.at(0).dtype;
  for (size_t i = 1; i < m.size(); ++i) t = c10::promoteTypes(t, m[i].dtype);
  return t;
}

void need_inputs(const Metas& m, size_t lo, size_t hi, const char* op) {
  if (m.size() < lo || m.size() > hi) {
    throw std::invalid_argument(std::string(op) + ": expected " + std::to_string(lo) +
                                (lo == hi ? "" : "-" + std::to_string(hi)) +
                                " tensor inputs, got " + std::to_string(m.size()));
  }
}

int64_t arg(const LayoutArgs& a, size_t i, const char* op, const char* what) {
  if (i >= a.ints.size()) {
    throw std::invalid_argument(std::string(op) + ": layout argument '" + what + "' missing");
  }
  return a.ints[i];
}

// ---- family builders ----

RuleBuilder pointwise(size_t n, Linearity lin, std::vector<bool> linear_inputs, bool to_bool) {
  return [=](const Metas& m, const LayoutArgs&) {
    need_inputs(m, 1, n, "pointwise op");
    return BuiltRule{pointwise_rule(shapes_of(m), lin, linear_inputs),
                     {to_bool ? c10::kBool : promoted(m)}};
  };
}

// where(cond, a, b): the result type is a's and b's, not the condition's.
BuiltRule where_rule(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 3, 3, "where");
  return {pointwise_rule(shapes_of(m), Linearity::kNone),
          {c10::promoteTypes(m[1].dtype, m[2].dtype)}};
}

// ints: dtype (as c10::ScalarType), or -1 to keep the input's.
BuiltRule cast_rule(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "_to_copy");
  const int64_t t = a.ints.empty() ? -1 : a.ints[0];
  return {pointwise_rule(shapes_of(m), Linearity::kNone),
          {t < 0 ? m[0].dtype : static_cast<c10::ScalarType>(t)}};
}

// ints: keepdim, dims... (no dims: all).
RuleBuilder reduction(ReduceOp op, bool replicate, Linearity lin, int out_dtype, int outputs) {
  return [=](const Metas& m, const LayoutArgs& a) {
    need_inputs(m, 1, 1, "reduction");
    const bool keepdim = !a.ints.empty() && a.ints[0] != 0;
    const std::vector<int64_t> dims(a.ints.begin() + std::min<size_t>(1, a.ints.size()),
                                    a.ints.end());
    BuiltRule b{reduction_rule(m[0].shape, dims, keepdim, op, replicate, lin), {}};
    const auto dtype = out_dtype < 0 ? m[0].dtype : static_cast<c10::ScalarType>(out_dtype);
    b.out_dtypes.push_back(dtype);
    for (int i = 1; i < outputs; ++i) {  // max.dim / min.dim: values, then int64 indices
      b.rule.outputs.push_back(b.rule.outputs[0]);
      b.out_dtypes.push_back(c10::kLong);
    }
    return b;
  };
}

// ints: dim (softmax) / dim (its backward, two inputs).
RuleBuilder softmax(size_t n) {
  return [=](const Metas& m, const LayoutArgs& a) {
    need_inputs(m, n, n, "softmax");
    return BuiltRule{replicate_dims_rule(shapes_of(m), {arg(a, 0, "softmax", "dim")}),
                     {m.back().dtype}};
  };
}

BuiltRule same_dtype(Rule r, const Metas& m) { return {std::move(r), {m.at(0).dtype}}; }

// ints: the new shape (one -1 allowed).
BuiltRule view_rule(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "view");
  return same_dtype(reshape_rule(m[0].shape, a.ints), m);
}

// ints: start_dim, end_dim.
BuiltRule flatten_rule(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "flatten");
  const auto& s = m[0].shape;
  const int64_t nd = std::max<int64_t>(1, static_cast<int64_t>(s.size()));
  const int64_t lo =
      normalize_tensor_dim(arg(a, 0, "flatten", "start_dim"), nd, "flatten start_dim");
  const int64_t hi = normalize_tensor_dim(arg(a, 1, "flatten", "end_dim"), nd, "flatten end_dim");
  if (s.empty()) return same_dtype(reshape_rule(s, {1}), m);
  std::vector<int64_t> to(s.begin(), s.begin() + lo);
  int64_t merged = 1;
  for (int64_t d = lo; d <= hi; ++d) merged *= s[d];
  to.push_back(merged);
  to.insert(to.end(), s.begin() + hi + 1, s.end());
  return same_dtype(reshape_rule(s, to), m);
}

// ints: dim, sizes...
BuiltRule unflatten_rule(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "unflatten");
  const auto& s = m[0].shape;
  const int64_t d = normalize_tensor_dim(arg(a, 0, "unflatten", "dim"), s.size(), "unflatten dim");
  std::vector<int64_t> to(s.begin(), s.begin() + d);
  to.insert(to.end(), a.ints.begin() + 1, a.ints.end());
  to.insert(to.end(), s.begin() + d + 1, s.end());
  return same_dtype(reshape_rule(s, to), m);
}

// ints: dim (squeeze.dim) or nothing (squeeze: every size-1 dim).
BuiltRule squeeze_rule(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "squeeze");
  const auto& s = m[0].shape;
  std::vector<int64_t> to;
  const int64_t d =
      a.ints.empty() || s.empty() ? -1 : normalize_tensor_dim(a.ints[0], s.size(), "squeeze dim");
  for (int64_t k = 0; k < static_cast<int64_t>(s.size()); ++k) {
    if (s[k] == 1 && (d < 0 || k == d)) continue;
    to.push_back(s[k]);
  }
  return same_dtype(reshape_rule(s, to), m);
}

// ints: dim.
BuiltRule unsqueeze_rule(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "unsqueeze");
  auto to = m[0].shape;
  const int64_t d =
      normalize_tensor_dim(arg(a, 0, "unsqueeze", "dim"), to.size() + 1, "unsqueeze dim");
  to.insert(to.begin() + d, 1);
  return same_dtype(reshape_rule(m[0].shape, to), m);
}

// ints: dim0, dim1.
BuiltRule transpose_rule(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "transpose");
  const int64_t nd = static_cast<int64_t>(m[0].shape.size());
  std::vector<int64_t> perm(nd);
  for (int64_t d = 0; d < nd; ++d) perm[d] = d;
  if (nd > 0) {
    const int64_t x = normalize_tensor_dim(arg(a, 0, "transpose", "dim0"), nd, "transpose dim0");
    const int64_t y = normalize_tensor_dim(arg(a, 1, "transpose", "dim1"), nd, "transpose dim1");
    std::swap(perm[x], perm[y]);
  }
  return same_dtype(permute_rule(m[0].shape, perm), m);
}

BuiltRule t_rule(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 1, 1, "t");
  if (m[0].shape.size() > 2) throw std::invalid_argument("t: expects a tensor of at most 2 dims");
  return transpose_rule(m, LayoutArgs{{0, m[0].shape.size() == 2 ? 1 : 0}, ""});
}

// ints: the permutation.
BuiltRule permute_rule_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "permute");
  return same_dtype(permute_rule(m[0].shape, a.ints), m);
}

// ints: the target sizes.
BuiltRule expand_rule_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "expand");
  return same_dtype(expand_rule(m[0].shape, a.ints), m);
}

// ints: dim.
RuleBuilder concat(bool stack) {
  return [=](const Metas& m, const LayoutArgs& a) {
    return BuiltRule{cat_rule(shapes_of(m), arg(a, 0, "cat", "dim"), stack), {promoted(m)}};
  };
}

BuiltRule mm_rule(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 2, 2, "mm");
  if (m[0].shape.size() != 2 || m[1].shape.size() != 2) {
    throw std::invalid_argument("mm: both arguments must be 2-D");
  }
  return {matmul_rule(m[0].shape, m[1].shape), {promoted(m)}};
}

BuiltRule bmm_rule(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 2, 2, "bmm");
  if (m[0].shape.size() != 3 || m[1].shape.size() != 3 || m[0].shape[0] != m[1].shape[0]) {
    throw std::invalid_argument("bmm: arguments must be 3-D with equal batch sizes");
  }
  return {matmul_rule(m[0].shape, m[1].shape), {promoted(m)}};
}

BuiltRule matmul_rule_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 2, 2, "matmul");
  return {matmul_rule(m[0].shape, m[1].shape), {promoted(m)}};
}

BuiltRule addmm_rule_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 3, 3, "addmm");
  return {addmm_rule(m[0].shape, m[1].shape, m[2].shape), {promoted(m)}};
}

BuiltRule linear_rule_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 2, 3, "linear");
  return {linear_rule(m[0].shape, m[1].shape, m.size() == 3 ? &m[2].shape : nullptr),
          {promoted(m)}};
}

// text: the equation.
BuiltRule einsum_rule(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 2, "einsum");
  return {parse_rule(a.text, shapes_of(m), Linearity::kMultilinear), {promoted(m)}};
}

// ints: dim, start, end, step (slice.Tensor) / dim, start, length (narrow).
BuiltRule slice_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "slice");
  return same_dtype(slice_rule(m[0].shape, arg(a, 0, "slice", "dim"), arg(a, 1, "slice", "start"),
                               arg(a, 2, "slice", "end"), a.ints.size() > 3 ? a.ints[3] : 1),
                    m);
}

BuiltRule narrow_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "narrow");
  const int64_t start = arg(a, 1, "narrow", "start");
  return same_dtype(slice_rule(m[0].shape, arg(a, 0, "narrow", "dim"), start,
                               start + arg(a, 2, "narrow", "length"), 1),
                    m);
}

// ints: dim (the index does not change layouts).
BuiltRule select_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "select");
  return same_dtype(select_rule(m[0].shape, arg(a, 0, "select", "dim")), m);
}

BuiltRule with_outputs_dtype(Rule r, c10::ScalarType t) {
  BuiltRule b{std::move(r), {}};
  b.out_dtypes.assign(b.rule.outputs.size(), t);
  return b;
}

// ints: split_size, dim.
BuiltRule split_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "split");
  const int64_t size = arg(a, 0, "split", "split_size");
  const int64_t d = normalize_tensor_dim(arg(a, 1, "split", "dim"), m[0].shape.size(), "split dim");
  if (size <= 0) throw std::invalid_argument("split: split_size must be positive");
  std::vector<int64_t> sizes;
  for (int64_t left = m[0].shape[d]; left > 0; left -= size) sizes.push_back(std::min(size, left));
  if (sizes.empty()) sizes.push_back(0);
  return with_outputs_dtype(split_rule(m[0].shape, d, sizes), m[0].dtype);
}

// ints: dim, sizes...
BuiltRule split_sizes_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "split_with_sizes");
  const std::vector<int64_t> sizes(a.ints.begin() + 1, a.ints.end());
  return with_outputs_dtype(split_rule(m[0].shape, arg(a, 0, "split_with_sizes", "dim"), sizes),
                            m[0].dtype);
}

// ints: chunks, dim (torch.chunk: pieces of ceil(n / chunks)).
BuiltRule chunk_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "chunk");
  const int64_t chunks = arg(a, 0, "chunk", "chunks");
  const int64_t d = normalize_tensor_dim(arg(a, 1, "chunk", "dim"), m[0].shape.size(), "chunk dim");
  if (chunks <= 0) throw std::invalid_argument("chunk: chunks must be positive");
  const int64_t n = m[0].shape[d], size = (n + chunks - 1) / chunks;
  return split_of(m, LayoutArgs{{std::max<int64_t>(size, 1), d}, ""});
}

// index_select(self, dim, index): ints: dim. The output's dim follows the 1-D index.
BuiltRule index_select_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 2, "index_select");
  const auto& s = m[0].shape;
  if (m[1].shape.size() > 1) throw std::invalid_argument("index_select: index must be 1-D");
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
  const auto &s = m[0].shape, &ix = m[1].shape;
  if (s.size() != ix.size())
    throw std::invalid_argument("gather: index and self need the same number of dims");
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
  if (m[0].shape.size() != 2) throw std::invalid_argument("embedding: weight must be 2-D");
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
    throw std::invalid_argument("embedding_dense_backward: grad must be indices' shape + [D]");
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
    throw std::invalid_argument("native_layer_norm: bad normalized_shape");
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
    throw std::invalid_argument(
        std::string(op) + ": expects self [N, C] or [C], target [N] or [] " + "and weight [C]");
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
    throw std::invalid_argument("_scaled_dot_product_attention: q, k, v need equal ranks >= 2");
  }
  Rule r;
  TensorFactors tq, tk, tv;
  for (size_t d = 0; d + 2 < q.size(); ++d) {
    if (q[d] != k[d] || q[d] != v[d])
      throw std::invalid_argument("_scaled_dot_product_attention: batch dims differ");
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
  TensorFactors in, out;
  for (int64_t s : m[0].shape)
    in.push_back(s == 1 ? DimFactors{} : DimFactors{r.add_factor(s, FactorKind::kReplicate)});
  for (int64_t s : a.ints) {
    if (s < 0) throw std::invalid_argument("new_*: negative size " + std::to_string(s));
    out.push_back(s == 1 ? DimFactors{} : DimFactors{r.add_factor(s, FactorKind::kReplicate)});
  }
  r.inputs = {in};
  r.outputs = {out};
  return {std::move(r), {m[0].dtype}};
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
  if (a.ints.size() < 4)
    throw std::invalid_argument("slice_backward: needs dim, start, end, step, sizes");
  const std::vector<int64_t> sizes(a.ints.begin() + 4, a.ints.end());
  Rule r = slice_rule(sizes, a.ints[0], a.ints[1], a.ints[2], a.ints[3]);
  if (r.output_shape(0) != m[0].shape)
    throw std::invalid_argument("slice_backward: grad does not fit the slice");
  std::swap(r.inputs[0], r.outputs[0]);
  return same_dtype(std::move(r), m);
}

// select_backward(grad, input_sizes, dim, index): ints: dim, input_sizes...
BuiltRule select_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "select_backward");
  if (a.ints.empty()) throw std::invalid_argument("select_backward: needs dim, sizes");
  const std::vector<int64_t> sizes(a.ints.begin() + 1, a.ints.end());
  Rule r = select_rule(sizes, a.ints[0]);
  if (r.output_shape(0) != m[0].shape)
    throw std::invalid_argument("select_backward: grad does not fit the selection");
  std::swap(r.inputs[0], r.outputs[0]);
  return same_dtype(std::move(r), m);
}

// scatter_add / scatter.src (self, index, src) and index_add (self, index, source): ints: dim.
// Along `dim` everything stays whole; other dims shard together where their sizes agree.
BuiltRule scatter_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 3, 3, "scatter");
  const auto &s = m[0].shape, &ix = m[1].shape, &src = m[2].shape;
  if (ix.size() != s.size() || src.size() != s.size()) {
    throw std::invalid_argument("scatter: self, index and src need the same number of dims");
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
  const auto &s = m[0].shape, &src = m[2].shape;
  const int64_t d = normalize_tensor_dim(arg(a, 0, "index_add", "dim"), s.size(), "index_add dim");
  if (src.size() != s.size() || m[1].shape.size() > 1) {
    throw std::invalid_argument("index_add: source must have self's dims and index must be 1-D");
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
      throw std::invalid_argument("index_add: source and self differ outside dim");
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
    throw std::invalid_argument("value_selecting_reduction_backward: needs dim, keepdim, sizes");
  const std::vector<int64_t> sizes(a.ints.begin() + 2, a.ints.end());
  Rule r =
      reduction_rule(sizes, {a.ints[0]}, a.ints[1] != 0, ReduceOp::kMax, true, Linearity::kNone);
  if (r.output_shape(0) != m[0].shape || m[1].shape != m[0].shape) {
    throw std::invalid_argument(
        "value_selecting_reduction_backward: grad/indices do not fit sizes");
  }
  Rule b = r;
  b.inputs = {r.outputs[0], r.outputs[0]};
  b.outputs = {r.inputs[0]};
  return {std::move(b), {m[0].dtype}};
}

}  // namespace dtensor::sharding::builders
