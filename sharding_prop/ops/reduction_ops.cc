// Reductions (sum, mean, prod, max/min, arg*, var/std, norms, any/all, logsumexp, histc, renorm),
// paired reductions, count_nonzero and softmax; and, as they reduce or select along dims that
// stay whole, the scans, sorts and selections (cumsum, cummax, sort, topk, kthvalue, median, mode).

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "sharding_prop/ops/family.h"

namespace dtensor::sharding::ops {
namespace {

// ints: keepdim, dims... (no dims: all).
RuleBuilder reduction(ReduceOp op, bool replicate, Linearity lin, int out_dtype = -1,
                      int outputs = 1) {
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

// A reduction by a norm's order (kNormOrd's two ints `op` and `bits`), as vector_norm_of says.
RuleBuilder norm_reduction(int64_t op, int64_t bits) {
  return [=](const Metas& m, const LayoutArgs& a) {
    if (op < 0) return reduction(ReduceOp::kSum, true, Linearity::kNone)(m, a);
    const auto reduce = static_cast<ReduceOp>(op);
    BuiltRule b = reduction(reduce, false, Linearity::kNone)(m, a);
    if (reduce == ReduceOp::kNorm) {
      float p = 0;
      const auto b32 = static_cast<int32_t>(bits);
      std::memcpy(&p, &b32, sizeof p);
      for (Factor& f : b.rule.factors) f.norm = p;
      b.rule.linearity = Linearity::kNorm;
      b.rule.norm = p;
    }
    return b;
  };
}

// linalg_vector_norm(self, ord, dim, keepdim): ints: the order as LayoutArg::kNormOrd's two
// ints, keepdim, dims. A sharded reduced dim leaves the Partial its pieces reduce by, as
// PyTorch's: sum for ord 0 (a count of nonzeros) and 1 (a sum of |x|), max for inf, min for
// -inf, Partial(norm p) for other p > 0 (NOTE [p-norm Partial]); an input already
// Partial(norm p) stays so under a norm of the same order. Other orders keep the reduced dims
// whole.
BuiltRule vector_norm_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "linalg_vector_norm");
  DTENSOR_CHECK(a.ints.size() >= 2, "linalg_vector_norm: the order's two layout ints are missing");
  const LayoutArgs rest{std::vector<int64_t>(a.ints.begin() + 2, a.ints.end()), a.text, a.call};
  return norm_reduction(a.ints[0], a.ints[1])(m, rest);
}

// dist(self, other, p): ints: p as LayoutArg::kNormOrd's two ints. The p-norm of the broadcast
// self - other over every dim: a sharded dim leaves the Partial of p's order (vector_norm_of),
// as PyTorch's; orders without one keep every dim whole.
BuiltRule dist_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 2, "dist");
  DTENSOR_CHECK(a.ints.size() == 2, "dist: the order's two layout ints are missing");
  Rule rule = pointwise_rule(shapes_of(m), Linearity::kNone);
  float p = 0;
  const auto bits = static_cast<int32_t>(a.ints[1]);
  std::memcpy(&p, &bits, sizeof p);
  for (Factor& f : rule.factors) {
    f.kind = a.ints[0] < 0 ? FactorKind::kReplicate : FactorKind::kContract;
    f.reduce = a.ints[0] < 0 ? ReduceOp::kSum : static_cast<ReduceOp>(a.ints[0]);
    f.norm = p;
  }
  rule.outputs[0].clear();  // a 0-dim result
  return BuiltRule{std::move(rule), {m[0].dtype}};
}

