// NOTE [op table]
// One line per supported ATen overload. The builder gets the tensor inputs' metas (in argument
// order; 0-dim and Python scalars are not inputs) and the layout arguments, whose meaning each
// line states. In-place overloads (`add_.Tensor`) are marked: their self keeps its layout.
// `.out` overloads shard like their functional form (the out tensor is checked by the caller).

#include "sharding_prop/op_registry.h"

#include "base/error.h"
#include "sharding_prop/op_builders.h"

#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>

#include <absl/container/node_hash_map.h>
#include <absl/hash/hash.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>

namespace dtensor::sharding {
namespace {

using namespace builders;  // NOLINT: the table names the family builders

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
  void operator()(std::string name, std::string family, std::vector<LayoutArg> args, RuleBuilder b,
                  LocalShapeArg shape = {}, Execution execution = Execution::kPieces) {
    const bool in_place =
        name.find("_.") != std::string::npos || (name.size() > 1 && name.back() == '_');
    entries.push_back({std::move(name), std::move(family), std::move(args), in_place, std::move(b),
                       std::move(shape), execution});
  }
};

constexpr Linearity lin = Linearity::kNone;
const LocalShapeArg same_shape;  // no shape argument
constexpr Execution random_draw = Execution::kRandom;
// Reductions: keepdim, then the reduced dims (none: every dim).
std::vector<LayoutArg> reduce_args() { return {int_arg("keepdim"), ints_arg("dim")}; }

void add_unary_pointwise(Adder& add) {
  // Unary pointwise (functional, in-place, out).
  for (const char* op :
       {"abs",  "exp",    "log",         "sqrt",        "rsqrt", "tanh",  "sigmoid",
        "relu", "sin",    "cos",         "reciprocal",  "erf",   "log1p", "expm1",
        "sign", "square", "logical_not", "bitwise_not", "silu",  "gelu"}) {
    add(std::string("aten::") + op, "pointwise", {}, pointwise(1, lin));
    add(std::string("aten::") + op + "_", "pointwise", {}, pointwise(1, lin));
    add(std::string("aten::") + op + ".out", "pointwise", {}, pointwise(1, lin));
  }
  add("aten::neg", "pointwise", {}, pointwise(1, Linearity::kAdditive));
  add("aten::neg_", "pointwise", {}, pointwise(1, Linearity::kAdditive));
  add("aten::gelu_backward", "pointwise", {}, pointwise(2, lin));
  add("aten::silu_backward", "pointwise", {}, pointwise(2, lin));
  add("aten::threshold_backward", "pointwise", {}, pointwise(2, lin));
  add("aten::sigmoid_backward", "pointwise", {}, pointwise(2, lin));
  add("aten::tanh_backward", "pointwise", {}, pointwise(2, lin));
  add("aten::clamp", "pointwise", {}, pointwise(1, lin));
  add("aten::clamp_", "pointwise", {}, pointwise(1, lin));
  add("aten::pow.Tensor_Scalar", "pointwise", {}, pointwise(1, lin));
  add("aten::pow_.Tensor_Scalar", "pointwise", {}, pointwise(1, lin));
  add("aten::pow.Tensor_Tensor", "pointwise", {}, pointwise(2, lin));
  add("aten::fill_.Scalar", "pointwise", {}, pointwise(1, lin));
  add("aten::zero_", "pointwise", {}, pointwise(1, Linearity::kMove));
  add("aten::clone", "pointwise", {}, pointwise(1, Linearity::kMove));
  add("aten::contiguous", "pointwise", {}, pointwise(1, Linearity::kMove));
  add("aten::detach", "pointwise", {}, pointwise(1, Linearity::kMove));
  add("aten::alias", "pointwise", {}, pointwise(1, Linearity::kMove));
  add("aten::copy_", "pointwise", {}, pointwise(2, lin));
  add("aten::_to_copy", "pointwise", {int_arg("dtype", -1)}, cast_rule);
  add("aten::masked_fill.Scalar", "pointwise", {}, pointwise(2, lin));
  add("aten::masked_fill_.Scalar", "pointwise", {}, pointwise(2, lin));
  add("aten::where.self", "pointwise", {}, where_rule);
}

// Every other elementwise op (functional, in-place and out= overloads): one rule shape (pointwise),
// the outputs' dtypes from ATen's meta
// kernels (NOTE [output metadata from ATen]). Partial inputs are reduced first (Linearity::kNone).
// Left to the replicate fallback on purpose: polar and complex (no meta kernel in torch 1.13, and a
// pointwise rule's dtype would be real), clamp_min_/clamp_max_ (cosine_similarity clamps a
// Partial norm in place: the fallback makes it Replicate, a rule would have to refuse it).
void add_elementwise(Adder& add) {
  // clang-format off
  // unary
  for (const char* op : {
           "acos", "acos_", "acosh", "acosh_", "asin", "asin_", "asinh", "asinh_", "atan", "atan_",
           "atanh", "atanh_", "ceil", "ceil_", "cosh", "cosh_", "floor", "floor_", "frac", "frac_",
           "round", "round_", "round.decimals", "round_.decimals", "trunc", "trunc_", "sinh",
           "sinh_", "tan", "tan_", "log10", "log10_", "log2", "log2_", "exp2", "exp2_", "erfc",
           "erfc_", "erfinv", "erfinv_", "lgamma", "lgamma_", "digamma", "digamma_", "i0", "i0_",
           "sgn", "sgn_", "sinc", "sinc_", "conj_physical", "conj_physical_", "nan_to_num",
           "nan_to_num_", "deg2rad", "deg2rad_", "rad2deg", "rad2deg_", "logit", "logit_",
           "hardsigmoid", "hardsigmoid_", "hardswish", "hardswish_", "mish", "mish_", "softplus",
           "elu", "elu_", "celu", "celu_", "selu", "selu_", "leaky_relu", "leaky_relu_",
           "hardtanh", "hardtanh_", "hardshrink", "softshrink", "threshold", "threshold_",
           "log_sigmoid", "polygamma", "polygamma_", "mvlgamma", "mvlgamma_", "fix", "fix_",
           "positive", "special_airy_ai", "special_bessel_j0", "special_bessel_j1",
           "special_bessel_y0", "special_bessel_y1", "special_entr", "special_erfcx",
           "special_i0e", "special_i1", "special_i1e", "special_log_ndtr",
           "special_modified_bessel_i0", "special_modified_bessel_i1",
           "special_modified_bessel_k0", "special_modified_bessel_k1", "special_ndtri",
           "special_scaled_modified_bessel_k0", "special_scaled_modified_bessel_k1",
           "special_spherical_bessel_j0", "clamp_min", "clamp_max", "float_power.Tensor_Scalar",
           "acos.out", "acosh.out", "asin.out", "asinh.out", "atan.out", "atanh.out", "ceil.out",
           "cosh.out", "floor.out", "frac.out", "round.out", "round.decimals_out", "trunc.out",
           "sinh.out", "tan.out", "log10.out", "log2.out", "exp2.out", "erfc.out", "erfinv.out",
           "lgamma.out", "digamma.out", "i0.out", "sgn.out", "sinc.out", "conj_physical.out",
           "nan_to_num.out", "deg2rad.out", "rad2deg.out", "logit.out", "hardsigmoid.out",
           "hardswish.out", "mish.out", "softplus.out", "elu.out", "celu.out", "leaky_relu.out",
           "hardtanh.out", "hardshrink.out", "softshrink.out", "threshold.out", "log_sigmoid.out",
           "polygamma.out", "mvlgamma.out", "fix.out", "special_airy_ai.out",
           "special_bessel_j0.out", "special_bessel_j1.out", "special_bessel_y0.out",
           "special_bessel_y1.out", "special_entr.out", "special_erfcx.out", "special_i0e.out",
           "special_i1.out", "special_i1e.out", "special_log_ndtr.out",
           "special_modified_bessel_i0.out", "special_modified_bessel_i1.out",
           "special_modified_bessel_k0.out", "special_modified_bessel_k1.out", "special_ndtri.out",
           "special_scaled_modified_bessel_k0.out", "special_scaled_modified_bessel_k1.out",
           "special_spherical_bessel_j0.out", "clamp_min.out", "clamp_max.out",
           "float_power.Tensor_Scalar_out"}) {
    add(std::string("aten::") + op, "pointwise", {}, pointwise(1, lin));
  }
  // unary, bool out
  for (const char* op :
       {"isnan", "isinf", "isneginf", "isposinf", "signbit", "isfinite", "isreal"}) {
    add(std::string("aten::") + op, "pointwise", {}, pointwise(1, lin, {}, true));
  }
  // binary
  for (const char* op : {
           "copysign.Tensor", "copysign_.Tensor", "floor_divide", "fmax", "fmin", "fmod.Tensor",
           "fmod_.Tensor", "heaviside", "heaviside_", "hypot", "hypot_", "igamma", "igamma_",
           "igammac", "igammac_", "logaddexp", "logaddexp2", "nextafter", "nextafter_",
           "remainder.Tensor", "remainder_.Tensor", "xlogy.Tensor", "xlogy_.Tensor",
           "special_xlog1py", "special_zeta", "div.Tensor_mode", "div_.Tensor_mode", "rsub.Tensor",
           "clamp_min.Tensor", "clamp_min_.Tensor", "clamp_max.Tensor", "clamp_max_.Tensor",
           "bitwise_and_.Tensor", "bitwise_or_.Tensor", "bitwise_xor_.Tensor",
           "float_power.Tensor_Tensor", "special_chebyshev_polynomial_t",
           "special_chebyshev_polynomial_u", "special_chebyshev_polynomial_v",
           "special_chebyshev_polynomial_w", "special_hermite_polynomial_h",
           "special_hermite_polynomial_he", "special_laguerre_polynomial_l",
           "special_legendre_polynomial_p", "special_shifted_chebyshev_polynomial_t",
           "special_shifted_chebyshev_polynomial_u", "special_shifted_chebyshev_polynomial_v",
           "special_shifted_chebyshev_polynomial_w", "bitwise_left_shift.Tensor",
           "bitwise_left_shift_.Tensor", "bitwise_right_shift.Tensor",
           "bitwise_right_shift_.Tensor", "gcd", "gcd_", "lcm", "lcm_", "fmod.Scalar",
           "fmod_.Scalar", "remainder.Scalar", "remainder_.Scalar", "copysign.Scalar",
           "copysign_.Scalar", "xlogy.Scalar_Other", "xlogy_.Scalar_Other", "bitwise_and.Scalar",
           "bitwise_and_.Scalar", "bitwise_or.Scalar", "bitwise_or_.Scalar", "bitwise_xor.Scalar",
           "bitwise_xor_.Scalar", "floor_divide.out", "fmax.out", "fmin.out", "fmod.Tensor_out",
           "heaviside.out", "hypot.out", "igamma.out", "igammac.out", "logaddexp.out",
           "logaddexp2.out", "nextafter.out", "remainder.Tensor_out", "special_xlog1py.out",
           "special_zeta.out", "rsub.Tensor_out", "clamp_min.Tensor_out", "clamp_max.Tensor_out",
           "float_power.Tensor_Tensor_out", "special_chebyshev_polynomial_t.out",
           "special_chebyshev_polynomial_u.out", "special_chebyshev_polynomial_v.out",
           "special_chebyshev_polynomial_w.out", "special_hermite_polynomial_h.out",
           "special_hermite_polynomial_he.out", "special_laguerre_polynomial_l.out",
           "special_legendre_polynomial_p.out", "special_shifted_chebyshev_polynomial_t.out",
           "special_shifted_chebyshev_polynomial_u.out",
           "special_shifted_chebyshev_polynomial_v.out",
           "special_shifted_chebyshev_polynomial_w.out", "bitwise_left_shift.Tensor_out",
           "bitwise_right_shift.Tensor_out", "gcd.out", "lcm.out", "fmod.Scalar_out",
           "remainder.Scalar_out", "copysign.Scalar_out", "bitwise_and.Scalar_out",
           "bitwise_or.Scalar_out", "bitwise_xor.Scalar_out"}) {
    add(std::string("aten::") + op, "pointwise", {}, pointwise(2, lin));
  }
  // binary, bool out
  for (const char* op : {
           "logical_xor", "logical_xor_", "logical_xor.out"}) {
    add(std::string("aten::") + op, "pointwise", {}, pointwise(2, lin, {}, true));
  }
  // ternary
  for (const char* op :
       {"clamp.Tensor", "clamp_.Tensor", "masked_fill.Tensor", "masked_fill_.Tensor", "lerp.Tensor",
        "lerp_.Tensor", "clamp.Tensor_out", "masked_fill.Tensor_out", "lerp.Tensor_out"}) {
    add(std::string("aten::") + op, "pointwise", {}, pointwise(3, lin));
  }
  // their backward kernels (grad, input[, buffer])
  for (const char* op :
       {"elu_backward", "hardshrink_backward", "hardsigmoid_backward", "hardswish_backward",
        "hardtanh_backward", "leaky_relu_backward", "logit_backward", "softplus_backward",
        "softshrink_backward", "mish_backward", "log_sigmoid_backward"}) {
    add(std::string("aten::") + op, "pointwise", {}, pointwise(3, lin));
  }
  // clang-format on
}

void add_binary_pointwise(Adder& add) {
  // Binary pointwise.
  for (const char* op : {"add.Tensor", "sub.Tensor"}) {
    for (const char* v : {"", "_"}) {
      std::string name = std::string("aten::") + op;
      name.insert(name.find('.'), v);
      add(name, "pointwise", {}, pointwise(2, Linearity::kAdditive));
    }
  }
  add("aten::add.out", "pointwise", {}, pointwise(2, Linearity::kAdditive));
  add("aten::mul.Tensor", "pointwise", {}, pointwise(2, Linearity::kMultilinear));
  add("aten::mul_.Tensor", "pointwise", {}, pointwise(2, Linearity::kMultilinear));
  add("aten::mul.out", "pointwise", {}, pointwise(2, Linearity::kMultilinear));
  add("aten::div.Tensor", "pointwise", {}, pointwise(2, Linearity::kMultilinear, {true, false}));
  add("aten::div_.Tensor", "pointwise", {}, pointwise(2, Linearity::kMultilinear, {true, false}));
  for (const char* v : {"", "_"}) {
    const std::string base = "aten::";
    add(base + "add" + v + ".Scalar", "pointwise", {}, pointwise(1, lin));
    add(base + "sub" + v + ".Scalar", "pointwise", {}, pointwise(1, lin));
    add(base + "mul" + v + ".Scalar", "pointwise", {}, pointwise(1, Linearity::kAdditive));
    add(base + "div" + v + ".Scalar", "pointwise", {}, pointwise(1, Linearity::kAdditive));
    add(base + "pow" + v + ".Scalar", "pointwise", {}, pointwise(1, lin));
  }
  add("aten::rsub.Scalar", "pointwise", {}, pointwise(1, lin));
  for (const char* op : {"maximum", "minimum", "atan2", "logical_and", "logical_or",
                         "bitwise_and.Tensor", "bitwise_or.Tensor", "bitwise_xor.Tensor"}) {
    add(std::string("aten::") + op, "pointwise", {}, pointwise(2, lin));
  }
  for (const char* op : {"eq", "ne", "lt", "le", "gt", "ge"}) {
    add(std::string("aten::") + op + ".Tensor", "pointwise", {}, pointwise(2, lin, {}, true));
    add(std::string("aten::") + op + ".Scalar", "pointwise", {}, pointwise(1, lin, {}, true));
  }
  for (const char* v : {"", "_"}) {  // optimizer steps (Adam) use the in-place forms
    const std::string base = "aten::";
    add(base + "addcmul" + v, "pointwise", {}, pointwise(3, lin));
    add(base + "addcdiv" + v, "pointwise", {}, pointwise(3, lin));
    add(base + "lerp" + v + ".Scalar", "pointwise", {}, pointwise(2, lin));
  }
}

void add_reductions(Adder& add) {
  add("aten::sum", "reduction", {}, reduction(ReduceOp::kSum, false, Linearity::kAdditive));
  add("aten::sum.dim_IntList", "reduction", reduce_args(),
      reduction(ReduceOp::kSum, false, Linearity::kAdditive));
  add("aten::mean", "reduction", {}, reduction(ReduceOp::kAvg, false, Linearity::kAdditive));
  add("aten::mean.dim", "reduction", reduce_args(),
      reduction(ReduceOp::kAvg, false, Linearity::kAdditive));
  add("aten::prod", "reduction", {}, reduction(ReduceOp::kProduct, false, lin));
  add("aten::prod.dim_int", "reduction", reduce_args(), reduction(ReduceOp::kProduct, false, lin));
  add("aten::amax", "reduction", reduce_args(), reduction(ReduceOp::kMax, false, lin));
  add("aten::amin", "reduction", reduce_args(), reduction(ReduceOp::kMin, false, lin));
  add("aten::max", "reduction", {}, reduction(ReduceOp::kMax, false, lin));
  add("aten::min", "reduction", {}, reduction(ReduceOp::kMin, false, lin));
  add("aten::max.dim", "reduction", reduce_args(), reduction(ReduceOp::kMax, true, lin, -1, 2));
  add("aten::min.dim", "reduction", reduce_args(), reduction(ReduceOp::kMin, true, lin, -1, 2));
  add("aten::argmax", "reduction", reduce_args(),
      reduction(ReduceOp::kMax, true, lin, static_cast<int>(c10::kLong)));
  add("aten::argmin", "reduction", reduce_args(),
      reduction(ReduceOp::kMin, true, lin, static_cast<int>(c10::kLong)));
  add("aten::var.correction", "reduction", reduce_args(), reduction(ReduceOp::kSum, true, lin));
  add("aten::std.correction", "reduction", reduce_args(), reduction(ReduceOp::kSum, true, lin));
  add("aten::linalg_vector_norm", "reduction", reduce_args(), reduction(ReduceOp::kSum, true, lin));
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
  add("aten::view", "view", {ints_arg("size")}, view_rule, local_shape("size"));
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
      slice_backward_of, local_shape("input_sizes"));
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
}

