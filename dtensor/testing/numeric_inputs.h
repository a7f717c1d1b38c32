#pragma once
// Deterministic inputs for the numeric propagation tests (propagation_numeric_test,
// propagation_chain_test): smooth values from a salt, or positive values, masks, indices and
// class labels where an op needs them.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace dtensor::testing {

enum class Data { kAny, kPositive, kMask, kIndex, kClass };

inline at::Tensor make_input(const std::vector<int64_t>& shape, int64_t salt, Data kind) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  const at::Tensor base = at::sin(at::arange(numel, at::kDouble) * 1.37 + salt * 0.71);
  at::Tensor t = base.reshape(shape);
  if (kind == Data::kPositive) t = t.abs() + 0.5;
  if (kind == Data::kMask) t = t.gt(0.2);
  // Indices into the dims of size >= 3 the cases use; classes of a [N, 3] input.
  if (kind == Data::kIndex) t = ((t + 1) * 1.4).floor().to(at::kLong).clamp(0, 2);
  if (kind == Data::kClass) t = ((t + 1) * 1.4).floor().to(at::kLong).clamp(0, 2);
  return t;
}

}  // namespace dtensor::testing
