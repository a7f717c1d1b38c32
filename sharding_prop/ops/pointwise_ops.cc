// Elementwise ops (the "pointwise" family): unary, binary and ternary ops with their in-place
// and out= overloads, casts, copies and fills; and the builders of the few whose dtypes or outputs
// are not the plain pointwise ones (where, casts, complex results, log_sigmoid's buffer).

#include <c10/core/DeviceType.h>

#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "sharding_prop/ops/family.h"

namespace dtensor::sharding::ops {
namespace {

// log_sigmoid_forward(self) -> (output, buffer): ints: self's device type. The CPU kernel's
// buffer is elementwise too; CUDA's is empty (its backward recomputes instead), so its output
// metadata is the rule's (no ATen meta kernel knows the device).
BuiltRule log_sigmoid_forward_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "log_sigmoid_forward");
  Rule r = pointwise_rule(shapes_of(m), Linearity::kNone);
  const bool cuda =
      arg(a, 0, "log_sigmoid_forward", "device") == static_cast<int64_t>(c10::DeviceType::CUDA);
  r.outputs.push_back(cuda ? TensorFactors{r.add_dim(0, FactorKind::kReplicate)} : r.outputs[0]);
  r.metadata_from_rule = true;
  return {std::move(r), {m[0].dtype, m[0].dtype}};
}

// log_sigmoid_backward(grad_output, self, buffer): elementwise; a CUDA forward's empty buffer
// (never read) stays whole.
BuiltRule log_sigmoid_backward_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 3, 3, "log_sigmoid_backward");
  const bool empty_buffer = m[2].shape == std::vector<int64_t>{0} && m[1].numel() != 0;
  Rule r = pointwise_rule(empty_buffer ? Shapes{m[0].shape, m[1].shape} : shapes_of(m),
                          Linearity::kNone);
  if (empty_buffer) r.inputs.push_back({r.add_dim(0, FactorKind::kReplicate)});
  return {std::move(r), {promoted(m)}};
}

// polar(abs, angle) / complex(real, imag): elementwise, complex results (neither has a C++ meta
// kernel in torch 1.13, so the rule states the dtype).
BuiltRule to_complex_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 2, 2, "polar/complex");
  return {pointwise_rule(shapes_of(m), Linearity::kNone), {c10::toComplexType(promoted(m))}};
}

// where(cond, a, b): the result type is a's and b's, not the condition's.
BuiltRule where_rule(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 3, 3, "where");
  return {pointwise_rule(shapes_of(m), Linearity::kNone),
          {c10::promoteTypes(m[1].dtype, m[2].dtype)}};
}

// ints: dtype (as c10::ScalarType), or -1 to keep the input's.
BuiltRule cast_rule(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 1, 1, "_to_copy");
  const int64_t t = a.ints.empty() ? -1 : a.ints[0];
  return {pointwise_rule(shapes_of(m), Linearity::kNone),
          {t < 0 ? m[0].dtype : static_cast<c10::ScalarType>(t)}};
}

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
  // Copies, fills and casts move data and compute nothing (NOTE [compute in the cost model]).
  add("aten::fill_.Scalar", "pointwise", {}, pointwise(1, lin));
  add.moves_data();
  // Reads no value of self: a Partial self stays (fill_ of a Partial runs this and copies the
  // replicated result in by partition, with no collective: NOTE [in-place by copy]).
  add("aten::fill.Scalar", "pointwise", {}, pointwise(1, Linearity::kShapeOnly));
  add.moves_data();
  add("aten::zero_", "pointwise", {}, pointwise(1, Linearity::kMove));
  add.moves_data();
  add("aten::clone", "pointwise", {}, pointwise(1, Linearity::kMove));
  add.moves_data();
  add("aten::contiguous", "pointwise", {}, pointwise(1, Linearity::kMove));
  add.moves_data();
  add("aten::detach", "pointwise", {}, pointwise(1, Linearity::kMove));
  add.moves_data();
  add("aten::alias", "pointwise", {}, pointwise(1, Linearity::kMove));
  add.moves_data();
  // copy_ moves data: a Partial source into a Partial self stays Partial (each rank copies its
  // share), and a Replicate source reaches a Partial self by partition (NOTE [in-place by copy]).
  add("aten::copy_", "pointwise", {}, pointwise(2, Linearity::kMove));
  add.moves_data();
  add("aten::_to_copy", "pointwise", {int_arg("dtype", -1)}, cast_rule);
  add.moves_data();
  add("aten::masked_fill.Scalar", "pointwise", {}, pointwise(2, lin));
  add("aten::masked_fill_.Scalar", "pointwise", {}, pointwise(2, lin));
  add("aten::where.self", "pointwise", {}, where_rule);
  add("aten::polar", "pointwise", {}, to_complex_of);
  add("aten::complex", "pointwise", {}, to_complex_of);
  add("aten::_conj_physical", "pointwise", {}, pointwise(1, lin));
}

// Every other elementwise op (functional, in-place and out= overloads): one rule shape (pointwise),
// the outputs' dtypes from ATen's meta
// kernels (NOTE [output metadata from ATen]). Partial inputs are reduced first (Linearity::kNone).
// Left to the replicate fallback on purpose: clamp_min_/clamp_max_ (cosine_similarity clamps a
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
        "softshrink_backward", "mish_backward"}) {
    add(std::string("aten::") + op, "pointwise", {}, pointwise(3, lin));
  }
  add("aten::log_sigmoid_forward", "pointwise", {device_arg("self")}, log_sigmoid_forward_of);
  add("aten::log_sigmoid_backward", "pointwise", {}, log_sigmoid_backward_of);
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
    // NOTE: add/sub of a Scalar keep Partial(avg/max/min) (Linearity::kShift): torch 2.x's
    // rms_norm adds eps in place to a mean that is Partial(avg) on a 2-D mesh.
    add(base + "add" + v + ".Scalar", "pointwise", {}, pointwise(1, Linearity::kShift));
    add(base + "sub" + v + ".Scalar", "pointwise", {}, pointwise(1, Linearity::kShift));
    add(base + "mul" + v + ".Scalar", "pointwise", {}, pointwise(1, Linearity::kAdditive));
    add(base + "div" + v + ".Scalar", "pointwise", {}, pointwise(1, Linearity::kAdditive));
    add(base + "pow" + v + ".Scalar", "pointwise", {}, pointwise(1, lin));
  }
  add("aten::rsub.Scalar", "pointwise", {}, pointwise(1, lin));
  add("aten::maximum", "pointwise", {}, pointwise(2, Linearity::kMax));
  add("aten::minimum", "pointwise", {}, pointwise(2, Linearity::kMin));
  for (const char* op : {"atan2", "logical_and", "logical_or", "bitwise_and.Tensor",
                         "bitwise_or.Tensor", "bitwise_xor.Tensor"}) {
    add(std::string("aten::") + op, "pointwise", {}, pointwise(2, lin));
  }
  add("aten::logical_and_", "pointwise", {}, pointwise(2, lin, {}, true));
  add("aten::logical_or_", "pointwise", {}, pointwise(2, lin, {}, true));
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

void add_out_overloads(Adder& add) {
  // The out= overloads of entries above: each the same entry under its out name.
  // clang-format off
  const std::vector<std::pair<const char*, const char*>> outs = {
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

}  // namespace

void add_pointwise_ops(Adder& add) {
  add_unary_pointwise(add);
  add_binary_pointwise(add);
  add_elementwise(add);
  add_out_overloads(add);
}

}  // namespace dtensor::sharding::ops
