// CUDA symmetric memory (symmetric_memory_cuda.cc) on 2 real processes sharing GPU 0: each rank
// writes its rank into its device buffer, the peers read it through the IPC-opened pointer, and
// signal pads order them. Built under --config=cuda; skipped where no GPU is visible.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "collectives/functional.h"
#include "collectives/symmetric_memory.h"
#include "collectives/testing/shm_ranks.h"

namespace dtensor::collectives {
namespace {

using namespace dtensor::testing;

TEST(SymmetricMemoryCuda, PeersReadEachOthersDeviceBuffers) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no GPU";
  run_ranks(2, [](int64_t n, int64_t r) {
    const at::Tensor t = symmetric_empty({256}, at::kFloat, c10::Device(c10::kCUDA, 0));
    auto mem = rendezvous(t, RankContext::kWorld);
    std::vector<float> mine(256, static_cast<float>(r + 1));
    expect(cudaMemcpy(mem->buffer_ptr(r), mine.data(), 256 * sizeof(float),
                      cudaMemcpyHostToDevice) == cudaSuccess,
           "write own buffer");
    mem->barrier();
    for (int64_t p = 0; p < n; ++p) {
      std::vector<float> got(256, 0);
      expect(cudaMemcpy(got.data(), mem->buffer_ptr(p), 256 * sizeof(float),
                        cudaMemcpyDeviceToHost) == cudaSuccess,
             "read peer buffer");
      expect(got == std::vector<float>(256, static_cast<float>(p + 1)),
             "peer " + std::to_string(p) + "'s buffer");
    }
    mem->barrier();
  });
}

}  // namespace
}  // namespace dtensor::collectives
