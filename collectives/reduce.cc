#include "collectives/reduce.h"

#include <ATen/ATen.h>

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
}  // namespace

bool combine_raw_serves(c10::ScalarType dtype, ReduceOp op) {
  const bool op_ok = op == ReduceOp::kSum || op == ReduceOp::kAvg || op == ReduceOp::kProduct;
  return op_ok && (dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kInt ||
                   dtype == c10::kLong);
}

bool combine_raw(void* out, const void* a, const void* b, int64_t n, c10::ScalarType dtype,
                 ReduceOp op) {
  if (!combine_raw_serves(dtype, op)) return false;
  switch (dtype) {
    case c10::kFloat:
      combine_loop<float>(out, a, b, n, op);
      return true;
    case c10::kDouble:
      combine_loop<double>(out, a, b, n, op);
      return true;
    case c10::kInt:
      combine_loop<int32_t>(out, a, b, n, op);
      return true;
    case c10::kLong:
      combine_loop<int64_t>(out, a, b, n, op);
      return true;
    default:
      return false;
  }
}

void reduce_into(at::Tensor& acc, const at::Tensor& other, ReduceOp op) {
  combine(acc, acc, other, op);
}

void finish_reduce(at::Tensor& acc, ReduceOp op, int64_t group_size) {
  if (op == ReduceOp::kAvg && group_size > 1) acc.div_(group_size);
}

}  // namespace dtensor::collectives
