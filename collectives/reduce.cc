#include "collectives/reduce.h"

#include <ATen/ATen.h>

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "base/error.h"

namespace dtensor::collectives {

const char* reduce_op_problem(ReduceOp op, c10::ScalarType dtype) {
  const bool integral = c10::isIntegralType(dtype, /*includeBool=*/true);
  const bool is_bool = dtype == c10::kBool;
  const char* problem = nullptr;
  if (is_bitwise(op) && !integral) problem = "bitwise reductions need an integer or bool tensor";
  if ((op == ReduceOp::kSum || op == ReduceOp::kAvg) && is_bool) {
    problem = "sum/avg of bool tensors is not defined (use max for 'any', min for 'all')";
  }
  if (op == ReduceOp::kAvg && integral && !is_bool) {
    problem = "avg needs a floating-point tensor (integer division would round)";
  }
  if (c10::isComplexType(dtype) && (op == ReduceOp::kMin || op == ReduceOp::kMax)) {
    problem = "min/max of complex tensors is not defined";
  }
  if (op == ReduceOp::kNorm) {
    problem =
        "a p-norm Partial is reduced as a sum of p-th powers by its redistribute step; "
        "no collective reduces by norm";
  }
  return problem;
}

void check_reduce_op(ReduceOp op, c10::ScalarType dtype, const std::string& what) {
  if (const char* problem = reduce_op_problem(op, dtype)) {
    throw Error(what + ": reduce op " + std::string(reduce_op_name(op)) + " on " +
                c10::toString(dtype) + ": " + problem);
  }
}

void combine(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      at::add_out(out, a, b);
      break;
    case ReduceOp::kProduct:
      if (out.scalar_type() == c10::kBool) {
        at::logical_and_out(out, a, b);
      } else {
        at::mul_out(out, a, b);
      }
      break;
    case ReduceOp::kMin:
      at::minimum_out(out, a, b);
      break;
    case ReduceOp::kMax:
      at::maximum_out(out, a, b);
      break;
    case ReduceOp::kBand:
      at::bitwise_and_out(out, a, b);
      break;
    case ReduceOp::kBor:
      at::bitwise_or_out(out, a, b);
      break;
    case ReduceOp::kBxor:
      at::bitwise_xor_out(out, a, b);
      break;
    case ReduceOp::kNorm:
      throw Error("combine: no collective reduces by norm (NOTE [p-norm Partial])");
  }
}

namespace {
template <class T>
void combine_loop(void* out, const void* a, const void* b, int64_t n, ReduceOp op) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (op == ReduceOp::kProduct) {
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] * y[i];
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
  }
}
constexpr int64_t kFoldBlockBytes = 2048;  // the accumulator (NOTE [fused fold])

// acc = a op b and acc = acc op b over one whole block: fixed trip counts and restrict pointers,
// so -O2 vectorises them.
template <class T, bool kMul>
void fold_pair(T* __restrict acc, const T* __restrict a, const T* __restrict b) {
  for (int64_t i = 0; i < kFoldBlockBytes / static_cast<int64_t>(sizeof(T)); ++i) {
    acc[i] = kMul ? a[i] * b[i] : a[i] + b[i];
  }
}
template <class T, bool kMul>
void fold_more(T* __restrict acc, const T* __restrict b) {
  for (int64_t i = 0; i < kFoldBlockBytes / static_cast<int64_t>(sizeof(T)); ++i) {
    acc[i] = kMul ? acc[i] * b[i] : acc[i] + b[i];
  }
}

