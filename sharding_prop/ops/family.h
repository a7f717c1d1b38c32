#pragma once
// Internal to sharding_prop/ops/ (not an API: registry.h is): how an entry is added, the builder
// helpers more than one family uses (common.cc), and the add_*_ops of each family's file.

// NOTE [op table]
// One line per supported ATen overload. The builder gets the tensor inputs' metas (in argument
// order; Python scalars are not inputs, plain 0-dim and one-element tensors are replicated ones)
// and the layout arguments, whose meaning each line states. In-place overloads (`add_.Tensor`)
// are marked: their self keeps its layout. `.out` overloads shard like their functional form (the
// out tensor is checked by the caller). Each family's file here holds its rule builders and its
// lines; registry.cc assembles the families into the table itself (find_op, all_ops,
// register_rule).

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <string>
#include <vector>

#include "sharding_prop/ops/registry.h"

namespace dtensor::sharding::ops {

// add(name, family, layout args, rule builder[, the arg that is the local output shape]
//     [, how it executes]): one entry, everything about the overload (NOTE [one entry per op]).
struct Adder {
  std::vector<OpEntry> entries;
  // The out= overload `out` of the entry `functional` (added before): the same entry under the
  // out overload's name (the out tensor is not an input; the dispatcher rewraps it).
  void out_of(const std::string& functional, std::string out) {
    const auto it = std::find_if(entries.begin(), entries.end(),
                                 [&](const OpEntry& e) { return e.name == functional; });
    TORCH_INTERNAL_ASSERT(it != entries.end(), "out_of: no entry ", functional);
    OpEntry e = *it;
    e.name = std::move(out);
    e.in_place = false;
    entries.push_back(std::move(e));
  }
  // The entry added last only moves data (a copy, a fill, a cast): it counts no FLOPs.
  void moves_data() { entries.back().flops = Flops::kNone; }
  void operator()(std::string name, std::string family, std::vector<LayoutArg> args, RuleBuilder b,
                  LocalShapeArg shape = {}, Execution execution = Execution::kPieces) {
    const bool in_place =
        name.find("_.") != std::string::npos || (name.size() > 1 && name.back() == '_');
    const Flops flops = flops_of_family(family);
    entries.push_back({std::move(name), std::move(family), std::move(args), in_place, std::move(b),
                       std::move(shape), execution, false, flops});
  }
};

constexpr Linearity lin = Linearity::kNone;
inline const LocalShapeArg same_shape;  // no shape argument
constexpr Execution random_draw = Execution::kRandom;
// Reductions: keepdim, then the reduced dims (none: every dim).
inline std::vector<LayoutArg> reduce_args() { return {int_arg("keepdim"), ints_arg("dim")}; }

// Rule builders turn the input metas and layout arguments into a Rule and output dtypes. Each
// validates its inputs and arguments and throws dtensor::Error naming the problem.
using Metas = std::vector<TensorMeta>;
using Shapes = std::vector<std::vector<int64_t>>;

Shapes shapes_of(const Metas& m);
c10::ScalarType promoted(const Metas& m);
void need_inputs(const Metas& m, size_t lo, size_t hi, const char* op);
int64_t arg(const LayoutArgs& a, size_t i, const char* op, const char* what);
BuiltRule same_dtype(Rule r, const Metas& m);
TensorFactors dims_of(Rule& r, const std::vector<int64_t>& shape, FactorKind kind);
void mark_even(Rule& r, const TensorFactors& t);
int64_t dim_arg(const LayoutArgs& a, size_t i, int64_t ndim, const char* op);
RuleBuilder pointwise(size_t n, Linearity lin, std::vector<bool> linear_inputs = {},
                      bool to_bool = false);
RuleBuilder along_dims(size_t outputs, size_t last_dims = 0);
// An indexing op on a 0-dim self (ATen reads it as one element): every input stays whole; the
// output has `out_shape`.
BuiltRule on_scalar_self(const Metas& m, const std::vector<int64_t>& out_shape = {});
// For entries the dispatcher runs without a rule (Execution::kReplicateFirst): fails naming why.
RuleBuilder no_rule(const char* why);

// The families, one file each: its rule builders and its entries.
// Elementwise ops with their in-place and out= forms, casts, copies, fills (pointwise_ops.cc).
void add_pointwise_ops(Adder& add);
// Reductions, norms, softmax, and scans, sorts and selections along whole dims
// (reduction_ops.cc).
void add_reduction_ops(Adder& add);
// Matrix products and batched linear algebra (matrix_ops.cc).
void add_matrix_ops(Adder& add);
// Views, reshapes, slicing and splitting (view_ops.cc).
void add_view_ops(Adder& add);
// Shape ops that join, pad, tile or rearrange (shape_ops.cc).
void add_shape_ops(Adder& add);
// Indexing: gather, scatter, index_*, advanced indexing, searches (index_ops.cc).
void add_index_ops(Adder& add);
// FFTs (fft_ops.cc).
void add_fft_ops(Adder& add);
// Embedding, norms, losses, attention, dropout (nn_ops.cc).
void add_nn_ops(Adder& add);
// Convolution, pooling, upsampling and padding over spatial dims (conv_pool_ops.cc).
void add_conv_pool_ops(Adder& add);
// Factories, random ops and item() (factory_random_ops.cc).
void add_factory_random_ops(Adder& add);

}  // namespace dtensor::sharding::ops
