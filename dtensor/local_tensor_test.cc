#include "dtensor/local_tensor.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest.h>

namespace dtensor {
namespace {

TEST(LocalTensorTest, SliceBoxIsAViewOfTheGlobalTensor) {
  const at::Tensor g = at::arange(70, at::kFloat).reshape({10, 7});
  const at::Tensor v = slice_box(g, LocalBox{{5, 3}, {5, 4}});
  EXPECT_EQ(v.sizes(), at::IntArrayRef({5, 3}));
  EXPECT_EQ(v[0][0].item<float>(), g[5][4].item<float>());
  EXPECT_TRUE(v.is_alias_of(g));
  EXPECT_THROW(slice_box(g, LocalBox{{5}, {0}}), dtensor::Error);
}

// NOTE [inputs move to the mesh's device]: on a CPU mesh nothing moves (the same tensor, no copy);
// meta tensors never move; a CUDA mesh moves a CPU tensor (on a CPU-only libtorch: a clear error).
TEST(LocalTensorTest, InputsMoveToTheMeshDevice) {
  const at::Tensor t = at::ones({2, 3});
  const DeviceMesh cpu = DeviceMesh::arange({2});
  EXPECT_TRUE(to_mesh_device(t, cpu).is_same(t));
  EXPECT_TRUE(to_mesh_device_type(t, cpu).is_same(t));
  const at::Tensor meta = at::empty({2, 3}, at::TensorOptions().device(at::kMeta));
  const DeviceMesh cuda = DeviceMesh::arange({2}, {}, c10::DeviceType::CUDA);
  EXPECT_TRUE(to_mesh_device(meta, cpu).is_same(meta));
  EXPECT_TRUE(to_mesh_device(meta, cuda).is_same(meta));
  EXPECT_TRUE(to_mesh_device_type(meta, cuda).is_same(meta));
  // A CPU-only torch, or a CUDA build on a machine without a GPU: a clear error.
  if (!at::hasCUDA() || c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount() == 0) {
    EXPECT_THROW(to_mesh_device(t, cuda), dtensor::Error);
    EXPECT_THROW(to_mesh_device_type(t, cuda), dtensor::Error);
    return;
  }
  EXPECT_TRUE(to_mesh_device(t, cuda).is_cuda());
  EXPECT_TRUE(to_mesh_device_type(t, cuda).is_cuda());
}

// For every reduce op and integer and float dtypes, reducing the local tensors of a Partial mesh
// dim gives back the global tensor exactly.
TEST(LocalTensorTest, PartialLocalsReduceToTheGlobalTensor) {
  const DeviceMesh mesh = DeviceMesh::arange({2, 3});
  for (auto dtype : {at::kFloat, at::kLong}) {
    const at::Tensor g = at::arange(1, 13, at::TensorOptions().dtype(dtype)).reshape({3, 4});
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                        ReduceOp::kProduct, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
      if (dtype == at::kFloat && is_bitwise(op)) continue;
      const auto spec =
          DTensorSpec::make(mesh, {Shard(0), Partial(op)}, TensorMeta::make({3, 4}, dtype));
      for (int64_t row = 0; row < 2; ++row) {
        std::vector<at::Tensor> parts;
        for (int64_t col = 0; col < 3; ++col)
          parts.push_back(local_tensor_for(g, spec, {row, col}));
        at::Tensor acc = parts[0].clone();
        for (size_t i = 1; i < parts.size(); ++i) {
          switch (op) {
            case ReduceOp::kSum:
            case ReduceOp::kAvg:
              acc = acc + parts[i];
              break;
            case ReduceOp::kMin:
              acc = at::minimum(acc, parts[i]);
              break;
            case ReduceOp::kMax:
              acc = at::maximum(acc, parts[i]);
              break;
            case ReduceOp::kProduct:
              acc = acc * parts[i];
              break;
            case ReduceOp::kBand:
              acc = at::bitwise_and(acc, parts[i]);
              break;
            case ReduceOp::kBor:
              acc = at::bitwise_or(acc, parts[i]);
              break;
            case ReduceOp::kBxor:
              acc = at::bitwise_xor(acc, parts[i]);
              break;
            case ReduceOp::kNorm:  // not in this loop's list (a p-norm's shares are signed powers)
              ADD_FAILURE() << "kNorm";
              break;
          }
        }
        if (op == ReduceOp::kAvg)
          acc = at::div(acc, 3, dtype == at::kLong ? "floor" : c10::optional<c10::string_view>());
        const at::Tensor expected = slice_box(g, local_box(spec, {row, 0}));
        EXPECT_TRUE(at::equal(acc, expected)) << spec.to_string() << " row " << row;
      }
    }
  }
}

TEST(LocalTensorTest, ShapeMismatchIsAnError) {
  const auto spec = DTensorSpec::make(DeviceMesh::arange({2}), {Shard(0)}, TensorMeta::make({4}));
  EXPECT_THROW(local_tensor_for(at::zeros({5}), spec, {0}), dtensor::Error);
}

}  // namespace
}  // namespace dtensor
