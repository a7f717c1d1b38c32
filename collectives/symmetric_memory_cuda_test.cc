// CUDA symmetric memory (symmetric_memory_cuda.cc) on 2 real processes sharing GPU 0: each rank
// fills its device buffer, the peers read it through the IPC-opened pointer (by copy and by a
// kernel), and signal pads order them (after the device finished the rank's queued work). Built
// under --config=cuda; skipped where no GPU is usable. The parent process never touches CUDA (a
// CUDA context does not survive fork): the GPU probe runs in a forked child too.

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "collectives/functional.h"
#include "collectives/symmetric_memory.h"
#include "collectives/testing/shm_ranks.h"

namespace dtensor::collectives {
namespace {

using namespace dtensor::testing;

TEST(SymmetricMemoryCuda, PeersReadEachOthersDeviceBuffers) {
  if (!usable_gpu_in_a_child()) GTEST_SKIP() << "no usable GPU (or a CPU-only libtorch)";
  run_ranks(2, [](int64_t n, int64_t r) {
    const c10::Device gpu(c10::kCUDA, 0);
    const at::Tensor t = symmetric_empty({256}, at::kFloat, gpu);
    expect(t.is_cuda() && is_symmetric(t), "a CUDA tensor in symmetric memory");
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

// The peers' buffers as CUDA tensors (buffer_of): torch kernels write this rank's and read the
// peers' through the IPC mappings.
TEST(SymmetricMemoryCuda, KernelsReadPeersBuffersAsTensors) {
  if (!usable_gpu_in_a_child()) GTEST_SKIP() << "no usable GPU (or a CPU-only libtorch)";
  run_ranks(2, [](int64_t n, int64_t r) {
    const c10::Device gpu(c10::kCUDA, 0);
    const at::Tensor t = symmetric_empty({64, 32}, at::kFloat, gpu);
    auto mem = rendezvous(t, RankContext::kWorld);
    t.copy_(at::arange(64 * 32, at::TensorOptions().dtype(at::kFloat)).view({64, 32}) * (r + 1));
    mem->barrier();  // waits for this rank's copy_ first
    at::Tensor sum = at::zeros({64, 32}, t.options());
    for (int64_t p = 0; p < n; ++p) sum.add_(mem->buffer_of(p, {64, 32}, at::kFloat));
    const at::Tensor base =
        at::arange(64 * 32, at::TensorOptions().dtype(at::kFloat)).view({64, 32});
    expect_same(sum.cpu(), base * static_cast<float>(n * (n + 1) / 2), "sum of the peers' buffers");
    mem->barrier();
  });
}

}  // namespace
}  // namespace dtensor::collectives