// Pooling, upsampling and reflection/replication padding: the batch dim passes, channel and
// spatial dims stay whole (their output sizes from ATen's meta kernels). Only ops with a C++ meta
// kernel in torch 1.13 are here (a C++ program has no Python meta registrations): the others
// (max_pool3d_with_indices, _adaptive_avg_pool2d/3d, reflection_pad2d, some pad backward ops,
// max_unpool) are left to the replicate fallback. Convolution computes its own output sizes.
// Elementwise losses and their backward ops (reduction decides: elementwise_loss).
void add_losses(Adder& add) {
  const std::vector<LayoutArg> reduction = {int_arg("reduction")};
  for (const char* op : {"mse_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss"}) {
    add(std::string("aten::") + op, "loss", reduction, elementwise_loss(2, false));
  }
  add("aten::binary_cross_entropy", "loss", reduction, elementwise_loss(3, false));
  add("aten::binary_cross_entropy_with_logits", "loss", reduction, elementwise_loss(4, false));
  for (const char* op : {"mse_loss_backward", "soft_margin_loss_backward"}) {
    add(std::string("aten::") + op, "loss", reduction, elementwise_loss(3, true));
  }
  add("aten::binary_cross_entropy_backward", "loss", reduction, elementwise_loss(4, true));
}

