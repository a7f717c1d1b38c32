// The rule builders of the op table (op_registry.cc): one per op family, each turning the
// input metas and layout arguments into a Rule and output dtypes. The table names them; this file
// says how each family maps dims: pointwise, reduction, softmax, view, matmul, cat and slicing
// here, plus the shared helpers; indexing, embedding, norms, losses, attention, factories and
// backward ops in op_builders_nn.cc.

#include "sharding_prop/op_builders.h"

#include <ATen/ceil_div.h>
#include <c10/core/DeviceType.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "base/error.h"

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
    throw Error(std::string(op) + ": expected " + std::to_string(lo) +
                (lo == hi ? "" : "-" + std::to_string(hi)) + " tensor inputs, got " +
                std::to_string(m.size()));
  }
}

int64_t arg(const LayoutArgs& a, size_t i, const char* op, const char* what) {
  if (i >= a.ints.size()) {
    throw Error(std::string(op) + ": layout argument '" + what + "' missing");
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

// log_sigmoid_forward(self) -> (output, buffer): ints: self's device type. The CPU kernel's
// buffer is elementwise too; CUDA's is empty (its backward recomputes instead), so its output
// metadata is the rule's (no ATen meta kernel knows the device).
BuiltRule log_sigmoid_forward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "log_sigmoid_forward");
  Rule r = pointwise_rule(shapes_of(m), Linearity::kNone);
  const bool cuda =
      arg(a, 0, "log_sigmoid_forward", "device") == static_cast<int64_t>(c10::DeviceType::CUDA);
  r.outputs.push_back(cuda ? TensorFactors{r.add_dim(0, FactorKind::kReplicate)} : r.outputs[0]);
  r.metadata_from_rule = true;
  return {std::move(r), {m[0].dtype, m[0].dtype}};
}

// log_sigmoid_backward(grad_output, self, buffer): elementwise; a CUDA forward's empty buffer
// (never read) stays whole.
BuiltRule log_sigmoid_backward_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 3, 3, "log_sigmoid_backward");
  const bool empty_buffer = m[2].shape == std::vector<int64_t>{0} && m[1].numel() != 0;
  Rule r = pointwise_rule(empty_buffer ? Shapes{m[0].shape, m[1].shape} : shapes_of(m),
                          Linearity::kNone);
  if (empty_buffer) r.inputs.push_back({r.add_dim(0, FactorKind::kReplicate)});
  return {std::move(r), {promoted(m)}};
}

// polar(abs, angle) / complex(real, imag): elementwise, complex results (neither has a C++ meta
// kernel in torch 1.13, so the rule states the dtype).
BuiltRule to_complex_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 2, 2, "polar/complex");
  return {pointwise_rule(shapes_of(m), Linearity::kNone), {c10::toComplexType(promoted(m))}};
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

// Ops that keep their input's shape and work along some dims, which must stay whole (cumsum's
// dim, sort's dim, flip's dims): ints: those dims (none: every dim, as roll without dims);
// `last_dims` > 0 instead names the input's last dims (tril/triu: the matrix dims). `outputs`
// outputs of the input's shape (sort, cummax: values and indices). Further inputs broadcast
// with the first (cummaxmin_backward's grad, input, indices).
RuleBuilder along_dims(size_t outputs, size_t last_dims) {
  return [=](const Metas& m, const LayoutArgs& a) {
    need_inputs(m, 1, 3, "along_dims");
    const int64_t ndim = m[0].ndim();
    std::vector<int64_t> dims = a.ints;
    if (last_dims > 0) {
      dims.clear();
      for (int64_t d = std::max<int64_t>(0, ndim - static_cast<int64_t>(last_dims)); d < ndim; ++d)
        dims.push_back(d);
    } else if (dims.empty()) {
      for (int64_t d = 0; d < ndim; ++d) dims.push_back(d);
    }
    if (ndim == 0) dims.clear();  // a 0-dim tensor: dim 0 and -1 name the one element
    BuiltRule b{replicate_dims_rule(shapes_of(m), dims, outputs), {m[0].dtype}};
    while (b.out_dtypes.size() < outputs) b.out_dtypes.push_back(c10::kLong);
    return b;
  };
}

// constant_pad_nd(self, pad, value): ints: pad (low, high per dim, from the last dim back). A
// dim the pad list covers must be whole; the others pass through.
BuiltRule constant_pad_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "constant_pad_nd");
  const std::vector<int64_t>& shape = m[0].shape;
  const int64_t ndim = m[0].ndim();
  if (a.ints.size() % 2 != 0 || static_cast<int64_t>(a.ints.size() / 2) > ndim)
    throw Error("constant_pad_nd: pad must have an even length of at most 2 x ndim");
  Rule r;
  TensorFactors in, out;
  for (int64_t d = 0; d < ndim; ++d) {
    const int64_t k = ndim - 1 - d;  // pad pairs run from the last dim
    // Every dim the pad list covers stays whole, zero pads included: ATen refuses an empty
    // input dim that the list covers, and a rank's piece may be empty where the tensor is not.
    const bool padded = 2 * k + 1 < static_cast<int64_t>(a.ints.size());
    if (!padded) {
      const DimFactors f = r.add_dim(shape[d]);
      in.push_back(f);
      out.push_back(f);
      continue;
    }
    const int64_t size = shape[d] + a.ints[2 * k] + a.ints[2 * k + 1];
    if (size < 0) throw Error("constant_pad_nd: padding makes a negative size");
    in.push_back(shape[d] <= 1 ? DimFactors{}
                               : DimFactors{r.add_factor(shape[d], FactorKind::kReplicate)});
    out.push_back(r.add_dim(size, FactorKind::kReplicate));
  }
  r.inputs = {in};
  r.outputs = {out};
  return {std::move(r), {m[0].dtype}};
}

