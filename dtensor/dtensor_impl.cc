#include "dtensor/dtensor_impl.h"

#include <stdexcept>

#include "base/error.h"
#include "collectives/functional.h"
#include "dtensor/dispatch.h"

namespace dtensor {

DTensorImpl::DTensorImpl(at::Tensor local, DTensorSpec spec, bool pending)
    : c10::TensorImpl(c10::DispatchKeySet(kDTensorKey),
                      caffe2::TypeMeta::fromScalarType(spec.meta().dtype), local.device()),
      local_(std::move(local)),
      spec_(spec),
      pending_(pending) {
  set_storage_access_should_throw();
  refresh_metadata();
}

void DTensorImpl::refresh_metadata() {
  const TensorMeta& m = spec_.meta();
  set_sizes_and_strides(m.shape, m.stride);
  data_type_ = caffe2::TypeMeta::fromScalarType(m.dtype);
}

const at::Tensor& DTensorImpl::wait_local() const {
  if (pending_.load(std::memory_order_acquire)) {
    collectives::wait_tensor(local_);
    pending_.store(false, std::memory_order_release);
  }
  return local_;
}

const at::Tensor& DTensorImpl::ready_local() const {
  if (base_version_.has_value()) check_not_stale();
  return wait_local();
}

void DTensorImpl::set_detached_view_of(std::string op, const at::Tensor& base) {
  detached_view_of_ = std::move(op);
  base_version_.reset();
  const c10::VariableVersion& v = base.unsafeGetTensorImpl()->version_counter();
  if (v.enabled()) {  // inference tensors track no version: nothing to check against
    base_version_ = v;
    base_version_at_ = v.current_version();
  }
}

// NOTE [views of gathered copies] (dispatch.cc)
void DTensorImpl::check_not_stale() const {
  if (!base_version_->enabled() || base_version_->current_version() == base_version_at_) return;
  throw Error("a view made by " + detached_view_of_ + " of a distributed tensor " +
              spec_.to_string() +
              " is read after the tensor it views was written in place; the view is a gathered "
              "copy (its input had to be redistributed first), so it still holds the values "
              "from before the write, which one device's view would not: take the view again "
              "after the write, or redistribute the input to the needed layout before taking it "
              "(NOTE [views of gathered copies])");
}

void DTensorImpl::set(at::Tensor local, DTensorSpec spec) {
  wait_local();
  local_ = std::move(local);
  spec_ = spec;
  refresh_metadata();
  // The device is the piece's, here too: `.data =` (Module.to_empty / _apply after building on
  // the meta device) brings a piece on another device, and autograd checks gradients against
  // this device ("expected device meta but got cpu").
  device_opt_ = local_.device();
}

template <class Version>
c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::copy_detached(Version&& version,
                                                               bool allow_change) const {
  auto impl = c10::make_intrusive<DTensorImpl>(local_, spec_, pending_.load());
  impl->detached_view_of_ = detached_view_of_;
  impl->base_version_ = base_version_;
  impl->base_version_at_ = base_version_at_;
  impl->set_version_counter(std::forward<Version>(version));
  impl->set_allow_tensor_metadata_change(allow_change);
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  return copy_detached(version_counter, allow_tensor_metadata_change);
}

c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  return copy_detached(std::move(version_counter), allow_tensor_metadata_change);
}

void DTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  auto* other = dynamic_cast<DTensorImpl*>(impl.get());
  if (other == nullptr) {
    throw Error(
        "DTensor: cannot assign a plain tensor's data to a distributed tensor (set .data to a "
        "distributed tensor)");
  }
  set(other->wait_local(), other->spec_);
  detached_view_of_ = other->detached_view_of_;
  base_version_ = other->base_version_;
  base_version_at_ = other->base_version_at_;
}

at::Tensor make_dtensor(at::Tensor local, DTensorSpec spec, bool pending) {
  ensure_dispatch_installed();
  return at::Tensor(c10::make_intrusive<DTensorImpl>(std::move(local), spec, pending));
}

void DTensorImpl::make_normal_view() {
  if (!is_inference()) return;
  key_set_ = key_set_ | c10::getAutogradRelatedKeySetFromBackend(key_set_.highestBackendKey());
  version_counter_ = c10::VariableVersion(/*version=*/0);
}

at::Tensor make_dtensor_view(at::Tensor local, DTensorSpec spec, const at::Tensor& base) {
  at::Tensor t = make_dtensor(std::move(local), spec);
  if (base.defined() && !base.is_inference()) {
    static_cast<DTensorImpl*>(t.unsafeGetTensorImpl())->make_normal_view();
  }
  return t;
}

DTensorImpl* dtensor_impl(const at::Tensor& t) {
  if (!is_dtensor(t)) return nullptr;
  return static_cast<DTensorImpl*>(t.unsafeGetTensorImpl());
}

namespace {
DTensorImpl& checked(const at::Tensor& t, const char* what) {
  DTensorImpl* impl = dtensor_impl(t);
  if (impl == nullptr) {
    throw Error(std::string(what) + ": expected a distributed tensor, got a " +
                (t.defined() ? "plain tensor" : "undefined tensor"));
  }
  return *impl;
}
}  // namespace

const DTensorSpec& spec_of(const at::Tensor& t, const char* what) {
  return checked(t, what).spec();
}

at::Tensor local_of(const at::Tensor& t, const char* what) {
  return checked(t, what).ready_local();
}

DTensor value_of(const at::Tensor& t, const char* what) {
  const DTensorImpl& impl = checked(t, what);
  return DTensor(impl.ready_local(), impl.spec());
}

}  // namespace dtensor
