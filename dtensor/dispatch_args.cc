// NOTE [dispatch arguments]
// Each line below names an op and the schema arguments that make up its LayoutArgs, in the
// order its op_registry.cc line documents: `name` appends the argument's value (an int, a bool as
// 0/1, a dtype as its number, every element of a list; None appends nothing), `name=v` appends v
// for None, `name#` appends a list's length, `$name` is the text. The second column says which
// argument describes the output's shape and so must be the local shape when the op runs on a
// rank's piece: `size>` = the first output's local shape, `size>0` = its first size,
// `sizes>unflatten` = the local sizes of the unflattened dims.

#include "dtensor/dispatch_args.h"

#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include <algorithm>

#include "base/error.h"

namespace dtensor {
namespace {

struct Line {
  const char* layout;
  const char* localize;
};

const std::map<std::string, Line, std::less<>>& lines() {
  static const auto* table = new std::map<std::string, Line, std::less<>>{
      {"aten::_to_copy", {"dtype=-1", ""}},
      {"aten::sum.dim_IntList", {"keepdim,dim", ""}},
      {"aten::sum.IntList_out", {"keepdim,dim", ""}},
      {"aten::mean.dim", {"keepdim,dim", ""}},
      {"aten::mean.out", {"keepdim,dim", ""}},
      {"aten::prod.dim_int", {"keepdim,dim", ""}},
      {"aten::amax", {"keepdim,dim", ""}},
      {"aten::amin", {"keepdim,dim", ""}},
      {"aten::max.dim", {"keepdim,dim", ""}},
      {"aten::min.dim", {"keepdim,dim", ""}},
      {"aten::argmax", {"keepdim,dim", ""}},
      {"aten::argmin", {"keepdim,dim", ""}},
      {"aten::var.correction", {"keepdim,dim", ""}},
      {"aten::std.correction", {"keepdim,dim", ""}},
      {"aten::linalg_vector_norm", {"keepdim,dim", ""}},
      {"aten::any.dim", {"keepdim,dim", ""}},
      {"aten::all.dim", {"keepdim,dim", ""}},
      {"aten::_softmax", {"dim", ""}},
      {"aten::_log_softmax", {"dim", ""}},
      {"aten::_softmax_backward_data", {"dim", ""}},
      {"aten::_log_softmax_backward_data", {"dim", ""}},
      {"aten::einsum", {"$equation", ""}},
      {"aten::view", {"size", "size>"}},
      {"aten::_unsafe_view", {"size", "size>"}},
      {"aten::_reshape_alias", {"size", "size>"}},
      {"aten::reshape", {"shape", "shape>"}},
      {"aten::expand", {"size", "size>"}},
      {"aten::flatten.using_ints", {"start_dim,end_dim", ""}},
      {"aten::unflatten.int", {"dim,sizes", "sizes>unflatten"}},
      {"aten::squeeze.dim", {"dim", ""}},
      {"aten::unsqueeze", {"dim", ""}},
      {"aten::transpose.int", {"dim0,dim1", ""}},
      {"aten::permute", {"dims", ""}},
      {"aten::slice.Tensor", {"dim,start=0,end=max,step", ""}},
      {"aten::narrow", {"dim,start,length", ""}},
      {"aten::select.int", {"dim", ""}},
      {"aten::split.Tensor", {"split_size,dim", ""}},
      {"aten::split_with_sizes", {"dim,split_sizes", ""}},
      {"aten::chunk", {"chunks,dim", ""}},
      {"aten::index_select", {"dim", ""}},
      {"aten::scatter_add", {"dim", ""}},
      {"aten::scatter.src", {"dim", ""}},
      {"aten::index_add", {"dim", ""}},
      {"aten::gather", {"dim", ""}},
      {"aten::slice_backward", {"dim,start,end,step,input_sizes", "input_sizes>"}},
      {"aten::select_backward", {"dim,input_sizes", "input_sizes>"}},
      {"aten::value_selecting_reduction_backward", {"dim,keepdim,sizes", "sizes>"}},
      {"aten::embedding_dense_backward", {"num_weights", "num_weights>0"}},
      {"aten::native_layer_norm", {"normalized_shape#", ""}},
      {"aten::native_layer_norm_backward", {"normalized_shape#", ""}},
      {"aten::nll_loss_forward", {"reduction", ""}},
      {"aten::nll_loss_backward", {"reduction", ""}},
      {"aten::new_zeros", {"size", "size>"}},
      {"aten::new_ones", {"size", "size>"}},
      {"aten::new_empty", {"size", "size>"}},
      {"aten::new_empty_strided", {"size", "size>"}},
      {"aten::new_full", {"size", "size>"}},
      {"aten::cat", {"dim", ""}},
      {"aten::cat.out", {"dim", ""}},
      {"aten::stack", {"dim", ""}},
  };
  return *table;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(sep, start), s.size());
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

int arg_index(const c10::FunctionSchema& schema, const std::string& name, std::string_view op) {
  const auto i = schema.argumentIndexWithName(name);
  TORCH_INTERNAL_ASSERT(i.has_value(), "dispatch_args: ", op, " has no argument '", name,
                        "' (schema ", c10::toString(schema), ")");
  return *i;
}

}  // namespace

std::vector<int64_t> ivalue_ints(const c10::IValue& v) {
  if (v.isNone()) return {};
  if (v.isInt()) return {v.toInt()};
  if (v.isSymInt()) return {v.toSymInt().expect_int()};
  if (v.isBool()) return {v.toBool() ? 1 : 0};
  if (v.isIntList()) return v.toIntVector();
  if (v.isList()) {
    std::vector<int64_t> out;
    for (const c10::IValue& e : v.toListRef()) {
      out.push_back(e.isSymInt() ? e.toSymInt().expect_int() : e.toInt());
    }
    return out;
  }
  throw Error("dispatch_args: expected an int or int list argument, got " +
                              v.tagKind());
}

OpArgs::OpArgs(std::string_view op, const c10::FunctionSchema& schema) {
  const auto it = lines().find(op);
  if (it == lines().end()) return;
  for (const std::string& token : split(it->second.layout, ',')) {
    Ref r{0, Kind::kValue, false, 0};
    std::string name = token;
    if (!name.empty() && name[0] == '$') {
      r.kind = Kind::kText;
      name = name.substr(1);
    } else if (!name.empty() && name.back() == '#') {
      r.kind = Kind::kLength;
      name.pop_back();
    } else if (const auto eq = name.find('='); eq != std::string::npos) {
      const std::string v = name.substr(eq + 1);
      r.has_default = true;
      r.fallback = v == "max" ? std::numeric_limits<int64_t>::max() : std::stoll(v);
      name = name.substr(0, eq);
    }
    r.index = arg_index(schema, name, op);
    refs_.push_back(r);
  }
  const std::string loc = it->second.localize;
  if (loc.empty()) return;
  const auto gt = loc.find('>');
  localize_arg_ = arg_index(schema, loc.substr(0, gt), op);
  const std::string how = loc.substr(gt + 1);
  localize_ = how.empty()  ? Localize::kSizes
              : how == "0" ? Localize::kFirstSize
                           : Localize::kUnflatten;
  if (localize_ == Localize::kUnflatten) dim_arg_ = arg_index(schema, "dim", op);
}

sharding::LayoutArgs OpArgs::layout(const c10::IValue* args) const {
  sharding::LayoutArgs out;
  for (const Ref& r : refs_) {
    const c10::IValue& v = args[r.index];
    if (r.kind == Kind::kText) {
      out.text = v.toStringRef();
    } else if (r.kind == Kind::kLength) {
      out.ints.push_back(static_cast<int64_t>(ivalue_ints(v).size()));
    } else if (v.isNone() && r.has_default) {
      out.ints.push_back(r.fallback);
    } else if (v.isScalar() && !v.isInt() && !v.isBool() && !v.isSymInt()) {
      throw Error("dispatch_args: non-integer layout argument");
    } else {
      const std::vector<int64_t> ints = ivalue_ints(v);
      out.ints.insert(out.ints.end(), ints.begin(), ints.end());
    }
  }
  return out;
}

void OpArgs::localize(c10::IValue* args, const std::vector<int64_t>& out0) const {
  switch (localize_) {
    case Localize::kNone:
      return;
    case Localize::kSizes:
      args[localize_arg_] = c10::IValue(out0);
      return;
    case Localize::kFirstSize:
      args[localize_arg_] = c10::IValue(out0.empty() ? int64_t{1} : out0[0]);
      return;
    case Localize::kUnflatten: {
      const int64_t n = static_cast<int64_t>(ivalue_ints(args[localize_arg_]).size());
      int64_t d = args[dim_arg_].toInt();
      const int64_t in_dims = static_cast<int64_t>(out0.size()) - n + 1;
      if (d < 0) d += in_dims;
      args[localize_arg_] =
          c10::IValue(std::vector<int64_t>(out0.begin() + d, out0.begin() + d + n));
      return;
    }
  }
}

}  // namespace dtensor
