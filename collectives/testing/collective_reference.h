#pragma once
// What every backend's collective tests compare against: deterministic per-rank inputs and the
// single-device result computed from all of them, independent of any backend's code.

#include <ATen/ATen.h>

#include <stdexcept>
#include <vector>

#include "base/error.h"
#include "collectives/reduce.h"

namespace dtensor::testing {

// Rank r's input: small integers (exact in every dtype, so sums and products are exact in any
// order), different per rank and per element.
inline at::Tensor input_for(int64_t rank, std::vector<int64_t> shape, c10::ScalarType dtype,
                            int64_t salt = 0) {
  const int64_t numel = c10::multiply_integers(shape);
  at::Tensor base = (at::arange(numel, at::kLong) * 7 + rank * 3 + salt) % 5 + 1;
  if (dtype == at::kBool) base = base % 2;
  return base.reshape(shape).to(dtype);
}

inline std::vector<at::Tensor> all_inputs(int64_t n, std::vector<int64_t> shape,
                                          c10::ScalarType dtype) {
  std::vector<at::Tensor> v;
  for (int64_t r = 0; r < n; ++r) v.push_back(input_for(r, shape, dtype));
  return v;
}

// True when the engine accepts `op` on `dtype` (see collectives::check_reduce_op).
inline bool valid_reduce(ReduceOp op, c10::ScalarType dtype) {
  try {
    collectives::check_reduce_op(op, dtype, "");
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The single-device reduction of `parts`.
inline at::Tensor reference_reduce(const std::vector<at::Tensor>& parts, ReduceOp op) {
  const c10::ScalarType dtype = parts[0].scalar_type();
  const at::Tensor s = at::stack(parts);
  switch (op) {
    case ReduceOp::kSum:
      return s.sum(0).to(dtype);
    case ReduceOp::kAvg:
      return s.sum(0).to(dtype).div(static_cast<int64_t>(parts.size()));
    case ReduceOp::kMin:
      return std::get<0>(s.min(0));
    case ReduceOp::kMax:
      return std::get<0>(s.max(0));
    case ReduceOp::kProduct:
      // In double (exact for these small integers; CPU prod lacks bf16/half kernels).
      return dtype == at::kBool ? s.all(0) : s.to(at::kDouble).prod(0).to(dtype);
    default: {
      at::Tensor acc = parts[0].clone();
      for (size_t i = 1; i < parts.size(); ++i) {
        acc = op == ReduceOp::kBand  ? at::bitwise_and(acc, parts[i])
              : op == ReduceOp::kBor ? at::bitwise_or(acc, parts[i])
                                     : at::bitwise_xor(acc, parts[i]);
      }
      return acc;
    }
  }
}

// An uneven all_to_all_single case over n ranks: rank s sends (s + d) % 3 * scale rows (of 2
// int64 columns) to rank d, so some pairs exchange nothing.
struct UnevenAllToAll {
  int64_t n, scale;
  std::vector<at::Tensor> inputs;  // per sending rank

  int64_t rows(int64_t s, int64_t d) const { return (s + d) % 3 * scale; }
  std::vector<int64_t> input_splits(int64_t r) const {
    std::vector<int64_t> v;
    for (int64_t d = 0; d < n; ++d) v.push_back(rows(r, d));
    return v;
  }
  std::vector<int64_t> output_splits(int64_t r) const {
    std::vector<int64_t> v;
    for (int64_t s = 0; s < n; ++s) v.push_back(rows(s, r));
    return v;
  }
  // What rank r receives: from each sender, in rank order, the rows meant for r.
  at::Tensor expected(int64_t r) const {
    std::vector<at::Tensor> parts;
    for (int64_t s = 0; s < n; ++s) {
      int64_t off = 0;
      for (int64_t d = 0; d < r; ++d) off += rows(s, d);
      parts.push_back(inputs[s].narrow(0, off, rows(s, r)));
    }
    return at::cat(parts);
  }
};

inline UnevenAllToAll uneven_all_to_all(int64_t n, int64_t scale = 1) {
  UnevenAllToAll c{n, scale, {}};
  for (int64_t s = 0; s < n; ++s) {
    int64_t total = 0;
    for (int64_t d = 0; d < n; ++d) total += c.rows(s, d);
    c.inputs.push_back(input_for(s, {total, 2}, at::kLong, 100 * s));
  }
  return c;
}

}  // namespace dtensor::testing
