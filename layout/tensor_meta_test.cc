#include "layout/tensor_meta.h"
#include "base/testing/expect_error.h"

#include <gtest/gtest.h>

#include <functional>

namespace dtensor {
namespace {

using V = std::vector<int64_t>;

using testing::expect_error;

TEST(TensorMetaTest, ContiguousStrideAndText) {
  const TensorMeta m = TensorMeta::make({10, 7});
  EXPECT_EQ(m.stride, (V{7, 1}));
  EXPECT_EQ(m.numel(), 70);
  EXPECT_EQ(m.to_string(), "Float[10,7]");
  EXPECT_EQ(TensorMeta::make({2, 3}, c10::kLong, {1, 2}).to_string(), "Long[2,3]:stride[1,2]");
  EXPECT_EQ(TensorMeta::make({0, 3}).stride, (V{3, 1}));
  expect_error([] { TensorMeta::make({3, -2}); }, "negative size -2");
  expect_error([] { TensorMeta::make({3, 2}, c10::kFloat, {1}); }, "stride [1] has 1 entries");
}

TEST(TensorMetaTest, EqualityCoversShapeStrideAndDtype) {
  EXPECT_EQ(TensorMeta::make({4}), TensorMeta::make({4}));
  EXPECT_NE(TensorMeta::make({4}), TensorMeta::make({4}, c10::kDouble));
  EXPECT_NE(TensorMeta::make({4, 2}), TensorMeta::make({4, 2}, c10::kFloat, {1, 4}));
  EXPECT_NE(TensorMeta::make({4}).hash(), TensorMeta::make({4}, c10::kDouble).hash());
}

TEST(TensorMetaTest, NumelOverflowIsAnError) {
  expect_error(
      [] {
        TensorMeta::make({int64_t{1} << 40, int64_t{1} << 40});
      },
      "more elements than int64 can count");
  // A size-0 dim leaves no elements, but the other sizes still multiply into its strides.
  expect_error(
      [] {
        TensorMeta::make({0, int64_t{1} << 40, int64_t{1} << 40});
      },
      "more elements than int64 can count");
  EXPECT_EQ(TensorMeta::make({0, int64_t{1} << 40}).stride, (V{int64_t{1} << 40, 1}));
}

TEST(TensorMetaTest, NormalizeTensorDim) {
  EXPECT_EQ(normalize_tensor_dim(-1, 3, "dim"), 2);
  EXPECT_EQ(normalize_tensor_dim(0, 3, "dim"), 0);
  expect_error([] { normalize_tensor_dim(3, 3, "Shard dim"); }, "Shard dim 3 is out of range");
  expect_error([] { normalize_tensor_dim(0, 0, "dim"); }, "0-D tensor");
}

}  // namespace
}  // namespace dtensor
