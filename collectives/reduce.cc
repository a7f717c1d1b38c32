#include "collectives/reduce.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "base/error.h"

namespace dtensor::collectives {

void check_reduce_op(ReduceOp op, c10::ScalarType dtype, const std::string& what) {
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
  if (problem) {
    throw Error(what + ": reduce op " + std::string(reduce_op_name(op)) + " on " +
                                c10::toString(dtype) + ": " + problem);
  }
}

void reduce_into(at::Tensor& acc, const at::Tensor& other, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      acc.add_(other);
      break;
    case ReduceOp::kProduct:
      if (acc.scalar_type() == c10::kBool) {
        acc.logical_and_(other);
      } else {
        acc.mul_(other);
      }
      break;
    case ReduceOp::kMin:
      at::minimum_out(acc, acc, other);
      break;
    case ReduceOp::kMax:
      at::maximum_out(acc, acc, other);
      break;
    case ReduceOp::kBand:
      acc.bitwise_and_(other);
      break;
    case ReduceOp::kBor:
      acc.bitwise_or_(other);
      break;
    case ReduceOp::kBxor:
      acc.bitwise_xor_(other);
      break;
  }
}

void finish_reduce(at::Tensor& acc, ReduceOp op, int64_t group_size) {
  if (op == ReduceOp::kAvg && group_size > 1) acc.div_(group_size);
}

}  // namespace dtensor::collectives