template <class T, bool kMul>
void fold_typed(absl::Span<char* const> dsts, absl::Span<const bool> streaming,
                absl::Span<const char* const> srcs, int64_t n) {
  constexpr int64_t kBlock = kFoldBlockBytes / static_cast<int64_t>(sizeof(T));
  alignas(64) T acc[kBlock];
  const auto src = [&](size_t s, int64_t i) { return reinterpret_cast<const T*>(srcs[s]) + i; };
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    if (srcs.size() == 1) {
      std::memcpy(acc, src(0, i), kFoldBlockBytes);
    } else {
      fold_pair<T, kMul>(acc, src(0, i), src(1, i));
    }
    for (size_t s = 2; s < srcs.size(); ++s) fold_more<T, kMul>(acc, src(s, i));
    for (size_t d = 0; d < dsts.size(); ++d) {
      char* dst = dsts[d] + i * sizeof(T);
      if (streaming[d]) {
        stream_store(dst, reinterpret_cast<const char*>(acc), kFoldBlockBytes);
      } else {
        std::memcpy(dst, acc, kFoldBlockBytes);
      }
    }
  }
  const int64_t rest = n - i;  // the tail, element by element
  for (int64_t j = 0; j < rest; ++j) {
    T v = src(0, i)[j];
    for (size_t s = 1; s < srcs.size(); ++s) v = kMul ? v * src(s, i)[j] : v + src(s, i)[j];
    acc[j] = v;
  }
  for (size_t d = 0; d < dsts.size() && rest > 0; ++d) {
    std::memcpy(dsts[d] + i * sizeof(T), acc, rest * sizeof(T));
  }
  if (std::find(streaming.begin(), streaming.end(), true) != streaming.end()) stream_fence();
}

template <class T>
void fold_op(absl::Span<char* const> dsts, absl::Span<const bool> streaming,
             absl::Span<const char* const> srcs, int64_t n, ReduceOp op) {
  if (op == ReduceOp::kProduct) {
    fold_typed<T, true>(dsts, streaming, srcs, n);
  } else {
    fold_typed<T, false>(dsts, streaming, srcs, n);
  }
}

// Calls f(T{}) with the C++ type of the dtypes combine_raw serves; false for the others.
template <class F>
bool with_raw_type(c10::ScalarType dtype, F&& f) {
  switch (dtype) {
    case c10::kFloat:
      f(float{});
      return true;
    case c10::kDouble:
      f(double{});
      return true;
    case c10::kInt:
      f(int32_t{});
      return true;
    case c10::kLong:
      f(int64_t{});
      return true;
    default:
      return false;
  }
}

}  // namespace

void stream_store(char* dst, const char* src, size_t bytes) {
#if defined(__x86_64__) || defined(__i386__)
  const size_t head = std::min(bytes, (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  bytes -= head;
  const size_t body = bytes & ~size_t{63};
  for (size_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + body, src + body, bytes - body);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void stream_fence() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_sfence();
#endif
}

bool fold_raw(absl::Span<char* const> dsts, absl::Span<const bool> streaming,
              absl::Span<const char* const> srcs, int64_t n, c10::ScalarType dtype, ReduceOp op) {
  if (!combine_raw_serves(dtype, op) || srcs.empty() || dsts.size() != streaming.size()) {
    return false;
  }
  return with_raw_type(dtype, [&](auto t) { fold_op<decltype(t)>(dsts, streaming, srcs, n, op); });
}

bool combine_raw_serves(c10::ScalarType dtype, ReduceOp op) {
  const bool op_ok = op == ReduceOp::kSum || op == ReduceOp::kAvg || op == ReduceOp::kProduct;
  return op_ok && (dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kInt ||
                   dtype == c10::kLong);
}

bool combine_raw(void* out, const void* a, const void* b, int64_t n, c10::ScalarType dtype,
                 ReduceOp op) {
  if (!combine_raw_serves(dtype, op)) return false;
  return with_raw_type(dtype, [&](auto t) { combine_loop<decltype(t)>(out, a, b, n, op); });
}

void reduce_into(at::Tensor& acc, const at::Tensor& other, ReduceOp op) {
  combine(acc, acc, other, op);
}

void finish_reduce(at::Tensor& acc, ReduceOp op, int64_t group_size) {
  if (op == ReduceOp::kAvg && group_size > 1) acc.div_(group_size);
}

}  // namespace dtensor::collectives