// ints: dim (softmax) / dim (its backward, two inputs).
RuleBuilder softmax(size_t n) {
  return [=](const Metas& m, const LayoutArgs& a) {
    need_inputs(m, n, n, "softmax");
    return BuiltRule{replicate_dims_rule(shapes_of(m), {arg(a, 0, "softmax", "dim")}),
                     {m.back().dtype}};
  };
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

// var_mean / std_mean (real_first: the first output is real for a complex input) and aminmax:
// two outputs of the reduced shape and the input's dtype; the reduced dims stay whole.
RuleBuilder paired_reduction(bool real_first) {
  const RuleBuilder base = reduction(ReduceOp::kSum, true, Linearity::kNone, -1, 2);
  return [=](const Metas& m, const LayoutArgs& a) {
    BuiltRule b = base(m, a);
    b.out_dtypes = {real_first ? c10::toRealValueType(m[0].dtype) : m[0].dtype, m[0].dtype};
    return b;
  };
}

// count_nonzero(self, dim): ints: dims (none: all). Counts of pieces add: a sharded counted dim
// leaves the int64 output Partial(sum).
BuiltRule count_nonzero_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "count_nonzero");
  return {reduction_rule(m[0].shape, a.ints, false, ReduceOp::kSum, false, Linearity::kNone),
          {c10::kLong}};
}

// renorm(self, p, dim, maxnorm): ints: dim. Each slice along `dim` is scaled by its norm over
// the other dims, which stay whole; `dim` passes.
BuiltRule renorm_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "renorm");
  if (m[0].ndim() < 2) throw Error("renorm: needs at least 2 dims");
  const int64_t d = dim_arg(a, 0, m[0].ndim(), "renorm");
  std::vector<int64_t> others;
  for (int64_t k = 0; k < m[0].ndim(); ++k) {
    if (k != d) others.push_back(k);
  }
  return {replicate_dims_rule(shapes_of(m), others), {m[0].dtype}};
}

// topk(self, k, dim, ...): ints: k, dim. The dim stays whole and holds k values in the outputs
// (values, int64 indices); the other dims pass.
BuiltRule topk_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "topk");
  if (m[0].ndim() == 0) {
    BuiltRule b = on_scalar_self(m);
    b.rule.outputs.push_back(b.rule.outputs[0]);
    b.out_dtypes.push_back(c10::kLong);
    return b;
  }
  const int64_t k = arg(a, 0, "topk", "k");
  const int64_t d = dim_arg(a, 1, m[0].ndim(), "topk");
  Rule r;
  TensorFactors in, out;
  for (int64_t i = 0; i < m[0].ndim(); ++i) {
    if (i == d) {
      in.push_back(r.add_dim(m[0].shape[i], FactorKind::kReplicate));
      out.push_back(r.add_dim(k, FactorKind::kReplicate));
    } else {
      const DimFactors f = r.add_dim(m[0].shape[i]);
      in.push_back(f);
      out.push_back(f);
    }
  }
  r.inputs = {in};
  r.outputs = {out, out};
  return {std::move(r), {m[0].dtype, c10::kLong}};
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

