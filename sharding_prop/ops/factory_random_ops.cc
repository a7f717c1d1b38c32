// Factories (new_*, *_like) and random ops (in-place random fills, bernoulli, rand*_like), drawn
// for the global tensor; and item() (_local_scalar_dense), which no layout runs.

#include <string>
#include <vector>

#include "base/error.h"
#include "sharding_prop/ops/family.h"

namespace dtensor::sharding::ops {
namespace {

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

void add_random_and_factories(Adder& add) {
  // empty_like's values are undefined, so it keeps every placement of its input, Partial too
  // (as PyTorch's: Module.to_empty keeps a Partial buffer Partial); the others hold values,
  // which a Partial layout would multiply, so they are Replicate there.
  add("aten::empty_like", "factory", {}, pointwise(1, Linearity::kMove));
  for (const char* op : {"zeros_like", "ones_like", "full_like"}) {
    add(std::string("aten::") + op, "factory", {}, pointwise(1, Linearity::kShapeOnly));
  }
  for (const char* op : {"rand_like", "randn_like", "randint_like", "randint_like.low_dtype"}) {
    add(std::string("aten::") + op, "factory", {}, pointwise(1, Linearity::kShapeOnly), same_shape,
        random_draw);
  }
  add("aten::bernoulli.p", "random", {}, pointwise(1, Linearity::kShapeOnly), same_shape,
      random_draw);
  // In-place random fills: self keeps its layout (a Partial self is refused).
  // cauchy_, log_normal_ and geometric_ (DrawOrder::kPerElement, random.cc): before
  // they ran by the fallback, which on a CUDA mesh handed a CPU generator to CUDA kernels.
  for (const char* op : {"uniform_", "normal_", "bernoulli_.float", "random_", "random_.from",
                         "random_.to", "exponential_", "cauchy_", "log_normal_", "geometric_"}) {
    add(std::string("aten::") + op, "random", {}, pointwise(1, lin), same_shape, random_draw);
  }
  for (const char* op : {"new_zeros", "new_ones", "new_empty", "new_full"}) {
    add(std::string("aten::") + op, "factory", {ints_arg("size")}, new_factory_of,
        local_shape("size"));
  }
  add("aten::new_empty_strided", "factory", {ints_arg("size")}, new_factory_of, local_shape("size"),
      Execution::kEmptyByLocal);
  // item(): every rank reads the whole value; there is no layout to propagate.
  add("aten::_local_scalar_dense", "scalar", {}, no_rule("item() reads the whole value"),
      same_shape, Execution::kReplicateFirst);
}

}  // namespace

void add_factory_random_ops(Adder& add) { add_random_and_factories(add); }

}  // namespace dtensor::sharding::ops
