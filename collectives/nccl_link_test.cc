// Proves the opt-in CUDA/NCCL build compiles and links against /usr/local/cuda (./x turns
// --config=cuda on when nccl.h is there). Asking NCCL its version needs no GPU.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "collectives/communicator.h"
#include "collectives/functional.h"
#include "collectives/launch_env.h"

#ifdef DTENSOR_WITH_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace {

TEST(NcclLinkTest, LibraryAnswersItsVersion) {
#ifdef DTENSOR_WITH_CUDA
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_GE(version, 20000);  // NCCL 2.x encodes major*10000 + minor*100 + patch
  int runtime = 0;
  EXPECT_EQ(cudaRuntimeGetVersion(&runtime), cudaSuccess);
  EXPECT_GT(runtime, 0);
  std::cout << "NCCL " << version << ", CUDA runtime " << runtime << "\n";
#else
  GTEST_SKIP() << "built without --config=cuda: no CUDA/NCCL on this machine";
#endif
}

TEST(NcclLinkTest, BackendIsRegisteredWhenBuiltWithCuda) {
  const auto names = dtensor::collectives::backend_names();
  const bool has_nccl = std::find(names.begin(), names.end(), "nccl") != names.end();
#ifdef DTENSOR_WITH_CUDA
  EXPECT_TRUE(has_nccl);
#else
  EXPECT_FALSE(has_nccl);
#endif
}

// World size 1 on a real GPU (NCCL refuses two ranks on one GPU). Skips without a GPU or without
// a CUDA-enabled libtorch (Debian's is CPU-only).
TEST(NcclLinkTest, AllReduceOnOneGpu) {
#ifdef DTENSOR_WITH_CUDA
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0 || !at::hasCUDA()) {
    GTEST_SKIP() << "no usable GPU here";
  }
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "29731", 1);
  auto ctx = dtensor::collectives::init_from_env("nccl");
  const at::Tensor x = at::arange(8, at::TensorOptions().device(at::kCUDA).dtype(at::kFloat));
  const at::Tensor y = dtensor::collectives::all_reduce(x, dtensor::ReduceOp::kSum, "world");
  EXPECT_TRUE(at::equal(y.cpu(), x.cpu()));
  const at::Tensor g = dtensor::collectives::all_gather_into_tensor(x.view({2, 4}), 1, "world");
  EXPECT_TRUE(at::equal(g.cpu(), x.view({2, 4}).cpu()));
#else
  GTEST_SKIP() << "built without --config=cuda";
#endif
}

}  // namespace
