// The rule builders of the op table for selections along a dim (topk), paired reductions
// (var_mean, aminmax), count_nonzero, indexing along a dim (index_fill/copy/reduce), shape ops
// that tile or rearrange (repeat, diag, diag_embed, unfold, rot90, unbind, pixel_shuffle), batch
// norm and batched linear algebra (op_builders.cc has the shared helpers).

#include <c10/core/DeviceType.h>

#include <algorithm>
#include <cstdlib>

#include "base/error.h"
#include "sharding_prop/op_builders.h"

namespace dtensor::sharding::builders {
namespace {

// Every dim of `shape` as one factor of `kind` (none for a size-1 dim).
TensorFactors dims_of(Rule& r, const std::vector<int64_t>& shape, FactorKind kind) {
  TensorFactors t;
  for (const int64_t size : shape) t.push_back(r.add_dim(size, kind));
  return t;
}

// ATen's batch norm kernels divide by the sizes of the dims they see (an empty piece crashes
// them with SIGFPE): its dims may be sharded only evenly, so no rank's piece is empty.
void mark_even(Rule& r, const TensorFactors& t) {
  for (const DimFactors& d : t) {
    for (const int f : d) r.factors[f].even_only = true;
  }
}

int64_t dim_arg(const LayoutArgs& a, size_t i, int64_t ndim, const char* op) {
  return normalize_tensor_dim(arg(a, i, op, "dim"), ndim, op);
}

}  // namespace

// index.Tensor(self, indices) (x[i], x[:, i, j]): ints: per element of `indices`, 1 for a tensor
// and 0 for None. The indexed dims of self stay whole; its other dims pass. The index tensors
// broadcast together (as pointwise inputs) into the block of output dims they make, which sits
// where the indexed dims were when those are adjacent, else in front (NumPy's advanced indexing);
// a sharded index tensor leaves that block sharded, as PyTorch's. A Partial self stays Partial
// (the op picks elements) while the indices are Replicate. A bool or uint8 index (a mask) makes
// an output of the data's shape: no rule, the replicate fallback runs it.
BuiltRule index_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1 + a.ints.size(), "index");
  const std::vector<int64_t>& shape = m[0].shape;
  const int64_t ndim = m[0].ndim();
  DTENSOR_CHECK(static_cast<int64_t>(a.ints.size()) <= ndim, "index: ", a.ints.size(),
                " indices for a ", ndim, "-D tensor");
  std::vector<int64_t> indexed;
  for (size_t i = 0; i < a.ints.size(); ++i) {
    if (a.ints[i] != 0) indexed.push_back(static_cast<int64_t>(i));
  }
  DTENSOR_CHECK(indexed.size() + 1 == m.size(), "index: ", indexed.size(), " index tensors, ",
                m.size() - 1, " given");
  for (size_t k = 1; k < m.size(); ++k) {
    if (m[k].dtype == c10::kBool || m[k].dtype == c10::kByte) {
      BuiltRule declined;
      declined.run_replicated = true;
      return declined;
    }
  }
  if (indexed.empty()) {  // x[None]-free and index-free: a copy of self
    return BuiltRule{pointwise_rule({shape}, Linearity::kMove), {m[0].dtype}};
  }
  Rule r;
  r.linearity = Linearity::kMultilinear;
  r.linear_inputs.assign(m.size(), false);
  r.linear_inputs[0] = true;
  TensorFactors self;
  for (int64_t d = 0; d < ndim; ++d) {
    const bool is_indexed = std::find(indexed.begin(), indexed.end(), d) != indexed.end();
    self.push_back(r.add_dim(shape[d], is_indexed ? FactorKind::kReplicate : FactorKind::kPass));
  }
  std::vector<std::vector<int64_t>> index_shapes;
  for (size_t k = 1; k < m.size(); ++k) index_shapes.push_back(m[k].shape);
  const std::vector<int64_t> block_shape = broadcast_shapes(index_shapes);
  TensorFactors block;
  for (const int64_t size : block_shape) block.push_back(r.add_dim(size));
  r.inputs.push_back(self);
  for (const auto& s : index_shapes) r.inputs.push_back(aligned_factors(s, block_shape, block));
  const bool adjacent =
      indexed.back() - indexed.front() + 1 == static_cast<int64_t>(indexed.size());
  TensorFactors out;
  if (!adjacent) out = block;
  for (int64_t d = 0; d < ndim; ++d) {
    if (adjacent && d == indexed.front()) out.insert(out.end(), block.begin(), block.end());
    if (std::find(indexed.begin(), indexed.end(), d) == indexed.end()) out.push_back(self[d]);
  }
  r.outputs.push_back(std::move(out));
  return BuiltRule{std::move(r), {m[0].dtype}};
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

