#pragma once
// Internal to the op table (op_registry.cc, op_table_pointwise.cc, op_table_nn.cc): how an entry
// is added, and the families each file adds. Not an API: op_registry.h is.

#include <algorithm>
#include <string>
#include <vector>

#include "sharding_prop/op_registry.h"

namespace dtensor::sharding::table {

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

// The elementwise families (op_table_pointwise.cc).
void add_pointwise_ops(Adder& add);
// nn, pooling and convolution, losses, norms, random ops and factories (op_table_nn.cc).
void add_nn_ops(Adder& add);
// Selections, paired reductions, indexing along a dim, tiling shape ops, batched linalg
// (op_table_select.cc).
void add_select_ops(Adder& add);

}  // namespace dtensor::sharding::table
