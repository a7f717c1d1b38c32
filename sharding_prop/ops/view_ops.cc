// Views and reshapes (view, reshape, flatten, squeeze, unsqueeze, transpose, t, permute, expand,
// diagonal, view_as_real/complex) and slicing and splitting (slice, narrow, select, split, chunk,
// unbind), with their `_copy` forms and backward ops; and as_strided, which is refused.

#include <ATen/ceil_div.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "sharding_prop/ops/family.h"

namespace dtensor::sharding::ops {
namespace {

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

// ints: dim (squeeze.dim) or nothing (squeeze: every size-1 dim). Each kept dim is the input
// dim it was, size-1 ones included (ATen's squeeze keeps their order): a Shard on a kept size-1
// dim stays; a squeezed dim's factor is never sharded, so a Shard there is gathered first.
// An empty tensor's dims stay whole, as the reshape rule keeps them (a factor of size 0 would
// be divided by).
FactorKind empty_or(const std::vector<int64_t>& shape, FactorKind kind) {
  for (int64_t size : shape) {
    if (size == 0) return FactorKind::kReplicate;
  }
  return kind;
}

BuiltRule squeeze_rule(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "squeeze");
  const auto& s = m[0].shape;
  const int64_t d =
      a.ints.empty() || s.empty() ? -1 : normalize_tensor_dim(a.ints[0], s.size(), "squeeze dim");
  const FactorKind kept = empty_or(s, FactorKind::kPass);
  Rule r;
  r.linearity = Linearity::kMove;
  TensorFactors in, out;
  for (int64_t k = 0; k < static_cast<int64_t>(s.size()); ++k) {
    if (s[k] == 1 && (d < 0 || k == d)) {
      in.push_back(r.add_dim(1, FactorKind::kReplicate));
      continue;
    }
    in.push_back(r.add_dim(s[k], kept));
    out.push_back(in.back());
  }
  r.inputs = {in};
  r.outputs = {out};
  return same_dtype(std::move(r), m);
}

// ints: dim. Every input dim keeps its factor at its shifted place (size-1 ones included, as
// ATen's unsqueeze moves them); the new dim has none.
BuiltRule unsqueeze_rule(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "unsqueeze");
  const auto& s = m[0].shape;
  const int64_t d =
      normalize_tensor_dim(arg(a, 0, "unsqueeze", "dim"), s.size() + 1, "unsqueeze dim");
  const FactorKind kind = empty_or(s, FactorKind::kPass);
  Rule r;
  r.linearity = Linearity::kMove;
  TensorFactors in;
  for (int64_t size : s) in.push_back(r.add_dim(size, kind));
  TensorFactors out = in;
  out.insert(out.begin() + d, DimFactors{});
  r.inputs = {in};
  r.outputs = {out};
  return same_dtype(std::move(r), m);
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

// unbind(self, dim): ints: dim. One output per index of the whole dim, each without it.
BuiltRule unbind_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "unbind");
  if (m[0].ndim() == 0)
    throw Error("unbind: dimension specified as 0 but tensor has no dimensions");
  const int64_t d = dim_arg(a, 0, m[0].ndim(), "unbind");
  Rule r = select_rule(m[0].shape, d);
  const Rule one = r;
  r.outputs.assign(static_cast<size_t>(m[0].shape[d]), one.outputs[0]);
  return {std::move(r), std::vector<c10::ScalarType>(m[0].shape[d], m[0].dtype)};
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

