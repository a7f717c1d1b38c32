#include "dtensor/autograd.h"

#include <torch/csrc/autograd/custom_function.h>

#include "dtensor/dtensor.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/redistribute.h"
#include "dtensor/spec_capsule.h"

namespace dtensor::autograd {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A distributed gradient in the convention for the forward spec `forward`, on its mesh (a
// cross-mesh redistribute's gradient goes back the same way: NOTE [cross-mesh redistribute]).
at::Tensor grad_moved(const at::Tensor& grad, const DTensorSpec& forward) {
  if (!is_dtensor(grad) || spec_of(grad).mesh() == forward.mesh()) {
    return relaid(grad, without_partial(forward).placements());
  }
  const DTensorSpec& g = spec_of(grad);
  const DTensorSpec reduced = without_partial(forward);
  const DTensorSpec want =
      DTensorSpec::make(forward.mesh(), reduced.placements(), g.meta(), reduced.shard_order());
  return make_dtensor(redistribute_local(local_of(grad), g, want), want);
}

// A redistribute's gradient, in the convention of its forward input's spec `forward`, as
// PyTorch's Redistribute.backward: the forward's placements, a forward Partial becoming
// Replicate unless the gradient is already that Partial there (the gradient of a Partial ->
// Partial redistribute stays Partial: no communication). A Partial gradient is still one
// device's gradient of a distributed input; a plain input's (from_local) is not, so
// FromLocalFn reduces it (grad_moved).
at::Tensor redistribute_grad(const at::Tensor& grad, const DTensorSpec& forward) {
  if (!is_dtensor(grad) || spec_of(grad).mesh() != forward.mesh() || !forward.has_partial()) {
    return grad_moved(grad, forward);
  }
  const Placements& g = spec_of(grad).placements();
  Placements p = forward.placements();
  for (size_t m = 0; m < p.size(); ++m) {
    if (p[m].is_partial() && g[m] != p[m]) p[m] = Replicate();
  }
  const at::Tensor moved = relaid(grad, p);
  // A new tensor over the same piece when nothing moved: autograd then accumulates it into a
  // leaf's .grad as it is, where the caller's own reference to `grad` (a grad_output the user
  // keeps) would make it clone the gradient into a buffer laid out as the leaf, reducing a
  // Partial gradient there.
  return moved.unsafeGetTensorImpl() == grad.unsafeGetTensorImpl()
             ? make_dtensor(local_of(grad), spec_of(grad))
             : moved;
}

struct FromLocalFn : torch::autograd::Function<FromLocalFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local, DTensorSpec spec) {
    save_specs(ctx, spec, spec);
    // NOTE [ranks outside the mesh]: there `local` is no piece of the tensor and gets no gradient.
    if (!holds_piece(spec.mesh())) return make_dtensor(absent_piece(spec, local.options()), spec);
    return make_dtensor(local.detach(), spec);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!holds_piece(saved_specs(ctx).from.mesh())) return {at::Tensor(), at::Tensor()};
    const at::Tensor g = grad_moved(grads[0], saved_specs(ctx).from);
    return {is_dtensor(g) ? local_of(g) : g, at::Tensor()};
  }
};

struct ToLocalFn : torch::autograd::Function<ToLocalFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dt, DTensorSpec grad) {
    save_specs(ctx, grad, spec_of(dt));
    return local_of(dt).alias();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SpecPair& s = saved_specs(ctx);
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    // NOTE [pieces in the spec's layout]: autograd lays the gradient out as it likes (k's
    // gradient through `k.transpose(-2, -1)` has the sequence dim innermost).
    // The gradient goes on in the layout to_local's grad_placements gave it, as PyTorch's: the op
    // that made `dt` moves it where it needs it (a Partial gradient of a redistribute from
    // Shard(0) is one reduce_scatter, not an all_reduce here and a slice there).
    return {make_dtensor(in_spec_layout(grads[0], s.from), s.from), at::Tensor()};
  }
};

struct RedistributeFn : torch::autograd::Function<RedistributeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dt, DTensorSpec to) {
    const DTensorSpec& from = spec_of(dt);
    save_specs(ctx, from, to);
    return make_dtensor(redistribute_local(local_of(dt), from, to), to);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {redistribute_grad(grads[0], saved_specs(ctx).from), at::Tensor()};
  }
};

}  // namespace

at::Tensor from_local(const at::Tensor& local, const DTensorSpec& spec) {
  return FromLocalFn::apply(local, spec);
}

at::Tensor to_local(const at::Tensor& dtensor, const DTensorSpec& grad) {
  return ToLocalFn::apply(dtensor, grad);
}

at::Tensor redistribute(const at::Tensor& dtensor, const DTensorSpec& to) {
  return RedistributeFn::apply(dtensor, to);
}

at::Tensor relaid(const at::Tensor& t, const Placements& placements) {
  if (!is_dtensor(t)) return t;
  const DTensorSpec& g = spec_of(t);
  const DTensorSpec want = DTensorSpec::make(g.mesh(), placements, g.meta());
  if (want == g) return t;
  return make_dtensor(redistribute_local(local_of(t), g, want), want);
}

}  // namespace dtensor::autograd
