#pragma once
// Choosing the next token from a row of logits with a request's sampling parameters (OpenAI's
// completions fields): temperature 0 is greedy (greedy_token: the lowest id on an exact tie);
// otherwise softmax(logits / temperature) restricted to the top_k largest and then to the
// smallest set of most likely tokens whose probability reaches top_p, drawn with the request's
// own generator (seeded by `seed`, so a request with a seed is reproducible whatever else runs).
// NOTE [sampling on rank 0]: only rank 0 samples; the chosen ids reach the other ranks in the
// next step's plan (scheduler.h), so ranks never need equal random states.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace dtensor::serving {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0 (or -1): no limit
  double top_p = 1.0;        // (0, 1]
  std::optional<uint64_t> seed;
};

// A generator for one request: seeded with `seed`, or from a nondeterministic source.
at::Generator make_request_generator(const std::optional<uint64_t>& seed);

// The next token from `logits` (1-D float, the vocabulary).
int64_t sample_token(const at::Tensor& logits, const SamplingParams& params, at::Generator& gen);

}  // namespace dtensor::serving