// _fft_r2c(self, dim, normalization, onesided) / _fft_c2r(self, dim, normalization,
// last_dim_size): ints: the transformed dims, then onesided / last_dim_size. The transformed dims
// stay whole, the batch dims pass; the last transformed dim changes size (n/2+1 one-sided; the
// given size back to real).
RuleBuilder fft_of(bool real_to_complex) {
  return [=](const Metas& m, const LayoutArgs& a) {
    need_inputs(m, 1, 1, real_to_complex ? "_fft_r2c" : "_fft_c2r");
    if (a.ints.size() < 2) throw Error("_fft: needs the transformed dims");
    const std::vector<int64_t> dims(a.ints.begin(), a.ints.end() - 1);
    Rule r = replicate_dims_rule(shapes_of(m), dims);
    const int64_t last = normalize_tensor_dim(dims.back(), m[0].ndim(), "fft dim");
    const int64_t n = m[0].shape[last];
    const int64_t size = real_to_complex ? (a.ints.back() != 0 ? n / 2 + 1 : n) : a.ints.back();
    r.outputs[0][last] = r.add_dim(size, FactorKind::kReplicate);
    return BuiltRule{
        std::move(r),
        {real_to_complex ? c10::toComplexType(m[0].dtype) : c10::toRealValueType(m[0].dtype)}};
  };
}

// A fixed einsum-like rule (rule.h's text form): dot "k,k->", mv "mk,k->m". The dtype is the
// inputs' promotion (ATen's meta kernel decides in the end).
RuleBuilder from_text(const char* rule_text, Linearity lin) {
  return [=](const Metas& m, const LayoutArgs&) {
    return BuiltRule{parse_rule(rule_text, shapes_of(m), lin), {promoted(m)}};
  };
}

// diagonal(self, offset, dim1, dim2): ints: offset, dim1, dim2. dim1 and dim2 stay whole and
// leave the output; the diagonal is its new last dim; the other dims pass, in order.
BuiltRule diagonal_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "diagonal");
  const int64_t ndim = m[0].ndim();
  const int64_t offset = arg(a, 0, "diagonal", "offset");
  const int64_t d1 = normalize_tensor_dim(arg(a, 1, "diagonal", "dim1"), ndim, "diagonal dim1");
  const int64_t d2 = normalize_tensor_dim(arg(a, 2, "diagonal", "dim2"), ndim, "diagonal dim2");
  if (d1 == d2) throw Error("diagonal: dim1 and dim2 must differ");
  Rule r = replicate_dims_rule(shapes_of(m), {d1, d2});
  TensorFactors out;
  for (int64_t d = 0; d < ndim; ++d)
    if (d != d1 && d != d2) out.push_back(r.inputs[0][d]);
  const int64_t s1 = m[0].shape[d1], s2 = m[0].shape[d2];
  const int64_t size =
      std::max<int64_t>(0, offset >= 0 ? std::min(s1, s2 - offset) : std::min(s1 + offset, s2));
  out.push_back(r.add_dim(size, FactorKind::kReplicate));
  r.outputs = {out};
  r.linearity = Linearity::kMove;
  return {std::move(r), {m[0].dtype}};
}

// diagonal_backward(grad, input_sizes, offset, dim1, dim2): diagonal's rule on the forward's
// input, inputs and outputs swapped (the grad is the diagonal; the other dims pass, dim1 and dim2
// stay whole). ints: input_sizes..., offset, dim1, dim2.
BuiltRule diagonal_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "diagonal_backward");
  if (a.ints.size() < 3) throw Error("diagonal_backward: needs input_sizes, offset, dim1, dim2");
  const auto dims = a.ints.end() - 3;
  const Metas input = {TensorMeta::make(std::vector<int64_t>(a.ints.begin(), dims), m[0].dtype)};
  LayoutArgs forward;
  forward.ints.assign(dims, a.ints.end());
  BuiltRule b = diagonal_of(input, forward);
  if (b.rule.output_shape(0) != m[0].shape)
    throw Error("diagonal_backward: the grad does not fit the diagonal of input_sizes");
  std::swap(b.rule.inputs[0], b.rule.outputs[0]);
  return b;
}

