// NOTE [op table]
// One line per supported ATen overload. The builder gets the tensor inputs' metas (in argument
// order; Python scalars are not inputs, plain 0-dim and one-element tensors are replicated ones)
// and the layout arguments, whose meaning each line states. In-place overloads (`add_.Tensor`)
// are marked: their self keeps its layout. `.out` overloads shard like their functional form (the
// out tensor is checked by the caller). The table's families live in this file (reductions,
// matmul, views, scans, out= overloads), op_table_pointwise.cc and op_table_nn.cc (op_table.h);
// this file also holds the table itself (find_op, all_ops, register_rule).

#include "sharding_prop/op_registry.h"

#include "base/error.h"
#include "sharding_prop/op_builders.h"
#include "sharding_prop/op_table.h"

#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>

#include <absl/container/node_hash_map.h>
#include <absl/hash/hash.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>

namespace dtensor::sharding::table {
namespace {

using namespace builders;  // NOLINT: the table names the family builders

void add_reductions(Adder& add) {
  add("aten::sum", "reduction", {}, reduction(ReduceOp::kSum, false, Linearity::kAdditive));
  add("aten::sum.dim_IntList", "reduction", reduce_args(),
      reduction(ReduceOp::kSum, false, Linearity::kAdditive));
  add("aten::mean", "reduction", {}, reduction(ReduceOp::kAvg, false, Linearity::kAdditive));
  add("aten::mean.dim", "reduction", reduce_args(),
      reduction(ReduceOp::kAvg, false, Linearity::kAdditive));
  add("aten::prod", "reduction", {}, reduction(ReduceOp::kProduct, false, lin));
  add("aten::prod.dim_int", "reduction", reduce_args(), reduction(ReduceOp::kProduct, false, lin));
  add("aten::amax", "reduction", reduce_args(), reduction(ReduceOp::kMax, false, Linearity::kMax));
  add("aten::amin", "reduction", reduce_args(), reduction(ReduceOp::kMin, false, Linearity::kMin));
  add("aten::max", "reduction", {}, reduction(ReduceOp::kMax, false, Linearity::kMax));
  add("aten::min", "reduction", {}, reduction(ReduceOp::kMin, false, Linearity::kMin));
  add("aten::max.dim", "reduction", reduce_args(), reduction(ReduceOp::kMax, true, lin, -1, 2));
  add("aten::min.dim", "reduction", reduce_args(), reduction(ReduceOp::kMin, true, lin, -1, 2));
  add("aten::argmax", "reduction", reduce_args(),
      reduction(ReduceOp::kMax, true, lin, static_cast<int>(c10::kLong)));
  add("aten::argmin", "reduction", reduce_args(),
      reduction(ReduceOp::kMin, true, lin, static_cast<int>(c10::kLong)));
  add("aten::var.correction", "reduction", reduce_args(), reduction(ReduceOp::kSum, true, lin));
  add("aten::std.correction", "reduction", reduce_args(), reduction(ReduceOp::kSum, true, lin));
  add("aten::linalg_vector_norm", "reduction",
      {norm_ord_arg("ord"), int_arg("keepdim"), ints_arg("dim")}, vector_norm_of);
  add("aten::dist", "reduction", {norm_ord_arg("p")}, dist_of);
  // sum(|x|^ord) (clip_grad_norm_'s partial norms): a sum of pieces whatever the order.
  add("aten::linalg__powsum", "reduction", reduce_args(), reduction(ReduceOp::kSum, false, lin));
  add("aten::any.dim", "reduction", reduce_args(),
      reduction(ReduceOp::kMax, true, lin, static_cast<int>(c10::kBool)));
  add("aten::all.dim", "reduction", reduce_args(),
      reduction(ReduceOp::kMin, true, lin, static_cast<int>(c10::kBool)));
  add("aten::any", "reduction", {},
      reduction(ReduceOp::kMax, true, lin, static_cast<int>(c10::kBool)));
  add("aten::all", "reduction", {},
      reduction(ReduceOp::kMin, true, lin, static_cast<int>(c10::kBool)));
  // p-norms and log-sum-exp over dims: the reduced dims stay whole. nansum is a sum of pieces.
  add("aten::norm.Scalar", "reduction", {}, reduction(ReduceOp::kSum, true, lin));
  add("aten::norm.ScalarOpt_dim", "reduction", reduce_args(), reduction(ReduceOp::kSum, true, lin));
  add("aten::norm.ScalarOpt_dim_dtype", "reduction", reduce_args(),
      reduction(ReduceOp::kSum, true, lin));
  add("aten::logsumexp", "reduction", reduce_args(), reduction(ReduceOp::kSum, true, lin));
  add("aten::nansum", "reduction", reduce_args(), reduction(ReduceOp::kSum, false, lin));
  add("aten::histc", "reduction", {int_arg("bins"), equal_args("min", "max")}, histc_of);
  // Softmax: ints = dim.
  add("aten::_softmax", "softmax", {int_arg("dim")}, softmax(1));
  add("aten::_log_softmax", "softmax", {int_arg("dim")}, softmax(1));
  add("aten::_softmax_backward_data", "softmax", {int_arg("dim")}, softmax(2));
  add("aten::_log_softmax_backward_data", "softmax", {int_arg("dim")}, softmax(2));
}

void add_matmul(Adder& add) {
  add("aten::dot", "matmul", {}, from_text("k,k->", Linearity::kMultilinear));
  add("aten::vdot", "matmul", {}, from_text("k,k->", Linearity::kMultilinear));
  add("aten::mv", "matmul", {}, from_text("mk,k->m", Linearity::kMultilinear));
  // Matmul family.
  add("aten::mm", "matmul", {}, mm_rule);
  add("aten::bmm", "matmul", {}, bmm_rule);
  add("aten::matmul", "matmul", {}, matmul_rule_of);
  add("aten::addmm", "matmul", {}, addmm_rule_of);
  add("aten::baddbmm", "matmul", {}, addmm_rule_of);
  add("aten::addmv", "matmul", {}, addmv_of);
  add("aten::addbmm", "matmul", {}, addbmm_of);
  add("aten::addr", "matmul", {}, addr_of);
  add("aten::linear", "matmul", {}, linear_rule_of);
  add("aten::einsum", "matmul", {text_arg("equation")}, einsum_rule);
  add("aten::t", "view", {}, t_rule);
}

// Ops no layout can run correctly: their entries raise (neither a rule nor the replicate fallback
// may take them).
void add_refused(Adder& add) {
  // as_strided addresses elements by storage offset and strides; a distributed tensor has no
  // single storage (its views report offset 0), so the result would silently differ from one
  // device's. PyTorch's DTensor refuses it too. Autograd calls it for an in-place op on a view
  // of a tensor that requires grad (CopySlices): write such code out of place.
  for (const char* op : {"as_strided", "as_strided_", "as_strided_scatter"}) {
    add(std::string("aten::") + op, "view", {},
        no_rule("it addresses elements by storage offset and strides, and a distributed tensor "
                "has no single storage (autograd uses it for in-place ops on views of tensors "
                "that require grad: write those out of place)"));
  }
}

// Scans, sorts and shape ops that work along some dims: those dims stay whole, the others pass.
void add_along_dims(Adder& add) {
  for (const char* op : {"cumsum", "cumsum_", "cumprod", "cumprod_", "logcumsumexp"}) {
    add(std::string("aten::") + op, "scan", {int_arg("dim")}, along_dims(1));
  }
  for (const char* op : {"cummax", "cummin", "sort"}) {  // values and indices
    add(std::string("aten::") + op, "scan", {int_arg("dim")}, along_dims(2));
  }
  add("aten::sort.stable", "scan", {int_arg("dim")}, along_dims(2));
  add("aten::flip", "view", {ints_arg("dims")}, along_dims(1));
  add("aten::roll", "view", {ints_arg("dims")}, along_dims(1));  // no dims: the flattened tensor
  for (const char* op : {"tril", "tril_", "triu", "triu_"}) {    // the matrix dims stay whole
    add(std::string("aten::") + op, "view", {}, along_dims(1, 2));
  }
  add("aten::constant_pad_nd", "view", {ints_arg("pad")}, constant_pad_of);
  // FFTs: the transformed dims stay whole, batch dims pass.
  add("aten::_fft_c2c", "fft", {ints_arg("dim")}, along_dims(1));
  add("aten::_fft_r2c", "fft", {ints_arg("dim"), int_arg("onesided")}, fft_of(true));
  add("aten::_fft_c2r", "fft", {ints_arg("dim"), int_arg("last_dim_size")}, fft_of(false));
  add("aten::view_as_real", "view", {}, view_as_real_of);
  add("aten::diagonal", "view", {int_arg("offset"), int_arg("dim1"), int_arg("dim2")}, diagonal_of);
  add("aten::view_as_complex", "view", {}, view_as_complex_of);
  add("aten::_conj", "view", {}, pointwise(1, Linearity::kAdditive));
  add("aten::logical_and_", "pointwise", {}, pointwise(2, lin, {}, true));
  add("aten::logical_or_", "pointwise", {}, pointwise(2, lin, {}, true));
}

void add_views(Adder& add) {
  // Views and shape ops.
  // view runs as a view of the piece as the output's local shape (kViewAsLocal), unboxed: the
  // boxed call with localized sizes cost ~2k of a view's ~12k instructions per call.
  add("aten::view", "view", {ints_arg("size")}, view_rule, same_shape, Execution::kViewAsLocal);
  add("aten::reshape", "view", {ints_arg("shape")}, view_rule, local_shape("shape"));
  add("aten::_unsafe_view", "view", {ints_arg("size")}, view_rule, local_shape("size"));
  add("aten::flatten.using_ints", "view", {int_arg("start_dim"), int_arg("end_dim")}, flatten_rule);
  add("aten::unflatten.int", "view", {int_arg("dim"), ints_arg("sizes")}, unflatten_rule,
      local_shape("sizes", LocalShapeArg::Kind::kUnflatten));
  // A piece may have a size-1 dim the global tensor has not (5 rows over 4 ranks: 2,2,1,0), so
  // squeeze views the piece as the output's local shape instead of squeezing it.
  add("aten::squeeze", "view", {}, squeeze_rule, same_shape, Execution::kViewAsLocal);
  add("aten::squeeze.dim", "view", {int_arg("dim")}, squeeze_rule, same_shape,
      Execution::kViewAsLocal);
  add("aten::unsqueeze", "view", {int_arg("dim")}, unsqueeze_rule);
  add("aten::transpose.int", "view", {int_arg("dim0"), int_arg("dim1")}, transpose_rule);
  add("aten::permute", "view", {ints_arg("dims")}, permute_rule_of);
  add("aten::expand", "view", {ints_arg("size")}, expand_rule_of, local_shape("size"));
  add("aten::slice.Tensor", "view",
      {int_arg("dim"), int_arg("start", 0), int_arg("end", std::numeric_limits<int64_t>::max()),
       int_arg("step")},
      slice_of);
  add("aten::narrow", "view", {int_arg("dim"), int_arg("start"), int_arg("length")}, narrow_of);
  add("aten::select.int", "view", {int_arg("dim")}, select_of);
  add("aten::split.Tensor", "view", {int_arg("split_size"), int_arg("dim")}, split_of);
  add("aten::split_with_sizes", "view", {int_arg("dim"), ints_arg("split_sizes")}, split_sizes_of);
  add("aten::chunk", "view", {int_arg("chunks"), int_arg("dim")}, chunk_of);
  add("aten::index_select", "index", {int_arg("dim")}, index_select_of);
  add("aten::slice_backward", "view",
      {int_arg("dim"), int_arg("start"), int_arg("end"), int_arg("step"), ints_arg("input_sizes")},
      slice_backward_of, local_shape("input_sizes"), Execution::kSliceBackwardAtOffset);
  add("aten::select_backward", "view", {int_arg("dim"), ints_arg("input_sizes")},
      select_backward_of, local_shape("input_sizes"));
  add("aten::scatter_add", "index", {int_arg("dim")}, scatter_of);
  add("aten::scatter.src", "index", {int_arg("dim")}, scatter_of);
  add("aten::index_add", "index", {int_arg("dim")}, index_add_of);
  // The backward of max.dim/sort/topk/kthvalue/mode/median and of cummax/cummin: ATen's
  // decompositions scatter into a plain at::zeros, so the engine runs them (run_composite).
  add("aten::value_selecting_reduction_backward", "reduction",
      {int_arg("dim"), int_arg("keepdim"), ints_arg("sizes")}, value_selecting_backward_of,
      local_shape("sizes"));
  add.entries.back().run_composite = true;
  add("aten::cummaxmin_backward", "scan", {int_arg("dim")}, along_dims(1));
  add.entries.back().run_composite = true;
  add("aten::gather", "index", {int_arg("dim")}, gather_of);
  // The `_copy` forms of views (torch 2.x's functionalized views; op_db has an OpInfo for each):
  // the view's rule, a fresh tensor instead of a view. squeeze_copy is not here: the view's entry
  // views the piece as the local shape (kViewAsLocal), which would alias the input.
  add("aten::view_copy", "view", {ints_arg("size")}, view_rule, local_shape("size"));
  add("aten::unsqueeze_copy", "view", {int_arg("dim")}, unsqueeze_rule);
  add("aten::transpose_copy.int", "view", {int_arg("dim0"), int_arg("dim1")}, transpose_rule);
  add("aten::permute_copy", "view", {ints_arg("dims")}, permute_rule_of);
  add("aten::t_copy", "view", {}, t_rule);
  add("aten::diagonal_backward", "view",
      {ints_arg("input_sizes"), int_arg("offset"), int_arg("dim1"), int_arg("dim2")},
      diagonal_backward_of, local_shape("input_sizes"));
  add("aten::unsafe_split.Tensor", "view", {int_arg("split_size"), int_arg("dim")}, split_of);
  add("aten::diagonal_copy", "view", {int_arg("offset"), int_arg("dim1"), int_arg("dim2")},
      diagonal_of);
  add("aten::split_with_sizes_copy", "view", {int_arg("dim"), ints_arg("split_sizes")},
      split_sizes_of);
}

// Pooling, upsampling and reflection/replication padding: the batch dim passes, channel and
// spatial dims stay whole (their output sizes from ATen's meta kernels). Only ops with a C++ meta
// kernel in torch 1.13 are here (a C++ program has no Python meta registrations): the others
// (max_pool3d_with_indices, _adaptive_avg_pool2d/3d, reflection_pad2d, some pad backward ops,
// max_unpool) are left to the replicate fallback. Convolution computes its own output sizes.
void add_out_overloads(Adder& add) {
  // `.out` overloads of the common non-pointwise ops (the out tensor is not an input).
  add("aten::mm.out", "matmul", {}, mm_rule);
  add("aten::bmm.out", "matmul", {}, bmm_rule);
  add("aten::addmm.out", "matmul", {}, addmm_rule_of);
  add("aten::sum.IntList_out", "reduction", reduce_args(),
      reduction(ReduceOp::kSum, false, Linearity::kAdditive));
  add("aten::mean.out", "reduction", reduce_args(),
      reduction(ReduceOp::kAvg, false, Linearity::kAdditive));
  add("aten::cat.out", "cat", {int_arg("dim")}, concat(false));
  add("aten::cat", "cat", {int_arg("dim")}, concat(false));
  add("aten::stack", "cat", {int_arg("dim")}, concat(true));
  // The out= overloads of entries above: each the same entry under its out name.
  // clang-format off
  const std::vector<std::pair<const char*, const char*>> outs = {
      {"cumsum", "cumsum.out"},
      {"cumprod", "cumprod.out"},
      {"logcumsumexp", "logcumsumexp.out"},
      {"cummax", "cummax.out"},
      {"cummin", "cummin.out"},
      {"sort", "sort.values"},
      {"sort.stable", "sort.values_stable"},
      {"flip", "flip.out"},
      {"roll", "roll.out"},
      {"tril", "tril.out"},
      {"triu", "triu.out"},
      {"constant_pad_nd", "constant_pad_nd.out"},
      {"_fft_c2c", "_fft_c2c.out"},
      {"_fft_r2c", "_fft_r2c.out"},
      {"_fft_c2r", "_fft_c2r.out"},
      {"norm.Scalar", "norm.Scalar_out"},
      {"logsumexp", "logsumexp.out"},
      {"nansum", "nansum.out"},
      {"dot", "dot.out"},
      {"vdot", "vdot.out"},
      {"mv", "mv.out"},
      {"amax", "amax.out"},
      {"amin", "amin.out"},
      {"argmax", "argmax.out"},
      {"argmin", "argmin.out"},
      {"var.correction", "var.correction_out"},
      {"std.correction", "std.correction_out"},
      {"linalg_vector_norm", "linalg_vector_norm.out"},
      {"baddbmm", "baddbmm.out"},
      {"stack", "stack.out"},
      {"_softmax", "_softmax.out"},
      {"_log_softmax", "_log_softmax.out"},
      {"where.self", "where.self_out"},
      {"clamp", "clamp.out"},
      {"pow.Tensor_Scalar", "pow.Tensor_Scalar_out"},
      {"pow.Tensor_Tensor", "pow.Tensor_Tensor_out"},
      {"maximum", "maximum.out"},
      {"minimum", "minimum.out"},
      {"atan2", "atan2.out"},
      {"logical_and", "logical_and.out"},
      {"logical_or", "logical_or.out"},
      {"eq.Tensor", "eq.Tensor_out"},
      {"ne.Tensor", "ne.Tensor_out"},
      {"lt.Tensor", "lt.Tensor_out"},
      {"le.Tensor", "le.Tensor_out"},
      {"gt.Tensor", "gt.Tensor_out"},
      {"ge.Tensor", "ge.Tensor_out"},
      {"eq.Scalar", "eq.Scalar_out"},
      {"ne.Scalar", "ne.Scalar_out"},
      {"lt.Scalar", "lt.Scalar_out"},
      {"le.Scalar", "le.Scalar_out"},
      {"gt.Scalar", "gt.Scalar_out"},
      {"ge.Scalar", "ge.Scalar_out"},
      {"addcmul", "addcmul.out"},
      {"addcdiv", "addcdiv.out"},
      {"lerp.Scalar", "lerp.Scalar_out"},
      {"bitwise_and.Tensor", "bitwise_and.Tensor_out"},
      {"bitwise_or.Tensor", "bitwise_or.Tensor_out"},
      {"bitwise_xor.Tensor", "bitwise_xor.Tensor_out"},
      {"neg", "neg.out"},
      {"isnan", "isnan.out"},
      {"isinf", "isinf.out"},
  };
  // clang-format on
  for (const auto& [functional, out] : outs) {
    add.out_of(std::string("aten::") + functional, std::string("aten::") + out);
  }
}

std::vector<OpEntry> build_table() {
  Adder add;
  add_pointwise_ops(add);
  add_reductions(add);
  add_matmul(add);
  add_views(add);
  add_refused(add);
  add_along_dims(add);
  add_nn_ops(add);
  add_select_ops(add);
  add_out_overloads(add);
  std::vector<OpEntry>& t = add.entries;
  std::sort(t.begin(), t.end(), [](const OpEntry& a, const OpEntry& b) { return a.name < b.name; });
  return std::move(t);
}

}  // namespace
}  // namespace dtensor::sharding::table