void add_reductions(Adder& add) {
  add("aten::sum", "reduction", {}, reduction(ReduceOp::kSum, false, Linearity::kAdditive));
  add("aten::sum.dim_IntList", "reduction", reduce_args(),
      reduction(ReduceOp::kSum, false, Linearity::kAdditive));
  add("aten::mean", "reduction", {}, reduction(ReduceOp::kAvg, false, Linearity::kAdditive));
  add("aten::mean.dim", "reduction", reduce_args(),
      reduction(ReduceOp::kAvg, false, Linearity::kAdditive));
  add("aten::prod", "reduction", {}, reduction(ReduceOp::kProduct, false, lin));
  add("aten::prod.dim_int", "reduction", reduce_args(), reduction(ReduceOp::kProduct, false, lin));
  add("aten::amax", "reduction", reduce_args(), reduction(ReduceOp::kMax, false, Linearity::kMax));
  add("aten::amin", "reduction", reduce_args(), reduction(ReduceOp::kMin, false, Linearity::kMin));
  add("aten::max", "reduction", {}, reduction(ReduceOp::kMax, false, Linearity::kMax));
  add("aten::min", "reduction", {}, reduction(ReduceOp::kMin, false, Linearity::kMin));
  add("aten::max.dim", "reduction", reduce_args(), reduction(ReduceOp::kMax, true, lin, -1, 2));
  add("aten::min.dim", "reduction", reduce_args(), reduction(ReduceOp::kMin, true, lin, -1, 2));
  add("aten::argmax", "reduction", reduce_args(),
      reduction(ReduceOp::kMax, true, lin, static_cast<int>(c10::kLong)));
  add("aten::argmin", "reduction", reduce_args(),
      reduction(ReduceOp::kMin, true, lin, static_cast<int>(c10::kLong)));
  add("aten::var.correction", "reduction", reduce_args(), reduction(ReduceOp::kSum, true, lin));
  add("aten::std.correction", "reduction", reduce_args(), reduction(ReduceOp::kSum, true, lin));
  add("aten::linalg_vector_norm", "reduction",
      {norm_ord_arg("ord"), int_arg("keepdim"), ints_arg("dim")}, vector_norm_of);
  add("aten::dist", "reduction", {norm_ord_arg("p")}, dist_of);
  // sum(|x|^ord) (clip_grad_norm_'s partial norms): a sum of pieces whatever the order.
  add("aten::linalg__powsum", "reduction", reduce_args(), reduction(ReduceOp::kSum, false, lin));
  add("aten::any.dim", "reduction", reduce_args(),
      reduction(ReduceOp::kMax, true, lin, static_cast<int>(c10::kBool)));
  add("aten::all.dim", "reduction", reduce_args(),
      reduction(ReduceOp::kMin, true, lin, static_cast<int>(c10::kBool)));
  add("aten::any", "reduction", {},
      reduction(ReduceOp::kMax, true, lin, static_cast<int>(c10::kBool)));
  add("aten::all", "reduction", {},
      reduction(ReduceOp::kMin, true, lin, static_cast<int>(c10::kBool)));
  // p-norms and log-sum-exp over dims: the reduced dims stay whole. nansum is a sum of pieces.
  add("aten::norm.Scalar", "reduction", {}, reduction(ReduceOp::kSum, true, lin));
  add("aten::norm.ScalarOpt_dim", "reduction", reduce_args(), reduction(ReduceOp::kSum, true, lin));
  add("aten::norm.ScalarOpt_dim_dtype", "reduction", reduce_args(),
      reduction(ReduceOp::kSum, true, lin));
  add("aten::logsumexp", "reduction", reduce_args(), reduction(ReduceOp::kSum, true, lin));
  add("aten::nansum", "reduction", reduce_args(), reduction(ReduceOp::kSum, false, lin));
  add("aten::histc", "reduction", {int_arg("bins"), equal_args("min", "max")}, histc_of);
  add("aten::renorm", "reduction", {int_arg("dim")}, renorm_of);
  add("aten::renorm_", "reduction", {int_arg("dim")}, renorm_of);
  // Softmax: ints = dim.
  add("aten::_softmax", "softmax", {int_arg("dim")}, softmax(1));
  add("aten::_log_softmax", "softmax", {int_arg("dim")}, softmax(1));
  // SDPA's math path: softmax with fully masked rows 0 instead of NaN.
  add("aten::_safe_softmax", "softmax", {int_arg("dim")}, softmax(1));
  add("aten::_softmax_backward_data", "softmax", {int_arg("dim")}, softmax(2));
  add("aten::_log_softmax_backward_data", "softmax", {int_arg("dim")}, softmax(2));
}

