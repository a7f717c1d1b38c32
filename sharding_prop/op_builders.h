#pragma once
// Rule builders for the op table, one per op family (see NOTE [op table] in op_registry.cc).
// Each validates its inputs and arguments and throws dtensor::Error naming the problem.

#include <c10/core/ScalarType.h>

#include <vector>

#include "sharding_prop/op_registry.h"

namespace dtensor::sharding::builders {

using Metas = std::vector<TensorMeta>;
using Shapes = std::vector<std::vector<int64_t>>;

Shapes shapes_of(const Metas& m);
c10::ScalarType promoted(const Metas& m);
void need_inputs(const Metas& m, size_t lo, size_t hi, const char* op);
int64_t arg(const LayoutArgs& a, size_t i, const char* op, const char* what);
BuiltRule where_rule(const Metas& m, const LayoutArgs&);
BuiltRule cast_rule(const Metas& m, const LayoutArgs& a);
RuleBuilder reduction(ReduceOp op, bool replicate, Linearity lin, int out_dtype = -1,
                      int outputs = 1);
RuleBuilder softmax(size_t n);
RuleBuilder along_dims(size_t outputs, size_t last_dims = 0);
BuiltRule constant_pad_of(const Metas& m, const LayoutArgs& a);
RuleBuilder fft_of(bool real_to_complex);
RuleBuilder spatial(size_t spatial_dims, size_t outputs = 1);
BuiltRule convolution_of(const Metas& m, const LayoutArgs& a);
RuleBuilder elementwise_loss(size_t n, bool backward);
BuiltRule group_norm_of(const Metas& m, const LayoutArgs& a);
BuiltRule group_norm_backward_of(const Metas& m, const LayoutArgs& a);
BuiltRule convolution_backward_of(const Metas& m, const LayoutArgs& a);
RuleBuilder from_text(const char* rule_text, Linearity lin);
BuiltRule diagonal_of(const Metas& m, const LayoutArgs& a);
BuiltRule diagonal_backward_of(const Metas& m, const LayoutArgs& a);
BuiltRule view_as_real_of(const Metas& m, const LayoutArgs&);
BuiltRule view_as_complex_of(const Metas& m, const LayoutArgs&);
RuleBuilder pointwise(size_t n, Linearity lin, std::vector<bool> linear_inputs = {},
                      bool to_bool = false);
BuiltRule same_dtype(Rule r, const Metas& m);
BuiltRule view_rule(const Metas& m, const LayoutArgs& a);
BuiltRule flatten_rule(const Metas& m, const LayoutArgs& a);
BuiltRule unflatten_rule(const Metas& m, const LayoutArgs& a);
BuiltRule squeeze_rule(const Metas& m, const LayoutArgs& a);
BuiltRule unsqueeze_rule(const Metas& m, const LayoutArgs& a);
BuiltRule transpose_rule(const Metas& m, const LayoutArgs& a);
BuiltRule t_rule(const Metas& m, const LayoutArgs&);
BuiltRule permute_rule_of(const Metas& m, const LayoutArgs& a);
BuiltRule expand_rule_of(const Metas& m, const LayoutArgs& a);
RuleBuilder concat(bool stack);
BuiltRule mm_rule(const Metas& m, const LayoutArgs&);
BuiltRule bmm_rule(const Metas& m, const LayoutArgs&);
BuiltRule matmul_rule_of(const Metas& m, const LayoutArgs&);
BuiltRule addmm_rule_of(const Metas& m, const LayoutArgs&);
BuiltRule linear_rule_of(const Metas& m, const LayoutArgs&);
BuiltRule einsum_rule(const Metas& m, const LayoutArgs& a);
BuiltRule slice_of(const Metas& m, const LayoutArgs& a);
BuiltRule narrow_of(const Metas& m, const LayoutArgs& a);
BuiltRule select_of(const Metas& m, const LayoutArgs& a);
BuiltRule with_outputs_dtype(Rule r, c10::ScalarType t);
BuiltRule split_of(const Metas& m, const LayoutArgs& a);
BuiltRule split_sizes_of(const Metas& m, const LayoutArgs& a);
BuiltRule chunk_of(const Metas& m, const LayoutArgs& a);
BuiltRule index_select_of(const Metas& m, const LayoutArgs& a);
BuiltRule gather_of(const Metas& m, const LayoutArgs& a);
BuiltRule embedding_of(const Metas& m, const LayoutArgs&);
BuiltRule embedding_backward_of(const Metas& m, const LayoutArgs& a);
BuiltRule layer_norm_of(const Metas& m, const LayoutArgs& a);
BuiltRule layer_norm_backward_of(const Metas& m, const LayoutArgs& a);
void check_nll_shapes(const std::vector<int64_t>& self, const std::vector<int64_t>& target,
                      const std::vector<int64_t>* weight, const char* op);
BuiltRule nll_loss_of(const Metas& m, const LayoutArgs& a);
BuiltRule histc_of(const Metas& m, const LayoutArgs& a);
BuiltRule vector_norm_of(const Metas& m, const LayoutArgs& a);
RuleBuilder norm_reduction(int64_t op, int64_t bits);
BuiltRule dist_of(const Metas& m, const LayoutArgs& a);
BuiltRule nll_loss_backward_of(const Metas& m, const LayoutArgs& a);
BuiltRule sdpa_of(const Metas& m, const LayoutArgs&);
BuiltRule new_factory_of(const Metas& m, const LayoutArgs& a);
BuiltRule dropout_of(const Metas& m, const LayoutArgs&);
// For entries the dispatcher runs without a rule (Execution::kReplicateFirst): fails naming why.
RuleBuilder no_rule(const char* why);
BuiltRule slice_backward_of(const Metas& m, const LayoutArgs& a);
BuiltRule select_backward_of(const Metas& m, const LayoutArgs& a);
BuiltRule scatter_of(const Metas& m, const LayoutArgs& a);
BuiltRule index_add_of(const Metas& m, const LayoutArgs& a);
BuiltRule value_selecting_backward_of(const Metas& m, const LayoutArgs& a);
// An indexing op on a 0-dim self (ATen reads it as one element): every input stays whole; the
// output has `out_shape`.
BuiltRule on_scalar_self(const Metas& m, const std::vector<int64_t>& out_shape = {});

// Selections, indexing along a dim, tiling shape ops, batch norm, linalg (op_builders_select.cc).
BuiltRule topk_of(const Metas& m, const LayoutArgs& a);
BuiltRule index_of(const Metas& m, const LayoutArgs& a);
RuleBuilder paired_reduction(bool real_first);
BuiltRule count_nonzero_of(const Metas& m, const LayoutArgs& a);
BuiltRule index_along_of(const Metas& m, const LayoutArgs& a);
BuiltRule repeat_of(const Metas& m, const LayoutArgs& a);
BuiltRule diag_of(const Metas& m, const LayoutArgs& a);
BuiltRule diag_embed_of(const Metas& m, const LayoutArgs& a);
BuiltRule unfold_of(const Metas& m, const LayoutArgs& a);
BuiltRule unfold_backward_of(const Metas& m, const LayoutArgs& a);
BuiltRule rot90_of(const Metas& m, const LayoutArgs& a);
BuiltRule unbind_of(const Metas& m, const LayoutArgs& a);
RuleBuilder pixel_shuffle_of(bool shuffle);
BuiltRule batch_norm_of(const Metas& m, const LayoutArgs& a);
BuiltRule batch_norm_backward_of(const Metas& m, const LayoutArgs& a);
RuleBuilder batched(std::vector<int> in_core, std::vector<int> out_core,
                    std::vector<int> flags = {}, int core_like = -1);
BuiltRule solve_ex_of(const Metas& m, const LayoutArgs& a);
BuiltRule check_errors_of(const Metas& m, const LayoutArgs&);
BuiltRule renorm_of(const Metas& m, const LayoutArgs& a);
RuleBuilder search_of(bool bucketize);
BuiltRule addmv_of(const Metas& m, const LayoutArgs& a);
BuiltRule addbmm_of(const Metas& m, const LayoutArgs&);
BuiltRule addr_of(const Metas& m, const LayoutArgs&);
BuiltRule log_sigmoid_forward_of(const Metas& m, const LayoutArgs& a);
BuiltRule log_sigmoid_backward_of(const Metas& m, const LayoutArgs&);
BuiltRule to_complex_of(const Metas& m, const LayoutArgs&);

}  // namespace dtensor::sharding::builders