void add_group_norm(Adder& add) {
  add("aten::native_group_norm", "norm", {int_arg("group")}, group_norm_of,
      local_shape("N", LocalShapeArg::Kind::kFirstSize));
  add("aten::native_group_norm_backward", "norm", {int_arg("group")}, group_norm_backward_of,
      local_shape("N", LocalShapeArg::Kind::kFirstSize));
}

void add_spatial(Adder& add) {
  add("aten::convolution", "nn",
      {int_arg("transposed"), int_arg("groups"), count_arg("stride"), ints_arg("stride"),
       count_arg("padding"), ints_arg("padding"), count_arg("dilation"), ints_arg("dilation"),
       count_arg("output_padding"), ints_arg("output_padding")},
      convolution_of);
  add("aten::convolution_backward", "nn", {int_arg("transposed"), int_arg("groups")},
      convolution_backward_of);
  add("aten::upsample_nearest1d.vec", "nn", {}, spatial(1));
  add("aten::upsample_linear1d.vec", "nn", {}, spatial(1));
  add("aten::upsample_nearest1d_backward.vec", "nn", {}, spatial(1), local_shape("input_size"));
  add("aten::upsample_linear1d_backward.vec", "nn", {}, spatial(1), local_shape("input_size"));
  add("aten::reflection_pad1d", "nn", {}, spatial(1));
  add("aten::reflection_pad1d_backward", "nn", {}, spatial(1));
  add("aten::replication_pad1d", "nn", {}, spatial(1));
  add("aten::replication_pad1d_backward", "nn", {}, spatial(1));
  add("aten::avg_pool2d", "nn", {}, spatial(2));
  add("aten::avg_pool2d_backward", "nn", {}, spatial(2));
  add("aten::max_pool2d_with_indices", "nn", {}, spatial(2, 2));
  add("aten::max_pool2d_with_indices_backward", "nn", {}, spatial(2));
  add("aten::adaptive_max_pool2d", "nn", {}, spatial(2, 2));
  add("aten::adaptive_max_pool2d_backward", "nn", {}, spatial(2));
  add("aten::upsample_nearest2d.vec", "nn", {}, spatial(2));
  add("aten::upsample_bilinear2d.vec", "nn", {}, spatial(2));
  add("aten::upsample_bicubic2d.vec", "nn", {}, spatial(2));
  add("aten::upsample_nearest2d_backward.vec", "nn", {}, spatial(2), local_shape("input_size"));
  add("aten::upsample_bilinear2d_backward.vec", "nn", {}, spatial(2), local_shape("input_size"));
  add("aten::upsample_bicubic2d_backward.vec", "nn", {}, spatial(2), local_shape("input_size"));
  add("aten::replication_pad2d", "nn", {}, spatial(2));
  add("aten::avg_pool3d", "nn", {}, spatial(3));
  add("aten::avg_pool3d_backward", "nn", {}, spatial(3));
  add("aten::adaptive_max_pool3d", "nn", {}, spatial(3, 2));
  add("aten::adaptive_max_pool3d_backward", "nn", {}, spatial(3));
  add("aten::upsample_nearest3d.vec", "nn", {}, spatial(3));
  add("aten::upsample_trilinear3d.vec", "nn", {}, spatial(3));
  add("aten::upsample_nearest3d_backward.vec", "nn", {}, spatial(3), local_shape("input_size"));
  add("aten::upsample_trilinear3d_backward.vec", "nn", {}, spatial(3), local_shape("input_size"));
  add("aten::reflection_pad3d", "nn", {}, spatial(3));
  add("aten::reflection_pad3d_backward", "nn", {}, spatial(3));
  add("aten::replication_pad3d", "nn", {}, spatial(3));
}

