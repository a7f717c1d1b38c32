// The op table's selections (topk, kthvalue, median, mode), paired reductions, indexing along a
// dim (scatter, index_*), tiling and rearranging shape ops, and batched linear algebra: NOTE [op
// table] in op_registry.cc.

#include <string>

#include "sharding_prop/op_builders.h"
#include "sharding_prop/op_table.h"

namespace dtensor::sharding::table {
namespace {

using namespace builders;  // NOLINT: the table names the family builders

// Values and indices along one dim (whole), or over the whole tensor; and paired reductions.
void add_selections(Adder& add) {
  const RuleBuilder select_dim = reduction(ReduceOp::kMax, true, lin, -1, 2);
  for (const char* op : {"kthvalue", "median.dim", "nanmedian.dim", "mode"}) {
    add(std::string("aten::") + op, "reduction", reduce_args(), select_dim);
  }
  for (const char* op : {"median", "nanmedian"}) {
    add(std::string("aten::") + op, "reduction", {}, reduction(ReduceOp::kMax, true, lin));
  }
  add("aten::topk", "scan", {int_arg("k"), int_arg("dim")}, topk_of);
  add("aten::var_mean.correction", "reduction", reduce_args(), paired_reduction(true));
  add("aten::std_mean.correction", "reduction", reduce_args(), paired_reduction(true));
  add("aten::aminmax", "reduction", reduce_args(), paired_reduction(false));
  add("aten::count_nonzero.dim_IntList", "reduction", {ints_arg("dim")}, count_nonzero_of);
  add("aten::count_nonzero", "reduction", {ints_arg("dim")}, count_nonzero_of);
  for (const auto& [functional, out] :
       std::vector<std::pair<const char*, const char*>>{{"kthvalue", "kthvalue.values"},
                                                        {"median.dim", "median.dim_values"},
                                                        {"nanmedian.dim", "nanmedian.dim_values"},
                                                        {"mode", "mode.values"},
                                                        {"topk", "topk.values"},
                                                        {"aminmax", "aminmax.out"}}) {
    add.out_of(std::string("aten::") + functional, std::string("aten::") + out);
  }
}

// Writes along one dim: scatter (the dim whole, other dims shard with index and src) and
// index_fill/index_copy/index_reduce (self's dim whole, the index replicated).
void add_indexing(Adder& add) {
  for (const char* op : {"scatter.value", "scatter.reduce", "scatter.value_reduce",
                         "scatter_reduce.two", "scatter_.src", "scatter_.value", "scatter_.reduce",
                         "scatter_.value_reduce", "scatter_add_", "scatter_reduce_.two"}) {
    add(std::string("aten::") + op, "index", {int_arg("dim")}, scatter_of);
  }
  for (const char* op :
       {"index_fill.int_Scalar", "index_fill.int_Tensor", "index_fill_.int_Scalar",
        "index_fill_.int_Tensor", "index_copy", "index_copy_", "index_reduce", "index_reduce_"}) {
    add(std::string("aten::") + op, "index", {int_arg("dim")}, index_along_of);
  }
  add("aten::index_add_", "index", {int_arg("dim")}, index_add_of);
}

// Shape ops that tile or rearrange: the dims they change stay whole, the others pass.
void add_shape_ops(Adder& add) {
  add("aten::repeat", "view", {ints_arg("repeats")}, repeat_of);
  add("aten::diag", "view", {int_arg("diagonal")}, diag_of);
  add("aten::diag_embed", "view", {int_arg("offset"), int_arg("dim1"), int_arg("dim2")},
      diag_embed_of);
  add("aten::unfold", "view", {int_arg("dimension"), int_arg("size"), int_arg("step")}, unfold_of);
  add("aten::unfold_backward", "view",
      {int_arg("dim"), int_arg("size"), int_arg("step"), ints_arg("input_sizes")},
      unfold_backward_of, local_shape("input_sizes"));
  add("aten::rot90", "view", {int_arg("k"), ints_arg("dims")}, rot90_of);
  add("aten::unbind.int", "view", {int_arg("dim")}, unbind_of);
  add("aten::pixel_shuffle", "view", {int_arg("upscale_factor")}, pixel_shuffle_of(true));
  add("aten::pixel_unshuffle", "view", {int_arg("downscale_factor")}, pixel_shuffle_of(false));
  add("aten::linalg_cross", "linalg", {int_arg("dim")}, along_dims(1));
  add("aten::narrow_copy", "view", {int_arg("dim"), int_arg("start"), int_arg("length")},
      narrow_of);
  add("aten::renorm", "reduction", {int_arg("dim")}, renorm_of);
  add("aten::renorm_", "reduction", {int_arg("dim")}, renorm_of);
  add("aten::index.Tensor", "index", {present_arg("indices")}, index_of);
  add("aten::_unsafe_index.Tensor", "index", {present_arg("indices")}, index_of);
  add("aten::isin.Tensor_Tensor", "index", {}, search_of(false));
  add("aten::bucketize.Tensor", "index", {int_arg("out_int32")}, search_of(true));
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
  // No C++ meta kernel: the output has the matrix dims of the named input.
  add("aten::linalg_solve_triangular", "linalg", {}, batched({2, 2}, {2}, {}, 1));
  add("aten::cholesky_solve", "linalg", {}, batched({2, 2}, {2}, {}, 0));
  add("aten::cholesky_inverse", "linalg", {}, batched({2}, {2}, {}, 0));
  add("aten::cholesky", "linalg", {}, batched({2}, {2}, {}, 0));
  add("aten::linalg_householder_product", "linalg", {}, batched({2, 1}, {2}, {}, 0));
  add("aten::linalg_matrix_exp", "linalg", {}, batched({2}, {2}, {}, 0));
}

}  // namespace

void add_select_ops(Adder& add) {
  add_selections(add);
  add_indexing(add);
  add_shape_ops(add);
  add_linalg(add);
}

}  // namespace dtensor::sharding::table
