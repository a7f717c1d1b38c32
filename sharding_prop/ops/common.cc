// The builder helpers more than one family uses (declared in family.h): reading and checking the
// inputs and layout arguments, and the rule shapes several families share.

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "sharding_prop/ops/family.h"

namespace dtensor::sharding::ops {

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

BuiltRule same_dtype(Rule r, const Metas& m) { return {std::move(r), {m.at(0).dtype}}; }

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

// ---- family builders ----

RuleBuilder pointwise(size_t n, Linearity lin, std::vector<bool> linear_inputs, bool to_bool) {
  return [=](const Metas& m, const LayoutArgs&) {
    need_inputs(m, 1, n, "pointwise op");
    return BuiltRule{pointwise_rule(shapes_of(m), lin, linear_inputs),
                     {to_bool ? c10::kBool : promoted(m)}};
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

// An entry whose op no layout runs: raises "no sharding rule: <why>".
RuleBuilder no_rule(const char* why) {
  return [why](const Metas&, const LayoutArgs&) -> BuiltRule { fail("no sharding rule: ", why); };
}

}  // namespace dtensor::sharding::ops
