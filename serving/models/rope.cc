#include "serving/models/rope.h"

#include <ATen/ATen.h>

#include <cmath>

namespace dtensor::serving {

// NOTE [llama3 rope]
// Llama 3.1's frequency rescaling for long contexts: with wavelength w = 2 pi / f of each
// inverse frequency f, old context length L (original_max_position_embeddings), factor s,
// low/high frequency factors a < b: frequencies of w > L / a (low) are divided by s, those of
// w < L / b (high) are kept, and those between are interpolated: (1 - m) f / s + m f with
// m = (L / w - a) / (b - a). Computed in float32 like the reference.
at::Tensor rope_inv_freq(const HfConfig& c) {
  const int64_t hd = c.head_dim;
  at::Tensor inv =
      at::pow(c.rope_theta,
              at::arange(0, hd, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) /
                  static_cast<double>(hd))
          .reciprocal();
  if (!c.llama3_rope) return inv;
  const double old_len = static_cast<double>(c.original_max_positions);
  const double low_wavelen = old_len / c.low_freq_factor;
  const double high_wavelen = old_len / c.high_freq_factor;
  const at::Tensor wavelen = 2 * M_PI / inv;
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv / c.rope_factor, inv);
  const at::Tensor smooth =
      (old_len / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
  const at::Tensor medium =
      at::logical_not(wavelen < high_wavelen).logical_and(at::logical_not(wavelen > low_wavelen));
  return at::where(medium, smoothed, scaled);
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq,
                                               const std::vector<int64_t>& positions,
                                               at::ScalarType dtype) {
  const at::Tensor pos = at::tensor(positions, at::kLong).to(at::kDouble);
  const at::Tensor angles = at::outer(pos, inv_freq.to(at::kDouble));
  const at::Tensor emb = at::cat({angles, angles}, -1);
  return {emb.cos().to(at::kFloat).to(dtype), emb.sin().to(at::kFloat).to(dtype)};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated =
      at::cat({at::neg(x.narrow(-1, half, half)), x.narrow(-1, 0, half)}, -1);
  // [T, head_dim] against [T, heads, head_dim]: one row per token, broadcast over heads.
  const at::Tensor c = cos.unsqueeze(-2), s = sin.unsqueeze(-2);
  return x * c + rotated * s;
}

}  // namespace dtensor::serving