// Values and indices along one dim (whole), or over the whole tensor; and paired reductions.
void add_selections(Adder& add) {
  const RuleBuilder select_dim = reduction(ReduceOp::kMax, true, lin, -1, 2);
  for (const char* op : {"kthvalue", "median.dim", "nanmedian.dim", "mode"}) {
    add(std::string("aten::") + op, "reduction", reduce_args(), select_dim);
  }
  for (const char* op : {"median", "nanmedian"}) {
    add(std::string("aten::") + op, "reduction", {}, reduction(ReduceOp::kMax, true, lin));
  }
  add("aten::topk", "scan", {int_arg("k"), int_arg("dim")}, topk_of);
  add("aten::var_mean.correction", "reduction", reduce_args(), paired_reduction(true));
  add("aten::std_mean.correction", "reduction", reduce_args(), paired_reduction(true));
  add("aten::aminmax", "reduction", reduce_args(), paired_reduction(false));
  add("aten::count_nonzero.dim_IntList", "reduction", {ints_arg("dim")}, count_nonzero_of);
  add("aten::count_nonzero", "reduction", {ints_arg("dim")}, count_nonzero_of);
  for (const auto& [functional, out] :
       std::vector<std::pair<const char*, const char*>>{{"kthvalue", "kthvalue.values"},
                                                        {"median.dim", "median.dim_values"},
                                                        {"nanmedian.dim", "nanmedian.dim_values"},
                                                        {"mode", "mode.values"},
                                                        {"topk", "topk.values"},
                                                        {"aminmax", "aminmax.out"}}) {
    add.out_of(std::string("aten::") + functional, std::string("aten::") + out);
  }
}

// Scans and sorts that work along some dims: those dims stay whole, the others pass.
void add_scans(Adder& add) {
  for (const char* op : {"cumsum", "cumsum_", "cumprod", "cumprod_", "logcumsumexp"}) {
    add(std::string("aten::") + op, "scan", {int_arg("dim")}, along_dims(1));
  }
  for (const char* op : {"cummax", "cummin", "sort"}) {  // values and indices
    add(std::string("aten::") + op, "scan", {int_arg("dim")}, along_dims(2));
  }
  add("aten::sort.stable", "scan", {int_arg("dim")}, along_dims(2));
  // The backward of max.dim/sort/topk/kthvalue/mode/median and of cummax/cummin: ATen's
  // decompositions scatter into a plain at::zeros, so the engine runs them (run_composite).
  add("aten::value_selecting_reduction_backward", "reduction",
      {int_arg("dim"), int_arg("keepdim"), ints_arg("sizes")}, value_selecting_backward_of,
      local_shape("sizes"));
  add.entries.back().run_composite = true;
  add("aten::cummaxmin_backward", "scan", {int_arg("dim")}, along_dims(1));
  add.entries.back().run_composite = true;
}

void add_out_overloads(Adder& add) {
  // `.out` overloads (the out tensor is not an input).
  add("aten::sum.IntList_out", "reduction", reduce_args(),
      reduction(ReduceOp::kSum, false, Linearity::kAdditive));
  add("aten::mean.out", "reduction", reduce_args(),
      reduction(ReduceOp::kAvg, false, Linearity::kAdditive));
  // The out= overloads of entries above: each the same entry under its out name.
  // clang-format off
  const std::vector<std::pair<const char*, const char*>> outs = {
      {"cumsum", "cumsum.out"},
      {"cumprod", "cumprod.out"},
      {"logcumsumexp", "logcumsumexp.out"},
      {"cummax", "cummax.out"},
      {"cummin", "cummin.out"},
      {"sort", "sort.values"},
      {"sort.stable", "sort.values_stable"},
      {"norm.Scalar", "norm.Scalar_out"},
      {"logsumexp", "logsumexp.out"},
      {"nansum", "nansum.out"},
      {"amax", "amax.out"},
      {"amin", "amin.out"},
      {"argmax", "argmax.out"},
      {"argmin", "argmin.out"},
      {"var.correction", "var.correction_out"},
      {"std.correction", "std.correction_out"},
      {"linalg_vector_norm", "linalg_vector_norm.out"},
      {"_softmax", "_softmax.out"},
      {"_log_softmax", "_log_softmax.out"},
  };
  // clang-format on
  for (const auto& [functional, out] : outs) {
    add.out_of(std::string("aten::") + functional, std::string("aten::") + out);
  }
}

}  // namespace

void add_reduction_ops(Adder& add) {
  add_reductions(add);
  add_selections(add);
  add_scans(add);
  add_out_overloads(add);
}

}  // namespace dtensor::sharding::ops
