// Matrix products (the "matmul" family: dot, mv, mm, bmm, matmul, addmm, baddbmm, addmv, addbmm,
// addr, linear, einsum) with their out= forms, and batched linear algebra (the "linalg" family).

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "sharding_prop/ops/family.h"

namespace dtensor::sharding::ops {
namespace {

// A fixed einsum-like rule (rule.h's text form): dot "k,k->", mv "mk,k->m". The dtype is the
// inputs' promotion (ATen's meta kernel decides in the end).
RuleBuilder from_text(const char* rule_text, Linearity lin) {
  return [=](const Metas& m, const LayoutArgs&) {
    return BuiltRule{parse_rule(rule_text, shapes_of(m), lin), {promoted(m)}};
  };
}

BuiltRule mm_rule(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 2, 2, "mm");
  if (m[0].shape.size() != 2 || m[1].shape.size() != 2) {
    throw Error("mm: both arguments must be 2-D");
  }
  return {matmul_rule(m[0].shape, m[1].shape), {promoted(m)}};
}

BuiltRule bmm_rule(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 2, 2, "bmm");
  if (m[0].shape.size() != 3 || m[1].shape.size() != 3 || m[0].shape[0] != m[1].shape[0]) {
    throw Error("bmm: arguments must be 3-D with equal batch sizes");
  }
  return {matmul_rule(m[0].shape, m[1].shape), {promoted(m)}};
}

BuiltRule matmul_rule_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 2, 2, "matmul");
  return {matmul_rule(m[0].shape, m[1].shape), {promoted(m)}};
}

BuiltRule addmm_rule_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 3, 3, "addmm");
  return {addmm_rule(m[0].shape, m[1].shape, m[2].shape), {promoted(m)}};
}

// addmv(bias, mat, vec): addmm with a vector. ATen's addmv returns the bias's shape for an empty
// matrix (a bias [1] stays [1]), so the rows shard only evenly (no rank's piece is empty).
BuiltRule addmv_of(const Metas& m, const LayoutArgs& a) {
  BuiltRule b = addmm_rule_of(m, a);
  for (const int f : b.rule.outputs[0].empty() ? DimFactors{} : b.rule.outputs[0][0]) {
    b.rule.factors[f].even_only = true;
  }
  return b;
}

// addbmm(bias [m, n], b1 [b, m, k], b2 [b, k, n]): the batch and k contract; the bias joins the
// Partial sum on one rank (as addmm's).
BuiltRule addbmm_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 3, 3, "addbmm");
  const Rule product = parse_rule("bmk,bkn->mn", {m[1].shape, m[2].shape}, Linearity::kMultilinear);
  return {with_bias(product, m[0].shape, "addbmm"), {promoted(m)}};
}

// addr(bias, vec1, vec2): the outer product passes both vector dims; the bias broadcasts in.
BuiltRule addr_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 3, 3, "addr");
  const Rule product = parse_rule("m,n->mn", {m[1].shape, m[2].shape}, Linearity::kNone);
  return {with_bias(product, m[0].shape, "addr"), {promoted(m)}};
}

BuiltRule linear_rule_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 2, 3, "linear");
  return {linear_rule(m[0].shape, m[1].shape, m.size() == 3 ? &m[2].shape : nullptr),
          {promoted(m)}};
}

// text: the equation.
BuiltRule einsum_rule(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 2, "einsum");
  return {parse_rule(a.text, shapes_of(m), Linearity::kMultilinear), {promoted(m)}};
}

// _linalg_check_errors(info, api_name, is_matrix): raises when an info entry is nonzero. Every
// rank must see every entry, or one rank would raise while the others go on: info stays whole.
// No outputs.
BuiltRule check_errors_of(const Metas& m, const LayoutArgs&) {
  need_inputs(m, 1, 1, "_linalg_check_errors");
  Rule r;
  r.inputs = {dims_of(r, m[0].shape, FactorKind::kReplicate)};
  return {std::move(r), {}};
}

// Batched linear algebra: input i's last in_core[i] dims are its matrix (or vector) dims and stay
// whole; the dims before them are batch dims that broadcast together and pass. Output o has the
// broadcast batch dims and out_core[o] whole dims. Its whole dims take their sizes from input
// `core_like`'s (>= 0), else from ATen's meta kernel (only ops with a C++ one). An output whose
// flag (an index into the ints, >= 0) reads 0 is empty ([0]: svd without U and Vh).
RuleBuilder batched(std::vector<int> in_core, std::vector<int> out_core,
                    std::vector<int> flags = {}, int core_like = -1) {
  return [=](const Metas& m, const LayoutArgs& a) {
    need_inputs(m, in_core.size(), in_core.size(), "batched linalg op");
    std::vector<std::vector<int64_t>> batches;
    for (size_t i = 0; i < m.size(); ++i) {
      if (m[i].ndim() < in_core[i]) throw Error("linalg: an input has too few dims");
      batches.emplace_back(m[i].shape.begin(), m[i].shape.end() - in_core[i]);
    }
    const std::vector<int64_t> batch = broadcast_shapes(batches);
    Rule r;
    TensorFactors bo;
    for (const int64_t size : batch) bo.push_back(r.add_dim(size));
    for (size_t i = 0; i < m.size(); ++i) {
      TensorFactors t = aligned_factors(batches[i], batch, bo);
      for (int64_t k = m[i].ndim() - in_core[i]; k < m[i].ndim(); ++k) {
        t.push_back(r.add_dim(m[i].shape[k], FactorKind::kReplicate));
      }
      r.inputs.push_back(std::move(t));
    }
    for (size_t o = 0; o < out_core.size(); ++o) {
      if (o < flags.size() && flags[o] >= 0 && arg(a, flags[o], "linalg", "flag") == 0) {
        r.outputs.push_back({r.add_dim(0, FactorKind::kReplicate)});
        continue;
      }
      TensorFactors t = bo;
      for (int k = 0; k < out_core[o]; ++k) {
        const int64_t size =
            core_like >= 0 ? m[core_like].shape[m[core_like].ndim() - out_core[o] + k] : 1;
        t.push_back(r.add_dim(size, FactorKind::kReplicate));
      }
      r.outputs.push_back(std::move(t));
    }
    r.whole_output_sizes_from_aten = core_like < 0;
    return BuiltRule{std::move(r), std::vector<c10::ScalarType>(out_core.size(), m[0].dtype)};
  };
}

