// NOTE [torch ops]
// The functional collectives as ATen operators in namespace dtensor_c10d, with PyTorch's
// _c10d_functional schemas (groups are names, group sizes are plain ints so shapes need no
// process group):
//  - CPU (and CUDA when built) kernels issue the collective asynchronously; outputs are valid
//    after dtensor_c10d::wait_tensor, as in PyTorch;
//  - Meta kernels compute output shapes with no communication and no context (tracing);
//  - Autograd kernels: all_gather_into_tensor <-> reduce_scatter_tensor(sum, avg), and
//    all_to_all_single swaps its split sizes. The backward waits for its collective.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "base/error.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"

namespace dtensor::collectives {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t norm(int64_t dim, int64_t ndim) { return dim < 0 ? dim + ndim : dim; }

void check_group_size(const std::string& group, int64_t group_size, const char* op) {
  const int64_t actual = static_cast<int64_t>(current_context().group(group).ranks.size());
  if (actual != group_size) {
    throw Error(std::string(op) + ": group_size " + std::to_string(group_size) + " but group '" +
                group + "' has " + std::to_string(actual) + " ranks");
  }
}

// ---- eager kernels (CPU / CUDA): asynchronous, waited by wait_tensor ----
at::Tensor all_reduce_kernel(const at::Tensor& t, c10::string_view op, c10::string_view group) {
  return all_reduce(t, parse_reduce_op(std::string(op)), std::string(group), /*async_op=*/true);
}

at::Tensor all_gather_kernel(const at::Tensor& t, int64_t group_size, c10::string_view group,
                             int64_t gather_dim) {
  check_group_size(std::string(group), group_size, "all_gather_into_tensor");
  return all_gather_into_tensor(t, gather_dim, std::string(group), /*async_op=*/true);
}

at::Tensor reduce_scatter_kernel(const at::Tensor& t, c10::string_view op, int64_t group_size,
                                 c10::string_view group, int64_t scatter_dim) {
  check_group_size(std::string(group), group_size, "reduce_scatter_tensor");
  return reduce_scatter_tensor(t, parse_reduce_op(std::string(op)), scatter_dim, std::string(group),
                               /*async_op=*/true);
}

at::Tensor all_to_all_kernel(const at::Tensor& t, at::IntArrayRef out_splits,
                             at::IntArrayRef in_splits, c10::string_view group) {
  return all_to_all_single(t, out_splits.vec(), in_splits.vec(), std::string(group),
                           /*async_op=*/true);
}

at::Tensor broadcast_kernel(const at::Tensor& t, int64_t src, c10::string_view group) {
  return broadcast(t, src, std::string(group), /*async_op=*/true);
}

at::Tensor wait_kernel(const at::Tensor& t) { return wait_tensor(t); }

// ---- Meta kernels: shapes only ----
at::Tensor all_reduce_meta(const at::Tensor& t, c10::string_view, c10::string_view) {
  return at::empty_like(t);
}

at::Tensor all_gather_meta(const at::Tensor& t, int64_t group_size, c10::string_view,
                           int64_t gather_dim) {
  auto sizes = t.sizes().vec();
  sizes[norm(gather_dim, t.dim())] *= group_size;
  return at::empty(sizes, t.options());
}

at::Tensor reduce_scatter_meta(const at::Tensor& t, c10::string_view, int64_t group_size,
                               c10::string_view, int64_t scatter_dim) {
  auto sizes = t.sizes().vec();
  const int64_t d = norm(scatter_dim, t.dim());
  TORCH_CHECK(sizes[d] % group_size == 0, "reduce_scatter_tensor: size ", sizes[d], " of dim ", d,
              " is not divisible by the group size ", group_size);
  sizes[d] /= group_size;
  return at::empty(sizes, t.options());
}

at::Tensor all_to_all_meta(const at::Tensor& t, at::IntArrayRef out_splits, at::IntArrayRef,
                           c10::string_view) {
  auto sizes = t.sizes().vec();
  if (!out_splits.empty()) {
    sizes[0] = 0;
    for (int64_t s : out_splits) sizes[0] += s;
  }
  return at::empty(sizes, t.options());
}

at::Tensor broadcast_meta(const at::Tensor& t, int64_t, c10::string_view) {
  return at::empty_like(t);
}

at::Tensor wait_meta(const at::Tensor& t) { return t; }

// ---- Autograd ----
// Forward redispatches below autograd, so Meta tensors reach the Meta kernels.
template <typename Sig>
c10::TypedOperatorHandle<Sig> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

struct AllGatherFn : torch::autograd::Function<AllGatherFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t, int64_t group_size,
                            std::string group, int64_t dim) {
    ctx->saved_data["group_size"] = group_size;
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto handle =
        op<at::Tensor(const at::Tensor&, int64_t, c10::string_view, int64_t)>(
            "dtensor_c10d::all_gather_into_tensor");
    return handle.call(t, group_size, group, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto group = ctx->saved_data["group"].toStringRef();
    at::Tensor g = reduce_scatter_tensor(grads[0].contiguous(), ReduceOp::kSum,
                                         ctx->saved_data["dim"].toInt(), group);

    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, c10::string_view, int64_t,
                                          c10::string_view, int64_t)>&
op_handle_reduce_scatter() {
  static const auto handle =
      op<at::Tensor(const at::Tensor&, c10::string_view, int64_t, c10::string_view, int64_t)>(
          "dtensor_c10d::reduce_scatter_tensor");
  return handle;
}

struct ReduceScatterFn : torch::autograd::Function<ReduceScatterFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t, std::string reduce_op,
                            int64_t group_size, std::string group, int64_t dim) {
    ctx->saved_data["avg"] = reduce_op == "avg";
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    at::AutoDispatchBelowADInplaceOrView guard;
    return op_handle_reduce_scatter().call(t, reduce_op, group_size, group, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto group = ctx->saved_data["group"].toStringRef();
    at::Tensor g =
        all_gather_into_tensor(grads[0].contiguous(), ctx->saved_data["dim"].toInt(), group);
    if (ctx->saved_data["avg"].toBool()) {
      g.div_(static_cast<double>(current_context().group(group).ranks.size()));
    }
    return {g, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct AllToAllFn : torch::autograd::Function<AllToAllFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t,
                            std::vector<int64_t> out_splits, std::vector<int64_t> in_splits,
                            std::string group) {
    ctx->saved_data["out"] = out_splits;
    ctx->saved_data["in"] = in_splits;
    ctx->saved_data["group"] = group;
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto handle =
        op<at::Tensor(const at::Tensor&, at::IntArrayRef, at::IntArrayRef, c10::string_view)>(
            "dtensor_c10d::all_to_all_single");
    return handle.call(t, out_splits, in_splits, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // The gradient travels back: what was received is sent, what was sent is received.
    at::Tensor g = all_to_all_single(grads[0].contiguous(), ctx->saved_data["in"].toIntVector(),
                                     ctx->saved_data["out"].toIntVector(),
                                     ctx->saved_data["group"].toStringRef());
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor all_gather_autograd(const at::Tensor& t, int64_t group_size, c10::string_view group,
                               int64_t dim) {
  return AllGatherFn::apply(t, group_size, std::string(group), dim);
}

// sum and avg have a gradient (all_gather, divided by the group size for avg); the other reduce
// ops run without one, and refuse only an input that requires grad.
at::Tensor reduce_scatter_autograd(const at::Tensor& t, c10::string_view op, int64_t group_size,
                                   c10::string_view group, int64_t dim) {
  if (op != "sum" && op != "avg") {
    if (t.requires_grad() && at::GradMode::is_enabled()) {
      throw Error("reduce_scatter_tensor: reduce op '" + std::string(op) +
                  "' has no gradient (sum and avg have one); the input requires grad (group '" +
                  std::string(group) + "')");
    }
    at::AutoDispatchBelowADInplaceOrView guard;
    return op_handle_reduce_scatter().call(t, op, group_size, group, dim);
  }
  return ReduceScatterFn::apply(t, std::string(op), group_size, std::string(group), dim);
}

at::Tensor all_to_all_autograd(const at::Tensor& t, at::IntArrayRef out_splits,
                               at::IntArrayRef in_splits, c10::string_view group) {
  return AllToAllFn::apply(t, out_splits.vec(), in_splits.vec(), std::string(group));
}

}  // namespace

TORCH_LIBRARY(dtensor_c10d, m) {
  m.def("all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor");
  m.def(
      "all_gather_into_tensor(Tensor input, int group_size, str group_name, int gather_dim=0) "
      "-> Tensor");
  m.def(
      "reduce_scatter_tensor(Tensor input, str reduce_op, int group_size, str group_name, "
      "int scatter_dim=0) -> Tensor");
  m.def(
      "all_to_all_single(Tensor input, int[] output_split_sizes, int[] input_split_sizes, "
      "str group_name) -> Tensor");
  m.def("broadcast(Tensor input, int src, str group_name) -> Tensor");
  m.def("wait_tensor(Tensor tensor) -> Tensor");
}

#define DTENSOR_REGISTER_EAGER(KEY)                         \
  TORCH_LIBRARY_IMPL(dtensor_c10d, KEY, m) {                \
    m.impl("all_reduce", all_reduce_kernel);                \
    m.impl("all_gather_into_tensor", all_gather_kernel);    \
    m.impl("reduce_scatter_tensor", reduce_scatter_kernel); \
    m.impl("all_to_all_single", all_to_all_kernel);         \
    m.impl("broadcast", broadcast_kernel);                  \
    m.impl("wait_tensor", wait_kernel);                     \
  }

DTENSOR_REGISTER_EAGER(CPU)
#ifdef DTENSOR_WITH_CUDA
DTENSOR_REGISTER_EAGER(CUDA)
#endif

TORCH_LIBRARY_IMPL(dtensor_c10d, Meta, m) {
  m.impl("all_reduce", all_reduce_meta);
  m.impl("all_gather_into_tensor", all_gather_meta);
  m.impl("reduce_scatter_tensor", reduce_scatter_meta);
  m.impl("all_to_all_single", all_to_all_meta);
  m.impl("broadcast", broadcast_meta);
  m.impl("wait_tensor", wait_meta);
}

TORCH_LIBRARY_IMPL(dtensor_c10d, Autograd, m) {
  m.impl("all_gather_into_tensor", all_gather_autograd);
  m.impl("reduce_scatter_tensor", reduce_scatter_autograd);
  m.impl("all_to_all_single", all_to_all_autograd);
  // Not differentiable here (as in PyTorch's functional collectives); fall through so every
  // backend, Meta included, is reached.
  m.impl("all_reduce", torch::CppFunction::makeFallthrough());
  m.impl("broadcast", torch::CppFunction::makeFallthrough());
  m.impl("wait_tensor", torch::CppFunction::makeFallthrough());
}

}  // namespace dtensor::collectives