// index_fill / index_copy / index_reduce (self, dim, index[, source or 0-dim value]): ints: dim.
// Self's dim stays whole (the index names its rows), the 1-D index is replicated, a source with
// self's dims shards with self elsewhere.
BuiltRule index_along_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 3, "index_fill/index_copy/index_reduce");
  if (m[0].ndim() == 0) return on_scalar_self(m);
  const auto& s = m[0].shape;
  const int64_t d = dim_arg(a, 0, m[0].ndim(), "index_fill/index_copy/index_reduce");
  const bool has_src = m.size() == 3 && m[2].ndim() == m[0].ndim();
  Rule r;
  TensorFactors ts, tsrc;
  for (int64_t k = 0; k < m[0].ndim(); ++k) {
    if (k == d) {
      ts.push_back(r.add_dim(s[k], FactorKind::kReplicate));
      if (has_src) tsrc.push_back(r.add_dim(m[2].shape[k], FactorKind::kReplicate));
    } else if (!has_src || m[2].shape[k] == s[k]) {
      const DimFactors f = r.add_dim(s[k]);
      ts.push_back(f);
      tsrc.push_back(f);
    } else {
      throw Error("index_copy/index_reduce: source and self differ outside dim");
    }
  }
  r.inputs = {ts, dims_of(r, m[1].shape, FactorKind::kReplicate)};
  if (m.size() == 3) {
    r.inputs.push_back(has_src ? tsrc : dims_of(r, m[2].shape, FactorKind::kReplicate));
  }
  r.outputs = {ts};
  return {std::move(r), {m[0].dtype}};
}

// repeat(self, repeats): ints: repeats. A dim repeated once passes; a repeated dim and the new
// leading dims stay whole.
BuiltRule repeat_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "repeat");
  const auto& s = m[0].shape;
  const std::vector<int64_t>& rep = a.ints;
  if (rep.size() < s.size()) {
    throw Error("repeat: the number of repeats can not be smaller than the number of dims");
  }
  const size_t lead = rep.size() - s.size();
  Rule r;
  TensorFactors in, out;
  for (size_t i = 0; i < lead; ++i) out.push_back(r.add_dim(rep[i], FactorKind::kReplicate));
  for (size_t k = 0; k < s.size(); ++k) {
    if (rep[lead + k] == 1) {
      const DimFactors f = r.add_dim(s[k]);
      in.push_back(f);
      out.push_back(f);
    } else {
      in.push_back(r.add_dim(s[k], FactorKind::kReplicate));
      out.push_back(r.add_dim(s[k] * rep[lead + k], FactorKind::kReplicate));
    }
  }
  r.inputs = {in};
  r.outputs = {out};
  return {std::move(r), {m[0].dtype}};
}

// diag(self, diagonal): ints: diagonal. A vector becomes a matrix or a matrix's diagonal a
// vector: every dim stays whole.
BuiltRule diag_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "diag");
  const int64_t k = arg(a, 0, "diag", "diagonal");
  const auto& s = m[0].shape;
  std::vector<int64_t> out_shape;
  if (s.size() == 1) {
    out_shape = {s[0] + std::abs(k), s[0] + std::abs(k)};
  } else if (s.size() == 2) {
    out_shape = {
        std::max<int64_t>(0, k >= 0 ? std::min(s[0], s[1] - k) : std::min(s[0] + k, s[1]))};
  } else {
    throw Error("diag: expects a 1-D or 2-D tensor");
  }
  Rule r;
  r.inputs = {dims_of(r, s, FactorKind::kReplicate)};
  r.outputs = {dims_of(r, out_shape, FactorKind::kReplicate)};
  return {std::move(r), {m[0].dtype}};
}