void add_nn(Adder& add) {
  add("aten::embedding", "embedding", {}, embedding_of, same_shape, Execution::kMaskedEmbedding);
  add("aten::embedding_dense_backward", "embedding", {int_arg("num_weights")},
      embedding_backward_of, local_shape("num_weights", LocalShapeArg::Kind::kFirstSize));
  add("aten::native_layer_norm", "norm", {count_arg("normalized_shape")}, layer_norm_of);
  add("aten::native_layer_norm_backward", "norm", {count_arg("normalized_shape")},
      layer_norm_backward_of);
  add("aten::nll_loss_forward", "loss", {int_arg("reduction")}, nll_loss_of);
  add("aten::nll_loss_backward", "loss", {int_arg("reduction")}, nll_loss_backward_of);
  add("aten::_scaled_dot_product_attention", "attention", {}, sdpa_of);
  add("aten::_scaled_dot_product_attention_math", "attention", {}, sdpa_of);
}

void add_random_and_factories(Adder& add) {
  add("aten::native_dropout", "pointwise", {}, dropout_of, same_shape, Execution::kDropout);
  add("aten::native_dropout_backward", "pointwise", {}, pointwise(2, lin));
  for (const char* op : {"empty_like", "zeros_like", "ones_like", "full_like"}) {
    add(std::string("aten::") + op, "factory", {}, pointwise(1, Linearity::kShapeOnly));
  }
  for (const char* op : {"rand_like", "randn_like", "randint_like", "randint_like.low_dtype"}) {
    add(std::string("aten::") + op, "factory", {}, pointwise(1, Linearity::kShapeOnly), same_shape,
        random_draw);
  }
  add("aten::bernoulli.p", "random", {}, pointwise(1, Linearity::kShapeOnly), same_shape,
      random_draw);
  // In-place random fills: self keeps its layout (a Partial self is refused).
  for (const char* op : {"uniform_", "normal_", "bernoulli_.float", "random_", "random_.from",
                         "random_.to", "exponential_"}) {
    add(std::string("aten::") + op, "random", {}, pointwise(1, lin), same_shape, random_draw);
  }
  for (const char* op : {"new_zeros", "new_ones", "new_empty", "new_full"}) {
    add(std::string("aten::") + op, "factory", {ints_arg("size")}, new_factory_of,
        local_shape("size"));
  }
  add("aten::new_empty_strided", "factory", {ints_arg("size")}, new_factory_of, local_shape("size"),
      Execution::kEmptyByLocal);
  add("aten::_reshape_alias", "view", {ints_arg("size")}, view_rule, local_shape("size"),
      Execution::kReshapeByLocal);
  // item(): every rank reads the whole value; there is no layout to propagate.
  add("aten::_local_scalar_dense", "scalar", {}, no_rule("item() reads the whole value"),
      same_shape, Execution::kReplicateFirst);
}

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
  add_unary_pointwise(add);
  add_binary_pointwise(add);
  add_elementwise(add);
  add_reductions(add);
  add_matmul(add);
  add_views(add);
  add_refused(add);
  add_along_dims(add);
  add_nn(add);
  add_spatial(add);
  add_losses(add);
  add_group_norm(add);
  add_random_and_factories(add);
  add_out_overloads(add);
  std::vector<OpEntry>& t = add.entries;
  std::sort(t.begin(), t.end(), [](const OpEntry& a, const OpEntry& b) { return a.name < b.name; });
  return std::move(t);
}

