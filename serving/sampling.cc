#include "serving/sampling.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <random>

#include "serving/llama.h"

namespace dtensor::serving {

at::Generator make_request_generator(const std::optional<uint64_t>& seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed ? *seed : std::random_device{}());
}

int64_t sample_token(const at::Tensor& logits, const SamplingParams& params, at::Generator& gen) {
  if (params.temperature == 0.0) return greedy_token(logits);
  at::Tensor scaled = logits.to(at::kDouble) / params.temperature;
  const int64_t vocab = scaled.numel();
  // Sorted descending; a stable sort keeps equal logits in id order (deterministic cuts).
  auto [values, ids] = scaled.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true);
  int64_t keep = vocab;
  if (params.top_k > 0) keep = std::min(keep, params.top_k);
  at::Tensor probs = at::softmax(values.slice(0, 0, keep), 0);
  if (params.top_p < 1.0) {
    // The smallest prefix whose mass reaches top_p (at least one token).
    const at::Tensor cum = probs.cumsum(0);
    const int64_t below = (cum < params.top_p).sum().item<int64_t>();
    keep = std::min(keep, below + 1);
    probs = probs.slice(0, 0, keep);
  }
  const int64_t pick = at::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
  return ids[pick].item<int64_t>();
}

}  // namespace dtensor::serving