// diag_embed(self, offset, dim1, dim2): ints: offset, dim1, dim2. The last dim becomes two whole
// dims at dim1 and dim2 of the output; the other dims pass in order.
BuiltRule diag_embed_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "diag_embed");
  const auto& s = m[0].shape;
  if (s.empty()) throw Error("diag_embed: expects at least a 1-D tensor");
  const int64_t out_ndim = m[0].ndim() + 1;
  const int64_t d1 = normalize_tensor_dim(arg(a, 1, "diag_embed", "dim1"), out_ndim, "dim1");
  const int64_t d2 = normalize_tensor_dim(arg(a, 2, "diag_embed", "dim2"), out_ndim, "dim2");
  if (d1 == d2) throw Error("diag_embed: diagonal dimensions cannot be identical");
  const int64_t n = s.back() + std::abs(arg(a, 0, "diag_embed", "offset"));
  Rule r;
  TensorFactors in, out(out_ndim);
  size_t next = 0;
  for (int64_t k = 0; k + 1 < m[0].ndim(); ++k) in.push_back(r.add_dim(s[k]));
  in.push_back(r.add_dim(s.back(), FactorKind::kReplicate));
  for (int64_t k = 0; k < out_ndim; ++k) {
    out[k] = k == d1 || k == d2 ? r.add_dim(n, FactorKind::kReplicate) : in[next++];
  }
  r.inputs = {in};
  r.outputs = {out};
  return {std::move(r), {m[0].dtype}};
}

// unfold(self, dimension, size, step): ints: dimension, size, step. The unfolded dim stays whole
// (it becomes the window count) and a whole dim of `size` is appended; the others pass.
BuiltRule unfold_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "unfold");
  const int64_t size = arg(a, 1, "unfold", "size"), step = arg(a, 2, "unfold", "step");
  if (step <= 0) throw Error("unfold: step must be > 0");
  Rule r;
  if (m[0].ndim() == 0) {
    r.inputs = {{}};
    r.outputs = {dims_of(r, {size}, FactorKind::kReplicate)};
    return {std::move(r), {m[0].dtype}};
  }
  const auto& s = m[0].shape;
  const int64_t d = dim_arg(a, 0, m[0].ndim(), "unfold");
  if (size > s[d]) throw Error("unfold: size exceeds the size of the unfolded dim");
  TensorFactors in, out;
  for (int64_t k = 0; k < m[0].ndim(); ++k) {
    if (k == d) {
      in.push_back(r.add_dim(s[k], FactorKind::kReplicate));
      out.push_back(r.add_dim((s[k] - size) / step + 1, FactorKind::kReplicate));
    } else {
      const DimFactors f = r.add_dim(s[k]);
      in.push_back(f);
      out.push_back(f);
    }
  }
  out.push_back(r.add_dim(size, FactorKind::kReplicate));
  r.inputs = {in};
  r.outputs = {out};
  return {std::move(r), {m[0].dtype}};
}

// unfold_backward(grad_in, input_sizes, dim, size, step): ints: dim, size, step, input_sizes...
// The gradient's window dims stay whole; the other dims pass into input_sizes (made local).
BuiltRule unfold_backward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "unfold_backward");
  if (a.ints.size() < 3) throw Error("unfold_backward: needs dim, size, step, input_sizes");
  const std::vector<int64_t> sizes(a.ints.begin() + 3, a.ints.end());
  const int64_t nd = static_cast<int64_t>(sizes.size());
  Rule r;
  if (nd == 0 || m[0].ndim() != nd + 1) {
    r.inputs = {dims_of(r, m[0].shape, FactorKind::kReplicate)};
    r.outputs = {dims_of(r, sizes, FactorKind::kReplicate)};
    return {std::move(r), {m[0].dtype}};
  }
  const int64_t d = dim_arg(a, 0, nd, "unfold_backward");
  TensorFactors in, out;
  for (int64_t k = 0; k < nd; ++k) {
    if (k == d) {
      in.push_back(r.add_dim(m[0].shape[k], FactorKind::kReplicate));
      out.push_back(r.add_dim(sizes[k], FactorKind::kReplicate));
    } else {
      if (m[0].shape[k] != sizes[k]) throw Error("unfold_backward: grad and input_sizes differ");
      const DimFactors f = r.add_dim(sizes[k]);
      in.push_back(f);
      out.push_back(f);
    }
  }
  in.push_back(r.add_dim(m[0].shape.back(), FactorKind::kReplicate));
  r.inputs = {in};
  r.outputs = {out};
  return {std::move(r), {m[0].dtype}};
}

