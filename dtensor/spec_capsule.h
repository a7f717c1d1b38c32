#pragma once
// Specs kept in an autograd context (saved_data holds IValues only): a (from, to) pair.

#include <torch/csrc/autograd/custom_function.h>

#include "layout/dtensor_spec.h"

namespace dtensor {

struct SpecPair : torch::CustomClassHolder {
  SpecPair(DTensorSpec a, DTensorSpec b) : from(a), to(b) {}
  DTensorSpec from, to;
};

inline void save_specs(torch::autograd::AutogradContext* ctx, DTensorSpec from, DTensorSpec to) {
  ctx->saved_data["specs"] = at::IValue::make_capsule(c10::make_intrusive<SpecPair>(from, to));
}

inline const SpecPair& saved_specs(torch::autograd::AutogradContext* ctx) {
  return *static_cast<const SpecPair*>(ctx->saved_data["specs"].toCapsule().get());
}

}  // namespace dtensor