void add_views(Adder& add) {
  // Views, reshapes, slicing and splitting.
  // view runs as a view of the piece as the output's local shape (kViewAsLocal), unboxed: the
  // boxed call with localized sizes cost ~2k of a view's ~12k instructions per call.
  add("aten::view", "view", {ints_arg("size")}, view_rule, same_shape, Execution::kViewAsLocal);
  add("aten::reshape", "view", {ints_arg("shape")}, view_rule, local_shape("shape"));
  add("aten::_unsafe_view", "view", {ints_arg("size")}, view_rule, local_shape("size"));
  add("aten::_reshape_alias", "view", {ints_arg("size")}, view_rule, local_shape("size"),
      Execution::kReshapeByLocal);
  add("aten::flatten.using_ints", "view", {int_arg("start_dim"), int_arg("end_dim")}, flatten_rule);
  add("aten::unflatten.int", "view", {int_arg("dim"), ints_arg("sizes")}, unflatten_rule,
      local_shape("sizes", LocalShapeArg::Kind::kUnflatten));
  // A piece may have a size-1 dim the global tensor has not (5 rows over 4 ranks: 2,2,1,0), so
  // squeeze views the piece as the output's local shape instead of squeezing it.
  add("aten::squeeze", "view", {}, squeeze_rule, same_shape, Execution::kViewAsLocal);
  add("aten::squeeze.dim", "view", {int_arg("dim")}, squeeze_rule, same_shape,
      Execution::kViewAsLocal);
  add("aten::unsqueeze", "view", {int_arg("dim")}, unsqueeze_rule);
  add("aten::transpose.int", "view", {int_arg("dim0"), int_arg("dim1")}, transpose_rule);
  add("aten::t", "view", {}, t_rule);
  add("aten::permute", "view", {ints_arg("dims")}, permute_rule_of);
  add("aten::expand", "view", {ints_arg("size")}, expand_rule_of, local_shape("size"));
  add("aten::slice.Tensor", "view",
      {int_arg("dim"), int_arg("start", 0), int_arg("end", std::numeric_limits<int64_t>::max()),
       int_arg("step")},
      slice_of);
  add("aten::narrow", "view", {int_arg("dim"), int_arg("start"), int_arg("length")}, narrow_of);
  add("aten::narrow_copy", "view", {int_arg("dim"), int_arg("start"), int_arg("length")},
      narrow_of);
  add("aten::select.int", "view", {int_arg("dim")}, select_of);
  add("aten::split.Tensor", "view", {int_arg("split_size"), int_arg("dim")}, split_of);
  add("aten::split_with_sizes", "view", {int_arg("dim"), ints_arg("split_sizes")}, split_sizes_of);
  add("aten::chunk", "view", {int_arg("chunks"), int_arg("dim")}, chunk_of);
  add("aten::unbind.int", "view", {int_arg("dim")}, unbind_of);
  add("aten::slice_backward", "view",
      {int_arg("dim"), int_arg("start"), int_arg("end"), int_arg("step"), ints_arg("input_sizes")},
      slice_backward_of, local_shape("input_sizes"), Execution::kSliceBackwardAtOffset);
  add("aten::select_backward", "view", {int_arg("dim"), ints_arg("input_sizes")},
      select_backward_of, local_shape("input_sizes"));
  add("aten::view_as_real", "view", {}, view_as_real_of);
  add("aten::diagonal", "view", {int_arg("offset"), int_arg("dim1"), int_arg("dim2")}, diagonal_of);
  add("aten::view_as_complex", "view", {}, view_as_complex_of);
  add("aten::_conj", "view", {}, pointwise(1, Linearity::kAdditive));
  // The `_copy` forms of views (torch 2.x's functionalized views; op_db has an OpInfo for each):
  // the view's rule, a fresh tensor instead of a view. squeeze_copy is not here: the view's entry
  // views the piece as the local shape (kViewAsLocal), which would alias the input.
  add("aten::view_copy", "view", {ints_arg("size")}, view_rule, local_shape("size"));
  add("aten::unsqueeze_copy", "view", {int_arg("dim")}, unsqueeze_rule);
  add("aten::transpose_copy.int", "view", {int_arg("dim0"), int_arg("dim1")}, transpose_rule);
  add("aten::permute_copy", "view", {ints_arg("dims")}, permute_rule_of);
  add("aten::t_copy", "view", {}, t_rule);
  add("aten::diagonal_backward", "view",
      {ints_arg("input_sizes"), int_arg("offset"), int_arg("dim1"), int_arg("dim2")},
      diagonal_backward_of, local_shape("input_sizes"));
  add("aten::unsafe_split.Tensor", "view", {int_arg("split_size"), int_arg("dim")}, split_of);
  add("aten::diagonal_copy", "view", {int_arg("offset"), int_arg("dim1"), int_arg("dim2")},
      diagonal_of);
  add("aten::split_with_sizes_copy", "view", {int_arg("dim"), ints_arg("split_sizes")},
      split_sizes_of);
}

// Ops no layout can run correctly: their entries raise (neither a rule nor the replicate fallback
// may take them).
void add_refused(Adder& add) {
  // as_strided addresses elements by storage offset and strides; a distributed tensor has no
  // single storage (its views report offset 0), so the result would silently differ from one
  // device's. PyTorch's DTensor refuses it too. Autograd calls it for an in-place op on a view
  // of a tensor that requires grad (CopySlices): write such code out of place.
  for (const char* op : {"as_strided", "as_strided_", "as_strided_scatter"}) {
    add(std::string("aten::") + op, "view", {},
        no_rule("it addresses elements by storage offset and strides, and a distributed tensor "
                "has no single storage (autograd uses it for in-place ops on views of tensors "
                "that require grad: write those out of place)"));
  }
}

}  // namespace

void add_view_ops(Adder& add) {
  add_views(add);
  add_refused(add);
}

}  // namespace dtensor::sharding::ops