// rot90(self, k, dims): ints: k, dims (two). The two dims stay whole (swapped for an odd k); the
// others pass.
BuiltRule rot90_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "rot90");
  if (a.ints.size() != 3 || m[0].ndim() < 2) {
    throw Error("rot90: expects two dims of a tensor of at least 2 dims");
  }
  const int64_t d0 = normalize_tensor_dim(a.ints[1], m[0].ndim(), "rot90 dim");
  const int64_t d1 = normalize_tensor_dim(a.ints[2], m[0].ndim(), "rot90 dim");
  if (d0 == d1) throw Error("rot90: the two dims must differ");
  const bool odd = ((a.ints[0] % 4) + 4) % 4 % 2 == 1;
  Rule r;
  TensorFactors in;
  for (int64_t k = 0; k < m[0].ndim(); ++k) {
    in.push_back(
        r.add_dim(m[0].shape[k], k == d0 || k == d1 ? FactorKind::kReplicate : FactorKind::kPass));
  }
  TensorFactors out = in;
  if (odd) std::swap(out[d0], out[d1]);
  r.inputs = {in};
  r.outputs = {out};
  return {std::move(r), {m[0].dtype}};
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

// pixel_shuffle (shuffle) / pixel_unshuffle(self, factor): ints: factor. The last three dims
// (channels, height, width) stay whole; the batch dims pass, evenly: ATen returns an empty input
// unshuffled (pixel_unshuffle of [0, 1, 6, 6] by 3 is [0, 1, 6, 6]), so no piece may be empty
// (found by the op_db sweep once a size-1 batch dim kept its Shard: NOTE [size-1 factors]).
RuleBuilder pixel_shuffle_of(bool shuffle) {
  return [=](const Metas& m, const LayoutArgs& a) {
    const char* op = shuffle ? "pixel_shuffle" : "pixel_unshuffle";
    need_inputs(m, 1, 1, op);
    const int64_t f = arg(a, 0, op, "factor");
    const auto& s = m[0].shape;
    if (s.size() < 3 || f <= 0) throw Error(std::string(op) + ": expects a tensor of >= 3 dims");
    const size_t b = s.size() - 3;
    const int64_t c = s[b], h = s[b + 1], w = s[b + 2];
    if (shuffle ? c % (f * f) != 0 : h % f != 0 || w % f != 0) {
      throw Error(std::string(op) + ": sizes are not divisible by the factor");
    }
    const std::vector<int64_t> core = shuffle ? std::vector<int64_t>{c / (f * f), h * f, w * f}
                                              : std::vector<int64_t>{c * f * f, h / f, w / f};
    Rule r;
    TensorFactors in, out;
    for (size_t k = 0; k < b; ++k) in.push_back(r.add_dim(s[k]));
    mark_even(r, in);
    out = in;
    for (size_t k = 0; k < 3; ++k) {
      in.push_back(r.add_dim(s[b + k], FactorKind::kReplicate));
      out.push_back(r.add_dim(core[k], FactorKind::kReplicate));
    }
    r.inputs = {in};
    r.outputs = {out};
    return BuiltRule{std::move(r), {m[0].dtype}};
  };
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

// _linalg_check_errors(info, api_name, is_matrix): raises when an info entry is nonzero. Every
// rank must see every entry, or one rank would raise while the others go on: info stays whole.
// No outputs.
BuiltRule check_errors_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 1, 1, "_linalg_check_errors");
  Rule r;
  r.inputs = {dims_of(r, m[0].shape, FactorKind::kReplicate)};
  return {std::move(r), {}};
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

