// Proves the opt-in CUDA/NCCL build compiles and links against /usr/local/cuda (./x turns
// --config=cuda on when nccl.h is there). Asking NCCL its version needs no GPU.

#include <gtest/gtest.h>

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

}  // namespace
