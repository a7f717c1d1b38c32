#pragma once
// How the dispatcher reads an op's layout arguments (sharding_prop::LayoutArgs) out of its boxed
// arguments, and which shape arguments it must make local before running the op on a rank's
// piece. One table, keyed by op name, in dispatch_args.cc.

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <string_view>
#include <vector>

#include "sharding_prop/op_registry.h"

namespace dtensor {

// What one op's arguments mean, resolved against its schema.
class OpArgs {
 public:
  OpArgs() = default;
  // `op` is the registry name ("aten::sum.dim_IntList"); unknown ops read no layout arguments.
  OpArgs(std::string_view op, const c10::FunctionSchema& schema);

  sharding::LayoutArgs layout(const c10::IValue* args) const;
  bool needs_local_shapes() const { return localize_ != Localize::kNone; }
  // Rewrites shape arguments that describe the output to `out0`, the first output's local shape.
  void localize(c10::IValue* args, const std::vector<int64_t>& out0) const;

 private:
  enum class Kind : uint8_t { kValue, kLength, kText };
  struct Ref {
    int index;
    Kind kind;
    bool has_default;
    int64_t fallback;  // used when the argument is None
  };
  enum class Localize : uint8_t { kNone, kSizes, kFirstSize, kUnflatten };
  std::vector<Ref> refs_;
  Localize localize_ = Localize::kNone;
  int localize_arg_ = -1;
  int dim_arg_ = -1;  // unflatten's dim
};

// Reads a list or int IValue as int64s (SymInt lists decay to int lists in 1.13).
std::vector<int64_t> ivalue_ints(const c10::IValue& v);

}  // namespace dtensor