// The op table: an interning table, not a cache (NOTE [caches]): entries are handed out by pointer
// and live for the process. The built-in entries never change after construction, so they are
// read without a lock (find_op is on the propagation path of every op whose entry the caller has
// not kept); entries registered at run time (register_rule) sit in their own map under a mutex.
struct Table {
  const absl::node_hash_map<std::string, OpEntry> builtin;
  absl::Mutex mu;
  absl::node_hash_map<std::string, OpEntry> custom ABSL_GUARDED_BY(mu);
  Table() : builtin(index(build_table())) {}

  static absl::node_hash_map<std::string, OpEntry> index(std::vector<OpEntry> entries) {
    absl::node_hash_map<std::string, OpEntry> out;
    for (auto& e : entries) {
      const std::string name = e.name;
      TORCH_INTERNAL_ASSERT(out.emplace(name, std::move(e)).second, "two entries for ", name);
    }
    return out;
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

LayoutArg int_arg(std::string name, std::optional<int64_t> if_none) {
  return {std::move(name), LayoutArg::Kind::kInt, if_none};
}
LayoutArg ints_arg(std::string name) { return {std::move(name), LayoutArg::Kind::kInts, {}}; }
LayoutArg count_arg(std::string name) { return {std::move(name), LayoutArg::Kind::kCount, {}}; }
LayoutArg text_arg(std::string name) { return {std::move(name), LayoutArg::Kind::kText, {}}; }
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

const OpEntry* find_op(std::string_view name) {
  Table& t = table();
  const absl::string_view key(name.data(), name.size());  // Debian's Abseil has its own
  if (auto it = t.builtin.find(key); it != t.builtin.end()) return &it->second;
  absl::MutexLock lock(&t.mu);
  auto it = t.custom.find(key);
  return it == t.custom.end() ? nullptr : &it->second;
}

std::vector<const OpEntry*> all_ops() {
  Table& t = table();
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

void register_rule(const std::string& name, const std::string& rule_text, Linearity linearity) {
  OpEntry e{name, "custom", {}, false, [rule_text, linearity](const Metas& m, const LayoutArgs&) {
              std::vector<std::vector<int64_t>> shapes;
              for (const auto& x : m) shapes.push_back(x.shape);
              return BuiltRule{parse_rule(rule_text, shapes, linearity), {m.at(0).dtype}};
            }};
  Table& t = table();
  absl::MutexLock lock(&t.mu);
  if (t.builtin.count(name) != 0 || !t.custom.emplace(name, std::move(e)).second) {
    throw Error("register_rule: '" + name + "' already has a rule");
  }
}

}  // namespace dtensor::sharding
