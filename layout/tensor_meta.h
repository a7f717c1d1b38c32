#pragma once
// TensorMeta: what a DTensorSpec records about the global tensor: shape, stride, dtype.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtensor {

struct TensorMeta {
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  c10::ScalarType dtype = c10::ScalarType::Float;

  // Contiguous (row-major) stride for `shape`.
  static std::vector<int64_t> contiguous_stride(const std::vector<int64_t>& shape);
  // Builds a meta with a contiguous stride when `stride` is empty. throws dtensor::Error
  // on a negative size or a stride of the wrong rank.
  static TensorMeta make(std::vector<int64_t> shape, c10::ScalarType dtype = c10::ScalarType::Float,
                         std::vector<int64_t> stride = {});

  int64_t ndim() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const;
  // "f32[10,7]" (plus ":stride[...]" when not contiguous).
  std::string to_string() const;
  size_t hash() const;

  friend bool operator==(const TensorMeta& a, const TensorMeta& b) {
    return a.dtype == b.dtype && a.shape == b.shape && a.stride == b.stride;
  }
  friend bool operator!=(const TensorMeta& a, const TensorMeta& b) { return !(a == b); }
};

// Normalises a possibly negative tensor dim against `ndim`; throws dtensor::Error with
// `what` (e.g. "Shard dim") when out of range; a 0-D tensor has no dims at all.
int64_t normalize_tensor_dim(int64_t dim, int64_t ndim, const char* what);

}  // namespace dtensor
