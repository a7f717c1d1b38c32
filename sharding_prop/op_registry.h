#pragma once
// The table of operators the engine can shard: ATen op name (with overload) -> how to build its
// Rule (rule.h) and output dtypes from the input metas and the op's layout arguments. Every
// entry lives in op_registry.cc, one line per overload, so coverage is reviewable in one place;
// `./x ops` prints it. Custom ops register a rule string ("mk,kn->mn") at run time.

#include <c10/core/ScalarType.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "layout/tensor_meta.h"
#include "sharding_prop/rule.h"

namespace dtensor::sharding {

// The arguments of a call that decide layouts, and nothing else (never runtime scalar values):
// dims, keepdim flags, target shapes, an output dtype, an einsum equation. What `ints` holds is
// documented per op in the table. Part of the propagation cache key.
struct LayoutArgs {
  std::vector<int64_t> ints;
  std::string text;
  friend bool operator==(const LayoutArgs& a, const LayoutArgs& b) {
    return a.ints == b.ints && a.text == b.text;
  }
  size_t hash() const;
  std::string to_string() const;
};

struct BuiltRule {
  Rule rule;
  std::vector<c10::ScalarType> out_dtypes;  // one per output
};

using RuleBuilder =
    std::function<BuiltRule(const std::vector<TensorMeta>& inputs, const LayoutArgs& args)>;

struct OpEntry {
  std::string name;       // "aten::add.Tensor"
  std::string family;     // "pointwise", "matmul", ...
  std::string args;       // what LayoutArgs::ints holds, for humans ("dims..., keepdim")
  bool in_place = false;  // self is the output: its layout may not change
  RuleBuilder build;
};

// The entry of `name`, or null.
const OpEntry* find_op(std::string_view name);
// Every entry, sorted by name.
std::vector<const OpEntry*> all_ops();
// The registered names closest to `name` (edit distance on the base name), best first.
std::vector<std::string> nearest_ops(std::string_view name, size_t count = 3);

// Registers a custom op from an einsum-like rule (rule.h text form); its output dtype is its
// first input's. Throws when the name exists already.
void register_rule(const std::string& name, const std::string& rule_text,
                   Linearity linearity = Linearity::kMultilinear);

}  // namespace dtensor::sharding
