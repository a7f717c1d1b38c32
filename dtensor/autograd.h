#pragma once
// The one autograd stack of distributed tensors (NOTE [DTensor autograd] in dtensor.h): three
// nodes over at::Tensor distributed tensors (DTensorImpl). The C++ API (api.h) and the DTensor
// value (dtensor.h) both record their movements with these.

#include <ATen/core/Tensor.h>

#include "layout/dtensor_spec.h"

namespace dtensor::autograd {

// A local piece -> the distributed tensor of `spec`. Backward: the gradient brought into the
// convention (the forward layout with Partial read as Replicate), then its piece.
at::Tensor from_local(const at::Tensor& local, const DTensorSpec& spec);
// A distributed tensor -> its piece (an alias). Backward: the local gradient, read with `grad`'s
// placements, brought into the convention.
at::Tensor to_local(const at::Tensor& dtensor, const DTensorSpec& grad);
// A distributed tensor -> the same tensor laid out as `to`. Backward: the gradient, in whatever
// layout it arrives, moved straight into the source's convention.
at::Tensor redistribute(const at::Tensor& dtensor, const DTensorSpec& to);

// `t` laid out by `placements` (no autograd; `t` itself when it already is, or when it is
// plain). Gradients use it to reach the layouts of NOTE [DTensor autograd].
at::Tensor relaid(const at::Tensor& t, const Placements& placements);

}  // namespace dtensor::autograd