// isin(elements, test_elements) / bucketize(self, boundaries): ints: the output dtype as a
// ScalarType number (isin: bool) or out_int32 (bucketize). The first tensor passes elementwise;
// the second is searched whole.
RuleBuilder search_of(bool bucketize) {
  return [=](const Metas& m, const LayoutArgs& a) {
    need_inputs(m, 2, 2, bucketize ? "bucketize" : "isin");
    Rule r;
    const TensorFactors t = dims_of(r, m[0].shape, FactorKind::kPass);
    r.inputs = {t, dims_of(r, m[1].shape, FactorKind::kReplicate)};
    r.outputs = {t};
    const c10::ScalarType out = !bucketize                                 ? c10::kBool
                                : arg(a, 0, "bucketize", "out_int32") != 0 ? c10::kInt
                                                                           : c10::kLong;
    return BuiltRule{std::move(r), {out}};
  };
}

// Batched linear algebra: input i's last in_core[i] dims are its matrix (or vector) dims and stay
// whole; the dims before them are batch dims that broadcast together and pass. Output o has the
// broadcast batch dims and out_core[o] whole dims. Its whole dims take their sizes from input
// `core_like`'s (>= 0), else from ATen's meta kernel (only ops with a C++ one). An output whose
// flag (an index into the ints, >= 0) reads 0 is empty ([0]: svd without U and Vh).
RuleBuilder batched(std::vector<int> in_core, std::vector<int> out_core, std::vector<int> flags,
                    int core_like) {
  return [=](const Metas& m, const LayoutArgs& a) {
    need_inputs(m, in_core.size(), in_core.size(), "batched linalg op");
    std::vector<std::vector<int64_t>> batches;
    for (size_t i = 0; i < m.size(); ++i) {
      if (m[i].ndim() < in_core[i]) throw Error("linalg: an input has too few dims");
      batches.emplace_back(m[i].shape.begin(), m[i].shape.end() - in_core[i]);
    }
    const std::vector<int64_t> batch = broadcast_shapes(batches);
    Rule r;
    TensorFactors bo;
    for (const int64_t size : batch) bo.push_back(r.add_dim(size));
    for (size_t i = 0; i < m.size(); ++i) {
      TensorFactors t = aligned_factors(batches[i], batch, bo);
      for (int64_t k = m[i].ndim() - in_core[i]; k < m[i].ndim(); ++k) {
        t.push_back(r.add_dim(m[i].shape[k], FactorKind::kReplicate));
      }
      r.inputs.push_back(std::move(t));
    }
    for (size_t o = 0; o < out_core.size(); ++o) {
      if (o < flags.size() && flags[o] >= 0 && arg(a, flags[o], "linalg", "flag") == 0) {
        r.outputs.push_back({r.add_dim(0, FactorKind::kReplicate)});
        continue;
      }
      TensorFactors t = bo;
      for (int k = 0; k < out_core[o]; ++k) {
        const int64_t size =
            core_like >= 0 ? m[core_like].shape[m[core_like].ndim() - out_core[o] + k] : 1;
        t.push_back(r.add_dim(size, FactorKind::kReplicate));
      }
      r.outputs.push_back(std::move(t));
    }
    r.whole_output_sizes_from_aten = core_like < 0;
    return BuiltRule{std::move(r), std::vector<c10::ScalarType>(out_core.size(), m[0].dtype)};
  };
}

// _linalg_solve_ex(A, B, left, check_errors): B is a batch of vectors when it is 1-D or has A's
// shape without its last dim (ATen's rule), else of matrices.
BuiltRule solve_ex_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 2, "_linalg_solve_ex");
  const auto &sa = m[0].shape, &sb = m[1].shape;
  const bool vector = sb.size() == 1 || (sa.size() >= 1 && sb.size() + 1 == sa.size() &&
                                         std::equal(sb.begin(), sb.end(), sa.begin()));
  const int core = vector ? 1 : 2;
  return batched({2, core}, {core, 2, 1, 0}, {}, -1)(m, a);
}

}  // namespace dtensor::sharding::builders
