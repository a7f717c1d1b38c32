#pragma once
// Reads an op's layout arguments (sharding_prop::LayoutArgs) out of its boxed arguments, and makes
// the shape argument that describes its output local before the op runs on a rank's piece. What
// to read is declared by the op's table entry (NOTE [one entry per op]); this resolves those
// names against the op's schema once and reads them on every call.

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <vector>

#include "sharding_prop/ops/registry.h"

namespace dtensor {

class OpArgs {
 public:
  OpArgs() = default;
  // `entry` may be null (an op without a table entry reads no layout arguments).
  OpArgs(const sharding::OpEntry* entry, const c10::FunctionSchema& schema);

  sharding::LayoutArgs layout(const c10::IValue* args) const;
  // The same into `out` (its ints and text replaced; `call` untouched), reusing its capacity.
  void layout(const c10::IValue* args, sharding::LayoutArgs& out) const;
  bool needs_local_shapes() const { return shape_.kind != Kind::kNone; }
  // Rewrites the shape argument that describes the output to `out0`, the first output's local
  // shape.
  void localize(c10::IValue* args, const std::vector<int64_t>& out0) const;

 private:
  using Kind = sharding::LocalShapeArg::Kind;
  struct Ref {
    int index;
    const sharding::LayoutArg* arg;  // owned by the table entry (never freed)
    int other = -1;                  // kEqual's second argument
  };
  std::vector<Ref> refs_;
  struct {
    Kind kind = Kind::kNone;
    int index = -1;
    int dim_index = -1;  // unflatten's dim
  } shape_;
};

// Reads a list or int IValue as int64s (SymInt lists decay to int lists in 1.13).
std::vector<int64_t> ivalue_ints(const c10::IValue& v);
// The same, appended to `out`.
void append_ivalue_ints(const c10::IValue& v, std::vector<int64_t>& out);

}  // namespace dtensor
