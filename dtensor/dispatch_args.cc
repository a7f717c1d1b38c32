// Reading layout arguments from a call, as the op's table entry declares them (dispatch_args.h).

#include "dtensor/dispatch_args.h"

#include <limits>
#include <string>

#include "base/error.h"

namespace dtensor {
namespace {

int arg_index(const c10::FunctionSchema& schema, const std::string& name, const std::string& op) {
  const auto i = schema.argumentIndexWithName(name);
  TORCH_INTERNAL_ASSERT(i.has_value(), "op table: ", op, " has no argument '", name, "' (schema ",
                        c10::toString(schema), ")");
  return static_cast<int>(*i);
}

}  // namespace

void append_ivalue_ints(const c10::IValue& v, std::vector<int64_t>& out) {
  if (v.isNone()) return;
  if (v.isInt()) return out.push_back(v.toInt());
  if (v.isSymInt()) return out.push_back(v.toSymInt().expect_int());
  if (v.isBool()) return out.push_back(v.toBool() ? 1 : 0);
  if (v.isIntList()) {
    const c10::List<int64_t> list = v.toIntList();
    out.insert(out.end(), list.begin(), list.end());
    return;
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      out.push_back(e.isSymInt() ? e.toSymInt().expect_int() : e.toInt());
    }
    return;
  }
  throw Error("dispatch_args: expected an int or int list argument, got " + v.tagKind());
}

std::vector<int64_t> ivalue_ints(const c10::IValue& v) {
  std::vector<int64_t> out;
  append_ivalue_ints(v, out);
  return out;
}

OpArgs::OpArgs(const sharding::OpEntry* entry, const c10::FunctionSchema& schema) {
  if (entry == nullptr) return;
  for (const sharding::LayoutArg& a : entry->layout_args) {
    const bool pair = a.kind == sharding::LayoutArg::Kind::kEqual;
    refs_.push_back({arg_index(schema, a.name, entry->name), &a,
                     pair ? arg_index(schema, a.other, entry->name) : -1});
  }
  const sharding::LocalShapeArg& shape = entry->local_shape;
  if (shape.kind == Kind::kNone) return;
  shape_.kind = shape.kind;
  shape_.index = arg_index(schema, shape.name, entry->name);
  if (shape.kind == Kind::kUnflatten) shape_.dim_index = arg_index(schema, "dim", entry->name);
}

sharding::LayoutArgs OpArgs::layout(const c10::IValue* args) const {
  sharding::LayoutArgs out;
  layout(args, out);
  return out;
}

void OpArgs::layout(const c10::IValue* args, sharding::LayoutArgs& out) const {
  out.ints.clear();
  out.text.clear();
  using ArgKind = sharding::LayoutArg::Kind;
  for (const Ref& r : refs_) {
    const c10::IValue& v = args[r.index];
    if (r.arg->kind == ArgKind::kText) {
      out.text = v.toStringRef();
    } else if (r.arg->kind == ArgKind::kPresent && v.isList()) {  // a Tensor?[]: per element
      for (const c10::IValue& e : v.toListRef()) {
        out.ints.push_back(e.isTensor() && e.toTensor().defined() ? 1 : 0);
      }
    } else if (r.arg->kind == ArgKind::kPresent) {
      out.ints.push_back(v.isTensor() && v.toTensor().defined() ? 1 : 0);
    } else if (r.arg->kind == ArgKind::kDevice) {  // the mesh's, for a distributed tensor
      out.ints.push_back(static_cast<int64_t>(v.toTensor().device().type()));
    } else if (r.arg->kind == ArgKind::kEqual) {
      const c10::IValue& w = args[r.other];
      out.ints.push_back(v.toScalar().toDouble() == w.toScalar().toDouble() ? 1 : 0);
    } else if (r.arg->kind == ArgKind::kNormOrd) {
      const std::optional<Placement> partial = norm_partial_order(v.toScalar().toDouble());
      out.ints.push_back(partial ? static_cast<int64_t>(partial->reduce_op()) : -1);
      out.ints.push_back(partial ? partial->dim() : 0);
    } else if (r.arg->kind == ArgKind::kCount) {
      out.ints.push_back(static_cast<int64_t>(ivalue_ints(v).size()));
    } else if (v.isNone() && r.arg->if_none) {
      out.ints.push_back(*r.arg->if_none);
    } else if (v.isScalar() && !v.isInt() && !v.isBool() && !v.isSymInt()) {
      throw Error("dispatch_args: non-integer layout argument");
    } else {
      append_ivalue_ints(v, out.ints);  // no temporary: this runs on every call
    }
  }
}

void OpArgs::localize(c10::IValue* args, const std::vector<int64_t>& out0) const {
  switch (shape_.kind) {
    case Kind::kNone:
      return;
    case Kind::kSizes:
      args[shape_.index] = c10::IValue(out0);
      return;
    case Kind::kFirstSize:
      args[shape_.index] = c10::IValue(out0.empty() ? int64_t{1} : out0[0]);
      return;
    case Kind::kUnflatten: {
      const int64_t n = static_cast<int64_t>(ivalue_ints(args[shape_.index]).size());
      int64_t d = args[shape_.dim_index].toInt();
      const int64_t in_dims = static_cast<int64_t>(out0.size()) - n + 1;
      if (d < 0) d += in_dims;
      args[shape_.index] =
          c10::IValue(std::vector<int64_t>(out0.begin() + d, out0.begin() + d + n));
      return;
    }
  }
}

}  // namespace dtensor
