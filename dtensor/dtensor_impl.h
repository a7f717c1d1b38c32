#pragma once
// A distributed tensor as an at::Tensor: DTensorImpl is a storage-less TensorImpl that holds this
// rank's local tensor and the interned spec of the global tensor. Its sizes, strides and dtype
// are the global tensor's; its device is the local tensor's; its dispatch keys are PrivateUse1
// (+ the autograd and ADInplaceOrView keys every TensorImpl gets), so every ATen call on it
// reaches the dispatch kernel of dispatch.h. See NOTE [DTensor dispatch] there.

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <atomic>
#include <optional>
#include <string>

#include "dtensor/dtensor.h"

namespace dtensor {

class DTensorImpl final : public c10::TensorImpl {
 public:
  // `local` must be this rank's piece of `spec` and carry no autograd history (autograd runs on
  // the distributed tensor, not on its pieces).
  // `pending`: the piece is the output of an async collective, waited for on first use.
  DTensorImpl(at::Tensor local, DTensorSpec spec, bool pending = false);

  // NOTE [views in inference mode]: under c10::InferenceMode a new tensor is an inference tensor,
  // but a view of a normal tensor must stay normal (ATen's ADInplaceOrView kernel then gives it
  // the base's version counter, which an inference tensor refuses: "Cannot set version_counter
  // for inference tensor" on the first view of a weight). A distributed view of a normal base
  // is therefore made normal, as ATen's own view kernels do (TensorImpl::VIEW).
  void make_normal_view();

  // The piece as stored (possibly still pending).
  const at::Tensor& local() const { return local_; }
  // The piece, after waiting for its collective if it was pending.
  const at::Tensor& ready_local() const;
  // Whether local() is ready as it is: not pending, and no view of a gathered copy to check.
  bool plainly_ready() const {
    return !base_version_.has_value() && !pending_.load(std::memory_order_acquire);
  }
  const DTensorSpec& spec() const { return spec_; }
  // Replaces the piece and the spec (out= and in-place ops); sizes and strides follow the spec.
  void set(at::Tensor local, DTensorSpec spec);

  // A view that could only be returned as a view of a redistributed copy of its input (by a rule
  // that moved the input, or the replicate fallback): the op that made it, else empty. Writing
  // into it would not reach the tensor it views, so the dispatcher refuses writes into it.
  const std::string& detached_view_of() const { return detached_view_of_; }
  // Marks it, `base` being the tensor it views: NOTE [views of gathered copies] (dispatch.cc):
  // ready_local() then raises once `base` (or any view sharing its version counter) has been
  // written in place, since the copy holds the values from before the write.
  void set_detached_view_of(std::string op, const at::Tensor& base);

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter,
      bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  const char* tensorimpl_type_name() const override { return "DTensorImpl"; }
  void refresh_metadata();
  template <class Version>
  c10::intrusive_ptr<c10::TensorImpl> copy_detached(Version&& version, bool allow_change) const;

  const at::Tensor& wait_local() const;
  void check_not_stale() const;

  at::Tensor local_;
  DTensorSpec spec_;
  std::string detached_view_of_;
  // The base's version counter and its version when the gathered copy was made (marked only).
  std::optional<c10::VariableVersion> base_version_;
  uint32_t base_version_at_ = 0;
  mutable std::atomic<bool> pending_;
};

// The dispatch key of distributed tensors.
constexpr c10::DispatchKey kDTensorKey = c10::DispatchKey::PrivateUse1;

// Wraps a piece and its spec (no checks, no autograd: see api.h for the user-facing constructors).
at::Tensor make_dtensor(at::Tensor local, DTensorSpec spec, bool pending = false);
// make_dtensor for a result that views `base` (NOTE [views in inference mode]).
at::Tensor make_dtensor_view(at::Tensor local, DTensorSpec spec, const at::Tensor& base);
inline bool is_dtensor(const at::Tensor& t) {
  return t.defined() && t.unsafeGetTensorImpl()->key_set().has(kDTensorKey);
}
// Null when `t` is not distributed.
DTensorImpl* dtensor_impl(const at::Tensor& t);
// Throws dtensor::Error naming `what` when `t` is not distributed.
const DTensorSpec& spec_of(const at::Tensor& t, const char* what = "spec");
// The local piece (waits for a pending async redistribute).
at::Tensor local_of(const at::Tensor& t, const char* what = "local");
// The value view (local + spec) of a distributed tensor.
DTensor value_of(const at::Tensor& t, const char* what = "value");

}  // namespace dtensor