// Pooling, upsampling and padding over the last `spatial_dims` dims of [batch, channel,
// spatial...] tensors: the batch dim passes through (every tensor input and output shares the
// leading dims: a backward's grad, input and indices), the others stay whole, and the outputs'
// spatial sizes come from ATen (Rule::whole_output_sizes_from_aten). Outputs after the first are
// indices (max pooling).
RuleBuilder spatial(size_t spatial_dims, size_t outputs) {
  return [=](const Metas& m, const LayoutArgs&) {
    need_inputs(m, 1, 3, "spatial op");
    const int64_t nd = m[0].ndim(), lead = nd - static_cast<int64_t>(spatial_dims);
    if (lead < 0) throw Error("spatial op: the input has fewer dims than the op's spatial dims");
    Rule r;
    r.whole_output_sizes_from_aten = true;
    // Only the batch dim of a batched input passes: ATen's kernels refuse a piece with no
    // channels ("non-empty ... expected"), which an uneven split of the channel dim leaves on some
    // rank, but accept an empty batch.
    TensorFactors leading;
    for (int64_t d = 0; d < lead; ++d) {
      const int64_t size = m[0].shape[d];
      const bool passes = d == 0 && lead >= 2;
      leading.push_back(r.add_dim(size, passes ? FactorKind::kPass : FactorKind::kReplicate));
    }
    auto whole = [&](int64_t size) {
      return size <= 1 ? DimFactors{} : DimFactors{r.add_factor(size, FactorKind::kReplicate)};
    };
    for (const TensorMeta& t : m) {
      TensorFactors f;
      for (int64_t d = 0; d < t.ndim(); ++d) {
        const bool shared = d < lead && t.ndim() == nd && t.shape[d] == m[0].shape[d];
        f.push_back(shared ? leading[d] : whole(t.shape[d]));
      }
      r.inputs.push_back(std::move(f));
    }
    BuiltRule b{std::move(r), {}};
    for (size_t o = 0; o < outputs; ++o) {
      TensorFactors f = leading;
      for (int64_t d = lead; d < nd; ++d)
        f.push_back({b.rule.add_factor(2, FactorKind::kReplicate)});
      b.rule.outputs.push_back(std::move(f));
      b.out_dtypes.push_back(o == 0 ? m[0].dtype : c10::kLong);
    }
    return b;
  };
}

// view_as_real(complex [..]) -> real [.., 2]: the new last dim is whole; view_as_complex, back.
BuiltRule view_as_real_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 1, 1, "view_as_real");
  Rule r = pointwise_rule(shapes_of(m), Linearity::kMove);
  r.outputs[0].push_back({r.add_factor(2, FactorKind::kReplicate)});
  return {std::move(r), {c10::toRealValueType(m[0].dtype)}};
}

BuiltRule view_as_complex_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 1, 1, "view_as_complex");
  if (m[0].ndim() == 0 || m[0].shape.back() != 2)
    throw Error("view_as_complex: the last dim must have size 2");
  Rule r = replicate_dims_rule(shapes_of(m), {-1});
  r.outputs[0].pop_back();
  r.linearity = Linearity::kMove;
  return {std::move(r), {c10::toComplexType(m[0].dtype)}};
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
  if (m[0].shape.size() > 2) throw Error("t: expects a tensor of at most 2 dims");
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
    throw Error("mm: both arguments must be 2-D");
  }
  return {matmul_rule(m[0].shape, m[1].shape), {promoted(m)}};
}

BuiltRule bmm_rule(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 2, 2, "bmm");
  if (m[0].shape.size() != 3 || m[1].shape.size() != 3 || m[0].shape[0] != m[1].shape[0]) {
    throw Error("bmm: arguments must be 3-D with equal batch sizes");
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

// addmv(bias, mat, vec): addmm with a vector. ATen's addmv returns the bias's shape for an empty
// matrix (a bias [1] stays [1]), so the rows shard only evenly (no rank's piece is empty).
BuiltRule addmv_of(const Metas& m, const LayoutArgs& a) {
  BuiltRule b = addmm_rule_of(m, a);
  for (const int f : b.rule.outputs[0].empty() ? DimFactors{} : b.rule.outputs[0][0]) {
    b.rule.factors[f].even_only = true;
  }
  return b;
}

// addbmm(bias [m, n], b1 [b, m, k], b2 [b, k, n]): the batch and k contract; the bias joins the
// Partial sum on one rank (as addmm's).
BuiltRule addbmm_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 3, 3, "addbmm");
  const Rule product = parse_rule("bmk,bkn->mn", {m[1].shape, m[2].shape}, Linearity::kMultilinear);
  return {with_bias(product, m[0].shape, "addbmm"), {promoted(m)}};
}

// addr(bias, vec1, vec2): the outer product passes both vector dims; the bias broadcasts in.
BuiltRule addr_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 3, 3, "addr");
  const Rule product = parse_rule("m,n->mn", {m[1].shape, m[2].shape}, Linearity::kNone);
  return {with_bias(product, m[0].shape, "addr"), {promoted(m)}};
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
  if (size <= 0) throw Error("split: split_size must be positive");
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
  if (chunks <= 0) throw Error("chunk: chunks must be positive");
  const int64_t n = m[0].shape[d], size = at::ceil_div(n, chunks);
  return split_of(m, LayoutArgs{{std::max<int64_t>(size, 1), d}, ""});
}

}  // namespace dtensor::sharding::builders
