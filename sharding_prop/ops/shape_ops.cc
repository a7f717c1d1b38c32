// Shape ops that join, pad, tile or rearrange (cat, stack, constant_pad_nd, repeat, flip, roll,
// tril/triu, diag, diag_embed, unfold, rot90, pixel_shuffle): the dims they change stay whole, the
// others pass.

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "sharding_prop/ops/family.h"

namespace dtensor::sharding::ops {
namespace {

// ints: dim.
RuleBuilder concat(bool stack) {
  return [=](const Metas& m, const LayoutArgs& a) {
    return BuiltRule{cat_rule(shapes_of(m), arg(a, 0, "cat", "dim"), stack), {promoted(m)}};
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

void add_cat(Adder& add) {
  add("aten::cat.out", "cat", {int_arg("dim")}, concat(false));
  add("aten::cat", "cat", {int_arg("dim")}, concat(false));
  add("aten::stack", "cat", {int_arg("dim")}, concat(true));
}

// Shape ops that work along some dims: those dims stay whole, the others pass.
void add_along_dims(Adder& add) {
  add("aten::flip", "view", {ints_arg("dims")}, along_dims(1));
  add("aten::roll", "view", {ints_arg("dims")}, along_dims(1));  // no dims: the flattened tensor
  for (const char* op : {"tril", "tril_", "triu", "triu_"}) {    // the matrix dims stay whole
    add(std::string("aten::") + op, "view", {}, along_dims(1, 2));
  }
  add("aten::constant_pad_nd", "view", {ints_arg("pad")}, constant_pad_of);
}

// Shape ops that tile or rearrange: the dims they change stay whole, the others pass.
void add_tile_and_rearrange(Adder& add) {
  add("aten::repeat", "view", {ints_arg("repeats")}, repeat_of);
  add("aten::diag", "view", {int_arg("diagonal")}, diag_of);
  add("aten::diag_embed", "view", {int_arg("offset"), int_arg("dim1"), int_arg("dim2")},
      diag_embed_of);
  add("aten::unfold", "view", {int_arg("dimension"), int_arg("size"), int_arg("step")}, unfold_of);
  add("aten::unfold_backward", "view",
      {int_arg("dim"), int_arg("size"), int_arg("step"), ints_arg("input_sizes")},
      unfold_backward_of, local_shape("input_sizes"));
  add("aten::rot90", "view", {int_arg("k"), ints_arg("dims")}, rot90_of);
  add("aten::pixel_shuffle", "view", {int_arg("upscale_factor")}, pixel_shuffle_of(true));
  add("aten::pixel_unshuffle", "view", {int_arg("downscale_factor")}, pixel_shuffle_of(false));
}

void add_out_overloads(Adder& add) {
  // The out= overloads of entries above: each the same entry under its out name.
  // clang-format off
  const std::vector<std::pair<const char*, const char*>> outs = {
      {"flip", "flip.out"},
      {"roll", "roll.out"},
      {"tril", "tril.out"},
      {"triu", "triu.out"},
      {"constant_pad_nd", "constant_pad_nd.out"},
      {"stack", "stack.out"},
  };
  // clang-format on
  for (const auto& [functional, out] : outs) {
    add.out_of(std::string("aten::") + functional, std::string("aten::") + out);
  }
}

}  // namespace

void add_shape_ops(Adder& add) {
  add_cat(add);
  add_along_dims(add);
  add_tile_and_rearrange(add);
  add_out_overloads(add);
}

}  // namespace dtensor::sharding::ops
