#include "layout/tensor_meta.h"

#include <absl/hash/hash.h>
#include <absl/strings/str_join.h>
#include <c10/core/WrapDimMinimal.h>
#include "base/error.h"

#include <algorithm>
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
  // The product of the sizes with size-0 dims counted as 1 bounds the element count and every
  // contiguous stride (contiguous_stride multiplies max(size, 1)): a shape with a size-0 dim has
  // no elements, but [0, 2^40, 2^40]'s strides overflowed int64 (UBSan in
  // tests/fuzz:cli_args_fuzzer; corpus/cli_args_fuzzer/zero_dim_stride_overflow keeps the input).
  int64_t span = 1;
  for (int64_t s : shape) {
    if (s < 0) {
      throw Error("TensorMeta: shape [" + absl::StrJoin(shape, ",") + "] has a negative size " +
                  std::to_string(s));
    }
    if (__builtin_mul_overflow(span, std::max<int64_t>(s, 1), &span)) {
      throw Error("TensorMeta: shape [" + absl::StrJoin(shape, ",") +
                  "] has more elements than int64 can count (size-0 dims counted as 1, as in "
                  "its strides)");
    }
  }
  if (stride.empty()) {
    stride = contiguous_stride(shape);
  } else if (stride.size() != shape.size()) {
    throw Error("TensorMeta: stride [" + absl::StrJoin(stride, ",") + "] has " +
                std::to_string(stride.size()) + " entries for shape [" + absl::StrJoin(shape, ",") +
                "]");
  }
  return TensorMeta{std::move(shape), std::move(stride), dtype};
}

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string TensorMeta::to_string() const {
  std::string out = std::string(c10::toString(dtype)) + "[" + absl::StrJoin(shape, ",") + "]";
  if (stride != contiguous_stride(shape)) out += ":stride[" + absl::StrJoin(stride, ",") + "]";
  return out;
}

size_t TensorMeta::hash() const { return absl::HashOf(static_cast<int>(dtype), shape, stride); }

int64_t normalize_tensor_dim(int64_t dim, int64_t ndim, const char* what) {
  // c10's wrap, with a message that names what the dim is for (and a 0-dim tensor has none).
  DTENSOR_CHECK(ndim > 0 && dim >= -ndim && dim < ndim, what, " ", dim, " is out of range for a ",
                ndim, "-D tensor (expected a dim in [", -ndim, ", ", ndim - 1, "])");
  return c10::maybe_wrap_dim(dim, ndim, /*wrap_scalar=*/false);
}

}  // namespace dtensor
