// The op table's nn families (convolution, pooling, norms, losses, attention, embedding),
// random ops and factories: NOTE [op table] in op_registry.cc.

#include <string>

#include "base/error.h"
#include "sharding_prop/op_builders.h"
#include "sharding_prop/op_table.h"

namespace dtensor::sharding::table {
namespace {

using namespace builders;  // NOLINT: the table names the family builders

// Elementwise losses and their backward ops (reduction decides: elementwise_loss).
void add_losses(Adder& add) {
  const std::vector<LayoutArg> reduction = {int_arg("reduction")};
  for (const char* op : {"mse_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss"}) {
    add(std::string("aten::") + op, "loss", reduction, elementwise_loss(2, false));
  }
  add("aten::binary_cross_entropy", "loss", reduction, elementwise_loss(3, false));
  add("aten::binary_cross_entropy_with_logits", "loss", reduction, elementwise_loss(4, false));
  // huber_loss_backward is left to the fallback: torch 1.13's Python meta registration of it
  // raises TypeError (a meta run of it fails in Python processes).
  for (const char* op :
       {"mse_loss_backward", "soft_margin_loss_backward", "smooth_l1_loss_backward"}) {
    add(std::string("aten::") + op, "loss", reduction, elementwise_loss(3, true));
  }
  add("aten::binary_cross_entropy_backward", "loss", reduction, elementwise_loss(4, true));
}

void add_batch_norm(Adder& add) {
  add("aten::native_batch_norm", "norm",
      {int_arg("training"), present_arg("weight"), present_arg("bias"), present_arg("running_mean"),
       present_arg("running_var"), device_arg("input")},
      batch_norm_of);
  add("aten::native_batch_norm_backward", "norm", {int_arg("train")}, batch_norm_backward_of);
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
  add("aten::nll_loss2d_forward", "loss", {int_arg("reduction")}, nll_loss_of);
  add("aten::nll_loss2d_backward", "loss", {int_arg("reduction")}, nll_loss_backward_of);
  add("aten::_scaled_dot_product_attention", "attention", {}, sdpa_of);
  add("aten::_scaled_dot_product_attention_math", "attention", {}, sdpa_of);
}

void add_random_and_factories(Adder& add) {
  add("aten::native_dropout", "pointwise", {}, dropout_of, same_shape, Execution::kDropout);
  add("aten::native_dropout_backward", "pointwise", {}, pointwise(2, lin));
  // empty_like's values are undefined, so it keeps every placement of its input, Partial too
  // (as PyTorch's: Module.to_empty keeps a Partial buffer Partial); the others hold values,
  // which a Partial layout would multiply, so they are Replicate there.
  add("aten::empty_like", "factory", {}, pointwise(1, Linearity::kMove));
  for (const char* op : {"zeros_like", "ones_like", "full_like"}) {
    add(std::string("aten::") + op, "factory", {}, pointwise(1, Linearity::kShapeOnly));
  }
  for (const char* op : {"rand_like", "randn_like", "randint_like", "randint_like.low_dtype"}) {
    add(std::string("aten::") + op, "factory", {}, pointwise(1, Linearity::kShapeOnly), same_shape,
        random_draw);
  }
  add("aten::bernoulli.p", "random", {}, pointwise(1, Linearity::kShapeOnly), same_shape,
      random_draw);
  // In-place random fills: self keeps its layout (a Partial self is refused).
  // cauchy_, log_normal_ and geometric_ (DrawOrder::kPerElement, random.cc): before
  // they ran by the fallback, which on a CUDA mesh handed a CPU generator to CUDA kernels.
  for (const char* op : {"uniform_", "normal_", "bernoulli_.float", "random_", "random_.from",
                         "random_.to", "exponential_", "cauchy_", "log_normal_", "geometric_"}) {
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

}  // namespace

void add_nn_ops(Adder& add) {
  add_nn(add);
  add_spatial(add);
  add_losses(add);
  add_group_norm(add);
  add_batch_norm(add);
  add_random_and_factories(add);
}

}  // namespace dtensor::sharding::table