// _linalg_solve_ex(A, B, left, check_errors): B is a batch of vectors when it is 1-D or has A's
// shape without its last dim (ATen's rule), else of matrices.
BuiltRule solve_ex_of(const Metas& m, const LayoutArgs& a) {
  need_inputs(m, 2, 2, "_linalg_solve_ex");
  const auto &sa = m[0].shape, &sb = m[1].shape;
  const bool vector = sb.size() == 1 || (sa.size() >= 1 && sb.size() + 1 == sa.size() &&
                                         std::equal(sb.begin(), sb.end(), sa.begin()));
  const int core = vector ? 1 : 2;
  return batched({2, core}, {core, 2, 1, 0}, {}, -1)(m, a);
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
}

void add_out_overloads(Adder& add) {
  // `.out` overloads (the out tensor is not an input).
  add("aten::mm.out", "matmul", {}, mm_rule);
  add("aten::bmm.out", "matmul", {}, bmm_rule);
  add("aten::addmm.out", "matmul", {}, addmm_rule_of);
  // The out= overloads of entries above: each the same entry under its out name.
  // clang-format off
  const std::vector<std::pair<const char*, const char*>> outs = {
      {"dot", "dot.out"},
      {"vdot", "vdot.out"},
      {"mv", "mv.out"},
      {"baddbmm", "baddbmm.out"},
  };
  // clang-format on
  for (const auto& [functional, out] : outs) {
    add.out_of(std::string("aten::") + functional, std::string("aten::") + out);
  }
}

// Batched linear algebra: batch dims pass, the matrix dims stay whole (NOTE at `batched`). Whole
// dims' sizes come from ATen's meta kernels, so only ops with a C++ meta kernel take them from
// there; the others name the input whose matrix dims the output has.
void add_linalg(Adder& add) {
  add("aten::linalg_cholesky_ex", "linalg", {}, batched({2}, {2, 0}));
  add("aten::linalg_inv_ex", "linalg", {}, batched({2}, {2, 0}));
  add("aten::_linalg_det", "linalg", {}, batched({2}, {0, 2, 1}));
  add("aten::_linalg_slogdet", "linalg", {}, batched({2}, {0, 0, 2, 1}));
  add("aten::_linalg_eigh", "linalg", {int_arg("compute_v")}, batched({2}, {1, 2}, {-1, 0}));
  add("aten::_linalg_svd", "linalg", {int_arg("compute_uv")}, batched({2}, {2, 1, 2}, {0, -1, 0}));
  add("aten::linalg_lu_factor_ex", "linalg", {}, batched({2}, {2, 1, 0}));
  add("aten::linalg_lu", "linalg", {int_arg("pivot")}, batched({2}, {2, 2, 2}, {0, -1, -1}));
  add("aten::lu_unpack", "linalg", {int_arg("unpack_data"), int_arg("unpack_pivots")},
      batched({2, 1}, {2, 2, 2}, {1, 0, 0}));
  add("aten::linalg_lu_solve", "linalg", {}, batched({2, 1, 2}, {2}));
  add("aten::linalg_ldl_factor_ex", "linalg", {}, batched({2}, {2, 1, 0}));
  add("aten::linalg_ldl_solve", "linalg", {}, batched({2, 1, 2}, {2}));
  add("aten::triangular_solve", "linalg", {}, batched({2, 2}, {2, 2}));
  add("aten::_linalg_solve_ex", "linalg", {}, solve_ex_of);
  add("aten::_linalg_check_errors", "linalg", {}, check_errors_of);
  add("aten::linalg_cross", "linalg", {int_arg("dim")}, along_dims(1));
  // No C++ meta kernel: the output has the matrix dims of the named input.
  add("aten::linalg_solve_triangular", "linalg", {}, batched({2, 2}, {2}, {}, 1));
  add("aten::cholesky_solve", "linalg", {}, batched({2, 2}, {2}, {}, 0));
  add("aten::cholesky_inverse", "linalg", {}, batched({2}, {2}, {}, 0));
  add("aten::cholesky", "linalg", {}, batched({2}, {2}, {}, 0));
  add("aten::linalg_householder_product", "linalg", {}, batched({2, 1}, {2}, {}, 0));
  add("aten::linalg_matrix_exp", "linalg", {}, batched({2}, {2}, {}, 0));
}

}  // namespace

void add_matrix_ops(Adder& add) {
  add_matmul(add);
  add_out_overloads(add);
  add_linalg(add);
}

}  // namespace dtensor::sharding::ops
