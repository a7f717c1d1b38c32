// Installs the dispatch kernel: the distributed tensors' backend fallback, its registrations by
// name for the ops whose composite kernels would run ahead of a fallback, and the hot ops'
// unboxed kernels (NOTE [DTensor dispatch] in dispatch.h).

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "base/torch_compat.h"
#if DTENSOR_TORCH_HAS_SDPA_GQA
#include <ATen/ops/_scaled_dot_product_attention_math_native.h>
#include <ATen/ops/scaled_dot_product_attention_native.h>
#endif

#include <algorithm>
#include <mutex>  // std::once_flag
#include <string>
#include <vector>

#include "dtensor/dispatch.h"
#include "dtensor/dispatch_internal.h"
#include "dtensor/dtensor_impl.h"
#include "sharding_prop/ops/registry.h"

namespace dtensor {

#if DTENSOR_TORCH_HAS_SDPA_GQA
namespace {
// NOTE [SDPA's math path]: scaled_dot_product_attention takes its math path where no fused
// kernel applies (v's head size differs from q's, a float mask, dropout on the CPU); that path is
// a composite that makes plain tensors of its own (the causal mask) and mixes them with its
// distributed inputs, which the engine refuses (NOTE [DTensor dispatch]). A plain tensor the
// composite makes is the same on every rank, one device's value, so it runs here with plain
// tensors read as Replicate; its ops record autograd as the composite's would. A plain mask the
// user passes with distributed q/k/v is taken as replicated at the op's entry (sdpa below), so
// the fused kernels and every backward see distributed tensors only.
std::tuple<at::Tensor, at::Tensor> sdpa_math(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v,
                                             const std::optional<at::Tensor>& attn_mask,
                                             double dropout_p, bool is_causal,
                                             const std::optional<at::Tensor>& dropout_mask,
                                             std::optional<double> scale, bool enable_gqa) {
  const ReplicatePlainTensorsGuard made_inside(true);
  return at::native::_scaled_dot_product_attention_math(q, k, v, attn_mask, dropout_p, is_causal,
                                                        dropout_mask, scale, enable_gqa);
}

// A plain attn_mask given with distributed q/k/v is one device's mask over the whole sequences:
// the kernels (fused or math) and their backward take it as a replicated distributed tensor.
at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                std::optional<double> scale, bool enable_gqa) {
  if (auto out =
          dispatch_detail::ring_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)) {
    return *out;  // NOTE [ring attention in the engine]
  }
  std::optional<at::Tensor> mask = attn_mask;
  if (mask && mask->defined() && !is_dtensor(*mask) && is_dtensor(q)) {
    const DeviceMesh& mesh = spec_of(q, "scaled_dot_product_attention query").mesh();
    mask = make_dtensor(*mask, DTensorSpec::replicated(mesh, dispatch_detail::meta_of(*mask)));
  }
  return at::native::scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal, scale,
                                                  enable_gqa);
}
}  // namespace
#endif

using dispatch_detail::fast_op_names;
using dispatch_detail::kernel;
using dispatch_detail::op_name;
using dispatch_detail::register_fast_kernels;

void ensure_dispatch_installed() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto* fallback = new torch::Library(torch::Library::IMPL, "_", kDTensorKey, __FILE__, __LINE__);
    fallback->fallback(torch::CppFunction::makeFromBoxedFunction<&dispatch_detail::kernel>());
    // Ops with no autograd kernel (custom ops of torch.library or TORCH_LIBRARY) pass through the
    // autograd key to the kernel above, as ATen's backend fallback does for AutogradCPU; without
    // it such ops raise "Could not run ... with arguments from the 'AutogradPrivateUse1' backend"
    // on distributed tensors.
    auto* no_autograd = new torch::Library(
        torch::Library::IMPL, "_", c10::DispatchKey::AutogradPrivateUse1, __FILE__, __LINE__);
    no_autograd->fallback(torch::CppFunction::makeFallthrough());
    auto* lib = new torch::Library(torch::Library::IMPL, "aten", kDTensorKey, __FILE__, __LINE__);
    register_fast_kernels(*lib);  // NOTE [unboxed fast path]
    const std::vector<std::string>& fast = fast_op_names();
    auto is_fast = [&](const std::string& op) {
      return std::find(fast.begin(), fast.end(), op) != fast.end();
    };
    auto& d = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : d.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0 || is_fast(op_name(name))) continue;
      const auto handle = d.findOp(name);
      if (!handle) continue;
      if (handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
          handle->hasKernelForDispatchKey(
              c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
        lib->impl(op_name(name).c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
      }
    }
    // Composite ops the engine runs itself (OpEntry::run_composite): a kernel at our key keeps
    // ATen from decomposing them for distributed tensors.
    // Their autograd key gets a fallthrough (ATen's composite would otherwise serve it): they are
    // backward ops, so no graph is recorded through them (OpEntry::run_composite).
    auto* autograd = new torch::Library(torch::Library::IMPL, "aten",
                                        c10::DispatchKey::AutogradPrivateUse1, __FILE__, __LINE__);
    for (const sharding::OpEntry* e : sharding::all_ops()) {
      if (!e->run_composite) continue;
      if (!is_fast(e->name)) {
        lib->impl(e->name.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
      }
      autograd->impl(e->name.c_str(), torch::CppFunction::makeFallthrough());
    }
#if DTENSOR_TORCH_HAS_SDPA_GQA
    autograd->impl("_scaled_dot_product_attention_math", TORCH_FN(sdpa_math));
    autograd->impl("scaled_dot_product_attention", TORCH_FN(sdpa));
#endif
  });
}

}  // namespace dtensor
