#pragma once
// Rotary position embedding of the Hugging Face families: the inverse frequencies (with
// Llama 3.1's "llama3" rescaling) and the cos/sin rows of given positions.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "serving/models/hf_config.h"

namespace dtensor::serving {

// [head_dim / 2] float32: 1 / theta^(2i / head_dim), rescaled by NOTE [llama3 rope] when the
// config asks for it.
at::Tensor rope_inv_freq(const HfConfig& config);

// cos and sin of `positions` x inv_freq, each [positions, head_dim] (the angles repeated for
// both halves, as rotate_half pairs them), in `dtype`, on the CPU.
// NOTE [rotary angles in float64]: the inverse frequencies are float32 values computed as
// transformers computes them; the angles and their cos/sin are computed in float64 and rounded
// once, so they do not depend on the length of the tensor they are computed in (float32
// transcendental kernels may differ by an ulp between vectorized body and tail), and differ from
// the reference's float32 angles only by its rounding.
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq,
                                               const std::vector<int64_t>& positions,
                                               at::ScalarType dtype);

// x * cos + rotate_half(x) * sin, with x [..., T, heads, head_dim] and cos/sin [T, head_dim].
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace dtensor::serving
