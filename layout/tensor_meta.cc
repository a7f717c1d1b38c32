#include "layout/tensor_meta.h"

#include <absl/hash/hash.h>
#include "base/error.h"
#include "base/strings.h"

#include <stdexcept>


namespace dtensor {

std::vector<int64_t> TensorMeta::contiguous_stride(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    stride[d] = stride[d + 1] * std::max<int64_t>(shape[d + 1], 1);
  }
  return stride;
}

TensorMeta TensorMeta::make(std::vector<int64_t> shape, c10::ScalarType dtype,
                            std::vector<int64_t> stride) {
  int64_t numel = 1;
  for (int64_t s : shape) {
    if (s < 0) {
      throw Error("TensorMeta: shape [" + join(shape) + "] has a negative size " +
                                  std::to_string(s));
    }
    if (__builtin_mul_overflow(numel, s, &numel)) {
      throw Error("TensorMeta: shape [" + join(shape) +
                                  "] has more elements than int64 can count");
    }
  }
  if (stride.empty()) {
    stride = contiguous_stride(shape);
  } else if (stride.size() != shape.size()) {
    throw Error("TensorMeta: stride [" + join(stride) + "] has " +
                                std::to_string(stride.size()) + " entries for shape [" +
                                join(shape) + "]");
  }
  return TensorMeta{std::move(shape), std::move(stride), dtype};
}

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string TensorMeta::to_string() const {
  std::string out = std::string(c10::toString(dtype)) + "[" + join(shape) + "]";
  if (stride != contiguous_stride(shape)) out += ":stride[" + join(stride) + "]";
  return out;
}

size_t TensorMeta::hash() const {
  return absl::HashOf(static_cast<int>(dtype), shape, stride);
}

int64_t normalize_tensor_dim(int64_t dim, int64_t ndim, const char* what) {
  if (ndim == 0 || dim < -ndim || dim >= ndim) {
    throw Error(std::string(what) + " " + std::to_string(dim) +
                                " is out of range for a " + std::to_string(ndim) +
                                "-D tensor (expected a dim in [" + std::to_string(-ndim) + ", " +
                                std::to_string(ndim - 1) + "])");
  }
  return dim < 0 ? dim + ndim : dim;
}

}  // namespace dtensor
