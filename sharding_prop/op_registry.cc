// NOTE [op table]
// One line per supported ATen overload. The builder gets the tensor inputs' metas (in argument
// order; 0-dim and Python scalars are not inputs) and the layout arguments, whose meaning each
// line states. In-place overloads (`add_.Tensor`) are marked: their self keeps its layout.
// `.out` overloads shard like their functional form (the out tensor is checked by the caller).

#include "sharding_prop/op_registry.h"

#include "base/error.h"
#include "sharding_prop/op_builders.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>

#include <absl/hash/hash.h>
#include "base/strings.h"

namespace dtensor::sharding {
namespace {

using namespace builders;  // NOLINT: the table names the family builders

std::vector<OpEntry> build_table() {
  const auto lin = Linearity::kNone;
  std::vector<OpEntry> t;
  auto add = [&](std::string name, std::string family, std::string args, RuleBuilder b) {
    const bool in_place =
        name.find("_.") != std::string::npos || (name.size() > 1 && name.back() == '_');
    t.push_back({std::move(name), std::move(family), std::move(args), in_place, std::move(b)});
  };
  // Unary pointwise (functional, in-place, out).
  for (const char* op :
       {"abs",  "exp",    "log",         "sqrt",        "rsqrt", "tanh",  "sigmoid",
        "relu", "sin",    "cos",         "reciprocal",  "erf",   "log1p", "expm1",
        "sign", "square", "logical_not", "bitwise_not", "silu",  "gelu"}) {
    add(std::string("aten::") + op, "pointwise", "", pointwise(1, lin));
    add(std::string("aten::") + op + "_", "pointwise", "", pointwise(1, lin));
    add(std::string("aten::") + op + ".out", "pointwise", "", pointwise(1, lin));
  }
  add("aten::neg", "pointwise", "", pointwise(1, Linearity::kAdditive));
  add("aten::neg_", "pointwise", "", pointwise(1, Linearity::kAdditive));
  add("aten::gelu_backward", "pointwise", "", pointwise(2, lin));
  add("aten::silu_backward", "pointwise", "", pointwise(2, lin));
  add("aten::threshold_backward", "pointwise", "", pointwise(2, lin));
  add("aten::sigmoid_backward", "pointwise", "", pointwise(2, lin));
  add("aten::tanh_backward", "pointwise", "", pointwise(2, lin));
  add("aten::clamp", "pointwise", "", pointwise(1, lin));
  add("aten::clamp_", "pointwise", "", pointwise(1, lin));
  add("aten::pow.Tensor_Scalar", "pointwise", "", pointwise(1, lin));
  add("aten::pow_.Tensor_Scalar", "pointwise", "", pointwise(1, lin));
  add("aten::pow.Tensor_Tensor", "pointwise", "", pointwise(2, lin));
  add("aten::fill_.Scalar", "pointwise", "", pointwise(1, lin));
  add("aten::zero_", "pointwise", "", pointwise(1, Linearity::kMove));
  add("aten::clone", "pointwise", "", pointwise(1, Linearity::kMove));
  add("aten::contiguous", "pointwise", "", pointwise(1, Linearity::kMove));
  add("aten::detach", "pointwise", "", pointwise(1, Linearity::kMove));
  add("aten::alias", "pointwise", "", pointwise(1, Linearity::kMove));
  add("aten::copy_", "pointwise", "", pointwise(2, lin));
  add("aten::_to_copy", "pointwise", "dtype (ScalarType, -1: keep)", cast_rule);
  add("aten::masked_fill.Scalar", "pointwise", "", pointwise(2, lin));
  add("aten::masked_fill_.Scalar", "pointwise", "", pointwise(2, lin));
  add("aten::where.self", "pointwise", "", where_rule);
  // Binary pointwise.
  for (const char* op : {"add.Tensor", "sub.Tensor"}) {
    for (const char* v : {"", "_"}) {
      std::string name = std::string("aten::") + op;
      name.insert(name.find('.'), v);
      add(name, "pointwise", "", pointwise(2, Linearity::kAdditive));
    }
  }
  add("aten::add.out", "pointwise", "", pointwise(2, Linearity::kAdditive));
  add("aten::mul.Tensor", "pointwise", "", pointwise(2, Linearity::kMultilinear));
  add("aten::mul_.Tensor", "pointwise", "", pointwise(2, Linearity::kMultilinear));
  add("aten::mul.out", "pointwise", "", pointwise(2, Linearity::kMultilinear));
  add("aten::div.Tensor", "pointwise", "", pointwise(2, Linearity::kMultilinear, {true, false}));
  add("aten::div_.Tensor", "pointwise", "", pointwise(2, Linearity::kMultilinear, {true, false}));
  for (const char* v : {"", "_"}) {
    const std::string base = "aten::";
    add(base + "add" + v + ".Scalar", "pointwise", "", pointwise(1, lin));
    add(base + "sub" + v + ".Scalar", "pointwise", "", pointwise(1, lin));
    add(base + "mul" + v + ".Scalar", "pointwise", "", pointwise(1, Linearity::kAdditive));
    add(base + "div" + v + ".Scalar", "pointwise", "", pointwise(1, Linearity::kAdditive));
    add(base + "pow" + v + ".Scalar", "pointwise", "", pointwise(1, lin));
  }
  add("aten::rsub.Scalar", "pointwise", "", pointwise(1, lin));
  for (const char* op : {"maximum", "minimum", "atan2", "logical_and", "logical_or",
                         "bitwise_and.Tensor", "bitwise_or.Tensor", "bitwise_xor.Tensor"}) {
    add(std::string("aten::") + op, "pointwise", "", pointwise(2, lin));
  }
  for (const char* op : {"eq", "ne", "lt", "le", "gt", "ge"}) {
    add(std::string("aten::") + op + ".Tensor", "pointwise", "", pointwise(2, lin, {}, true));
    add(std::string("aten::") + op + ".Scalar", "pointwise", "", pointwise(1, lin, {}, true));
  }
  for (const char* v : {"", "_"}) {  // optimizer steps (Adam) use the in-place forms
    const std::string base = "aten::";
    add(base + "addcmul" + v, "pointwise", "", pointwise(3, lin));
    add(base + "addcdiv" + v, "pointwise", "", pointwise(3, lin));
    add(base + "lerp" + v + ".Scalar", "pointwise", "", pointwise(2, lin));
  }
  // Reductions: ints = keepdim, dims... (no dims: every dim).
  const std::string rd = "keepdim, dims... (none: all)";
  add("aten::sum", "reduction", "", reduction(ReduceOp::kSum, false, Linearity::kAdditive));
  add("aten::sum.dim_IntList", "reduction", rd,
      reduction(ReduceOp::kSum, false, Linearity::kAdditive));
  add("aten::mean", "reduction", "", reduction(ReduceOp::kAvg, false, Linearity::kAdditive));
  add("aten::mean.dim", "reduction", rd, reduction(ReduceOp::kAvg, false, Linearity::kAdditive));
  add("aten::prod", "reduction", "", reduction(ReduceOp::kProduct, false, lin));
  add("aten::prod.dim_int", "reduction", rd, reduction(ReduceOp::kProduct, false, lin));
  add("aten::amax", "reduction", rd, reduction(ReduceOp::kMax, false, lin));
  add("aten::amin", "reduction", rd, reduction(ReduceOp::kMin, false, lin));
  add("aten::max", "reduction", "", reduction(ReduceOp::kMax, false, lin));
  add("aten::min", "reduction", "", reduction(ReduceOp::kMin, false, lin));
  add("aten::max.dim", "reduction", rd, reduction(ReduceOp::kMax, true, lin, -1, 2));
  add("aten::min.dim", "reduction", rd, reduction(ReduceOp::kMin, true, lin, -1, 2));
  add("aten::argmax", "reduction", rd,
      reduction(ReduceOp::kMax, true, lin, static_cast<int>(c10::kLong)));
  add("aten::argmin", "reduction", rd,
      reduction(ReduceOp::kMin, true, lin, static_cast<int>(c10::kLong)));
  add("aten::var.correction", "reduction", rd, reduction(ReduceOp::kSum, true, lin));
  add("aten::std.correction", "reduction", rd, reduction(ReduceOp::kSum, true, lin));
  add("aten::linalg_vector_norm", "reduction", rd, reduction(ReduceOp::kSum, true, lin));
  add("aten::any.dim", "reduction", rd,
      reduction(ReduceOp::kMax, true, lin, static_cast<int>(c10::kBool)));
  add("aten::all.dim", "reduction", rd,
      reduction(ReduceOp::kMin, true, lin, static_cast<int>(c10::kBool)));
  add("aten::any", "reduction", "",
      reduction(ReduceOp::kMax, true, lin, static_cast<int>(c10::kBool)));
  add("aten::all", "reduction", "",
      reduction(ReduceOp::kMin, true, lin, static_cast<int>(c10::kBool)));
  // Softmax: ints = dim.
  add("aten::_softmax", "softmax", "dim", softmax(1));
  add("aten::_log_softmax", "softmax", "dim", softmax(1));
  add("aten::_softmax_backward_data", "softmax", "dim", softmax(2));
  add("aten::_log_softmax_backward_data", "softmax", "dim", softmax(2));
  // Matmul family.
  add("aten::mm", "matmul", "", mm_rule);
  add("aten::bmm", "matmul", "", bmm_rule);
  add("aten::matmul", "matmul", "", matmul_rule_of);
  add("aten::addmm", "matmul", "", addmm_rule_of);
  add("aten::baddbmm", "matmul", "", addmm_rule_of);
  add("aten::linear", "matmul", "", linear_rule_of);
  add("aten::einsum", "matmul", "text: the equation", einsum_rule);
  add("aten::t", "view", "", t_rule);
  // Views and shape ops.
  add("aten::view", "view", "sizes (one -1 allowed)", view_rule);
  add("aten::reshape", "view", "sizes (one -1 allowed)", view_rule);
  add("aten::_unsafe_view", "view", "sizes", view_rule);
  add("aten::flatten.using_ints", "view", "start_dim, end_dim", flatten_rule);
  add("aten::unflatten.int", "view", "dim, sizes...", unflatten_rule);
  add("aten::squeeze", "view", "", squeeze_rule);
  add("aten::squeeze.dim", "view", "dim", squeeze_rule);
  add("aten::unsqueeze", "view", "dim", unsqueeze_rule);
  add("aten::transpose.int", "view", "dim0, dim1", transpose_rule);
  add("aten::permute", "view", "dims...", permute_rule_of);
  add("aten::expand", "view", "sizes (-1 keeps a size)", expand_rule_of);
  add("aten::slice.Tensor", "view", "dim, start, end, step", slice_of);
  add("aten::narrow", "view", "dim, start, length", narrow_of);
  add("aten::select.int", "view", "dim", select_of);
  add("aten::split.Tensor", "view", "split_size, dim", split_of);
  add("aten::split_with_sizes", "view", "dim, sizes...", split_sizes_of);
  add("aten::chunk", "view", "chunks, dim", chunk_of);
  add("aten::index_select", "index", "dim", index_select_of);
  add("aten::slice_backward", "view", "dim, start, end, step, input_sizes...", slice_backward_of);
  add("aten::select_backward", "view", "dim, input_sizes...", select_backward_of);
  add("aten::scatter_add", "index", "dim", scatter_of);
  add("aten::scatter.src", "index", "dim", scatter_of);
  add("aten::index_add", "index", "dim", index_add_of);
  add("aten::value_selecting_reduction_backward", "reduction", "dim, keepdim, sizes...",
      value_selecting_backward_of);
  add("aten::gather", "index", "dim", gather_of);
  add("aten::embedding", "embedding", "", embedding_of);
  add("aten::embedding_dense_backward", "embedding", "num_weights", embedding_backward_of);
  add("aten::native_layer_norm", "norm", "number of normalized dims", layer_norm_of);
  add("aten::native_layer_norm_backward", "norm", "number of normalized dims",
      layer_norm_backward_of);
  add("aten::nll_loss_forward", "loss", "reduction (0 none, 1 mean, 2 sum)", nll_loss_of);
  add("aten::nll_loss_backward", "loss", "reduction (0 none, 1 mean, 2 sum)", nll_loss_backward_of);
  add("aten::_scaled_dot_product_attention", "attention", "", sdpa_of);
  add("aten::_scaled_dot_product_attention_math", "attention", "", sdpa_of);
  add("aten::native_dropout", "pointwise", "", dropout_of);
  add("aten::native_dropout_backward", "pointwise", "", pointwise(2, lin));
  for (const char* op :
       {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like"}) {
    add(std::string("aten::") + op, "factory", "", pointwise(1, Linearity::kShapeOnly));
  }
  add("aten::randint_like", "factory", "", pointwise(1, Linearity::kShapeOnly));
  add("aten::randint_like.low_dtype", "factory", "", pointwise(1, Linearity::kShapeOnly));
  add("aten::bernoulli.p", "random", "", pointwise(1, Linearity::kShapeOnly));
  // In-place random fills: self keeps its layout (a Partial self is refused).
  for (const char* op : {"uniform_", "normal_", "bernoulli_.float", "random_", "random_.from",
                         "random_.to", "exponential_"}) {
    add(std::string("aten::") + op, "random", "", pointwise(1, lin));
  }
  for (const char* op : {"new_zeros", "new_ones", "new_empty", "new_full"}) {
    add(std::string("aten::") + op, "factory", "sizes", new_factory_of);
  }
  // `.out` overloads of the common non-pointwise ops (the out tensor is not an input).
  add("aten::mm.out", "matmul", "", mm_rule);
  add("aten::bmm.out", "matmul", "", bmm_rule);
  add("aten::addmm.out", "matmul", "", addmm_rule_of);
  add("aten::sum.IntList_out", "reduction", rd,
      reduction(ReduceOp::kSum, false, Linearity::kAdditive));
  add("aten::mean.out", "reduction", rd, reduction(ReduceOp::kAvg, false, Linearity::kAdditive));
  add("aten::cat.out", "cat", "dim", concat(false));
  add("aten::cat", "cat", "dim", concat(false));
  add("aten::stack", "cat", "dim", concat(true));
  std::sort(t.begin(), t.end(), [](const OpEntry& a, const OpEntry& b) { return a.name < b.name; });
  return t;
}

struct Table {
  std::mutex mu;
  std::map<std::string, OpEntry, std::less<>> ops;
  Table() {
    for (auto& e : build_table()) ops.emplace(e.name, std::move(e));
  }
};

Table& table() {
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

size_t LayoutArgs::hash() const {
  return absl::HashOf(ints, text);
}

std::string LayoutArgs::to_string() const {
  std::string s = "(" + join(ints, ",");
  if (!text.empty()) s += (ints.empty() ? "\"" : ", \"") + text + "\"";
  return s + ")";
}

const OpEntry* find_op(std::string_view name) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.ops.find(name);
  return it == t.ops.end() ? nullptr : &it->second;
}

std::vector<const OpEntry*> all_ops() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::vector<const OpEntry*> out;
  for (const auto& [name, e] : t.ops) out.push_back(&e);
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

void register_rule(const std::string& name, const std::string& rule_text, Linearity linearity) {
  OpEntry e{name, "custom", "rule \"" + rule_text + "\"", false,
            [rule_text, linearity](const Metas& m, const LayoutArgs&) {
              std::vector<std::vector<int64_t>> shapes;
              for (const auto& x : m) shapes.push_back(x.shape);
              return BuiltRule{parse_rule(rule_text, shapes, linearity), {m.at(0).dtype}};
            }};
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.ops.emplace(name, std::move(e)).second) {
    throw Error("register_rule: '" + name + "' already has a rule");
  }
}

}  // namespace dtensor::sharding
