#include "serving/step_profile.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>

namespace dtensor::serving {
namespace {

thread_local int t_local_depth = 0;  // nesting of local ops on this thread
thread_local double t_local_seconds = 0;

struct OpContext : at::ObserverContext {
  bool local = false;
  std::chrono::steady_clock::time_point start;
};

bool engine_tensor(const at::Tensor& t) {
  // A distributed tensor, or a meta tensor (the engine infers shapes with meta kernels).
  return t.defined() && (t.key_set().has(c10::DispatchKey::PrivateUse1) || t.is_meta());
}

// Whether `fn` is a local kernel: its inputs are known (RecordFunction records none for some
// unboxed calls, e.g. ops with SymInt arguments: those count as engine work, an upper bound
// on the overhead) and none is a distributed or meta tensor.
bool is_local(const at::RecordFunction& fn) {
  // NOTE: this file is compiled with NDEBUG: inputs() asserts (debug builds only) that they were
  // recorded, and returns an empty list when they were not.
  const auto inputs = fn.inputs();
  if (inputs.empty()) return false;
  for (const c10::IValue& v : inputs) {
    if (v.isTensor() && engine_tensor(v.toTensor())) return false;
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList().vec())
        if (engine_tensor(t)) return false;
  }
  return true;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  auto ctx = std::make_unique<OpContext>();
  // Inside a local kernel everything is part of it.
  ctx->local = t_local_depth > 0 || is_local(fn);
  if (ctx->local && t_local_depth++ == 0) ctx->start = std::chrono::steady_clock::now();
  return ctx;
}

void on_end(const at::RecordFunction&, at::ObserverContext* base) {
  auto* ctx = static_cast<OpContext*>(base);
  if (ctx == nullptr || !ctx->local) return;
  if (--t_local_depth == 0)
    t_local_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx->start).count();
}

}  // namespace

LocalKernelTimer::LocalKernelTimer() : start_(t_local_seconds) {
  handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                           .needsInputs(true)
                                           .scopes({at::RecordScope::FUNCTION}));
}

LocalKernelTimer::~LocalKernelTimer() { at::removeCallback(handle_); }

double LocalKernelTimer::seconds() const { return t_local_seconds - start_; }

}  // namespace dtensor::serving