namespace dtensor::sharding {
namespace {

using builders::Metas;

// The op table: an interning table, not a cache (NOTE [caches]): entries are handed out by pointer
// and live for the process. The built-in entries never change after construction, so they are
// read without a lock (find_op is on the propagation path of every op whose entry the caller has
// not kept); entries registered at run time (register_rule) sit in their own map under a mutex.
struct Table {
  const absl::node_hash_map<std::string, OpEntry> builtin;
  absl::Mutex mu;
  absl::node_hash_map<std::string, OpEntry> custom ABSL_GUARDED_BY(mu);
  Table() : builtin(index(table::build_table())) {}

  static absl::node_hash_map<std::string, OpEntry> index(std::vector<OpEntry> entries) {
    absl::node_hash_map<std::string, OpEntry> out;
    for (auto& e : entries) {
      const std::string name = e.name;
      TORCH_INTERNAL_ASSERT(out.emplace(name, std::move(e)).second, "two entries for ", name);
    }
    return out;
  }
};

Table& op_table() {
  static Table* t = new Table();  // never destroyed: entries are handed out by pointer
  return *t;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

LayoutArg int_arg(std::string name, std::optional<int64_t> if_none) {
  return {std::move(name), LayoutArg::Kind::kInt, if_none};
}
LayoutArg ints_arg(std::string name) { return {std::move(name), LayoutArg::Kind::kInts, {}}; }
LayoutArg count_arg(std::string name) { return {std::move(name), LayoutArg::Kind::kCount, {}}; }
LayoutArg text_arg(std::string name) { return {std::move(name), LayoutArg::Kind::kText, {}}; }
LayoutArg present_arg(std::string name) { return {std::move(name), LayoutArg::Kind::kPresent, {}}; }
LayoutArg device_arg(std::string name) { return {std::move(name), LayoutArg::Kind::kDevice, {}}; }
LayoutArg norm_ord_arg(std::string name) {
  return {std::move(name), LayoutArg::Kind::kNormOrd, {}};
}
LayoutArg equal_args(std::string name, std::string other) {
  return {std::move(name), LayoutArg::Kind::kEqual, {}, std::move(other)};
}
LocalShapeArg local_shape(std::string name, LocalShapeArg::Kind kind) {
  return {kind, std::move(name)};
}

std::string LayoutArg::to_string() const {
  switch (kind) {
    case Kind::kInts:
      return name + "...";
    case Kind::kCount:
      return "len(" + name + ")";
    case Kind::kText:
      return "\"" + name + "\"";
    case Kind::kPresent:
      return name + "?";
    case Kind::kDevice:
      return "device(" + name + ")";
    case Kind::kEqual:
      return name + "==" + other;
    case Kind::kNormOrd:
      return "class(" + name + ")";
    case Kind::kInt:
      break;
  }
  if (!if_none) return name;
  return absl::StrCat(
      name,
      "=None:", *if_none == std::numeric_limits<int64_t>::max() ? "max" : std::to_string(*if_none));
}

std::string OpEntry::args_text() const {
  return absl::StrJoin(layout_args, ", ",
                       [](std::string* out, const LayoutArg& a) { out->append(a.to_string()); });
}

size_t LayoutArgs::hash() const {
  return ints.empty() && text.empty() && call.empty() ? 0 : absl::HashOf(ints, text, call);
}

std::string LayoutArgs::to_string() const {
  std::string s = "(" + absl::StrJoin(ints, ",");
  if (!text.empty()) s += (ints.empty() ? "\"" : ", \"") + text + "\"";
  return s + ")";
}

Flops flops_of_family(std::string_view family) {
  if (family == "matmul" || family == "custom") return Flops::kContraction;
  if (family == "pointwise") return Flops::kOutputElements;
  return Flops::kNone;
}

double rule_flops(Flops kind, const Rule& rule, const std::vector<int64_t>& shards) {
  auto local = [&](size_t f) {
    const int64_t k = f < shards.size() ? std::max<int64_t>(shards[f], 1) : 1;
    return static_cast<double>((rule.factors[f].size + k - 1) / k);
  };
  double flops = 0;
  switch (kind) {
    case Flops::kNone:
      break;
    case Flops::kOutputElements:
      for (const TensorFactors& out : rule.outputs) {
        double n = 1;
        for (const DimFactors& dim : out) {
          for (int f : dim) n *= local(static_cast<size_t>(f));
        }
        flops += n;
      }
      break;
    case Flops::kContraction:
      flops = 2;
      for (size_t f = 0; f < rule.factors.size(); ++f) flops *= local(f);
      break;
  }
  return flops;
}

const OpEntry* find_op(std::string_view name) {
  Table& t = op_table();
  const absl::string_view key(name.data(), name.size());  // Debian's Abseil has its own
  if (auto it = t.builtin.find(key); it != t.builtin.end()) return &it->second;
  absl::MutexLock lock(&t.mu);
  auto it = t.custom.find(key);
  return it == t.custom.end() ? nullptr : &it->second;
}

std::vector<const OpEntry*> all_ops() {
  Table& t = op_table();
  std::vector<const OpEntry*> out;
  for (const auto& [name, e] : t.builtin) out.push_back(&e);
  {
    absl::MutexLock lock(&t.mu);
    for (const auto& [name, e] : t.custom) out.push_back(&e);
  }
  std::sort(out.begin(), out.end(),
            [](const OpEntry* a, const OpEntry* b) { return a->name < b->name; });
  return out;
}

std::vector<std::string> nearest_ops(std::string_view name, size_t count) {
  const std::string_view base = name.substr(0, name.find('.'));
  std::vector<std::pair<size_t, std::string>> scored;
  for (const OpEntry* e : all_ops()) {
    const std::string_view other = std::string_view(e->name).substr(0, e->name.find('.'));
    scored.emplace_back(edit_distance(base, other) * 100 + edit_distance(name, e->name), e->name);
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && i < count; ++i) out.push_back(scored[i].second);
  return out;
}

void register_custom_op(const std::string& name, std::vector<LayoutArg> layout_args,
                        RuleBuilder build) {
  OpEntry e{name, "custom", std::move(layout_args), false, std::move(build)};
  e.flops = flops_of_family(e.family);
  Table& t = op_table();
  absl::MutexLock lock(&t.mu);
  if (t.builtin.count(name) != 0 || !t.custom.emplace(name, std::move(e)).second) {
    throw Error("register_rule: '" + name + "' already has a rule");
  }
}

void register_rule(const std::string& name, const std::string& rule_text, Linearity linearity) {
  register_custom_op(name, {}, [rule_text, linearity](const Metas& m, const LayoutArgs&) {
    std::vector<std::vector<int64_t>> shapes;
    for (const auto& x : m) shapes.push_back(x.shape);
    return BuiltRule{parse_rule(rule_text, shapes, linearity), {m.at(0).dtype}};
  });
}

}  // namespace dtensor::sharding
