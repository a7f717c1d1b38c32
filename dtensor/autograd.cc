#include "dtensor/autograd.h"

#include <ATen/ExpandUtils.h>
#include <torch/csrc/autograd/custom_function.h>

#include "dtensor/dtensor.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/redistribute.h"
#include "dtensor/spec_capsule.h"

namespace dtensor::autograd {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A distributed gradient in the convention for the forward spec `forward`.
at::Tensor grad_moved(const at::Tensor& grad, const DTensorSpec& forward) {
  return relaid(grad, without_partial(forward).placements());
}

struct FromLocalFn : torch::autograd::Function<FromLocalFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local, DTensorSpec spec) {
    save_specs(ctx, spec, spec);
    return make_dtensor(local.detach(), spec);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor g = grad_moved(grads[0], saved_specs(ctx).from);
    return {is_dtensor(g) ? local_of(g) : g, at::Tensor()};
  }
};

// NOTE [to_local gradients in the forward's layout]: the gradient of to_local's output is a plain
// tensor laid out as autograd made it (k's gradient through `k.transpose(-2, -1)` has the
// sequence dim innermost), while the distributed gradient made from it carries the forward's
// global strides. A piece laid out otherwise than those strides say broke the engine's
// invariant: reshape, decomposed on the global strides, took the view path and the piece's view
// raised (torchtitan's attention on local heads could not train). The piece is copied into the
// dense layout of those strides when its own differs; ranks decide from the spec and their piece
// alone, with no communication either way.
at::Tensor in_layout(const at::Tensor& piece, const DTensorSpec& spec) {
  if (piece.numel() <= 1) return piece;
  const std::vector<int64_t> want = at::infer_dense_strides(piece.sizes(), spec.meta().stride);
  for (int64_t d = 0; d < piece.dim(); ++d) {
    if (piece.size(d) > 1 && piece.stride(d) != want[d]) {
      return at::empty_strided(piece.sizes(), want, piece.options()).copy_(piece);
    }
  }
  return piece;
}

struct ToLocalFn : torch::autograd::Function<ToLocalFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dt, DTensorSpec grad) {
    save_specs(ctx, grad, spec_of(dt));
    return local_of(dt).alias();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SpecPair& s = saved_specs(ctx);
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    return {grad_moved(make_dtensor(in_layout(grads[0], s.from), s.from), s.to), at::Tensor()};
  }
};

struct RedistributeFn : torch::autograd::Function<RedistributeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dt, DTensorSpec to) {
    const DTensorSpec& from = spec_of(dt);
    save_specs(ctx, from, to);
    return make_dtensor(redistribute_local(local_of(dt), from, to), to);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grad_moved(grads[0], saved_specs(ctx).from), at::Tensor()};
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
