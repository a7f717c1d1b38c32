// The cuda_ipc backend (NOTE [cuda_ipc backend]) on real processes: every collective kind, uneven
// splits, in place, several rounds (a 1 KiB staging buffer), disagreeing ranks, each result
// against the single-device reference (collectives/testing/collective_reference.h). On CPU
// tensors with DTENSOR_CUDA_IPC_STAGE_CPU=1 (the staged algorithm over shared-memory buffers,
// which runs in CI), and on CUDA tensors with 2 and 3 ranks sharing GPU 0 where a GPU is usable
// (the GPU check, tools/gpu/check.sh). The parent never touches CUDA (a context does not survive
// fork).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "collectives/testing/collective_reference.h"
#include "collectives/testing/shm_ranks.h"

namespace dtensor::collectives {
namespace {

using namespace dtensor::testing;

RunOptions ipc_options() {
  RunOptions o;
  o.backend = "cuda_ipc";
  o.timeout = std::chrono::milliseconds(20000);
  return o;
}

// Every collective on `device`, compared with the reference; the staging buffer holds 1 KiB, so
// the larger calls take several rounds (and reduce_scatter/all_to_all slots of 1 KiB / n).
void every_collective(int64_t n, int64_t r, c10::Device device) {
  const std::string world = RankContext::kWorld;
  const auto on = [&](const at::Tensor& t) { return t.to(device); };
  for (const int64_t numel : {int64_t{5}, int64_t{700}}) {
    for (const auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kProduct}) {
      const auto dtype = op == ReduceOp::kAvg ? at::kFloat : at::kLong;
      const auto parts = all_inputs(n, {numel}, dtype);
      const std::string what =
          "all_reduce of " + std::to_string(numel) + " (" + std::string(reduce_op_name(op)) + ")";
      // avg: the exact sum divided on the tensors' device, as one device divides there (CUDA
      // divides by a scalar through its reciprocal: 1 ulp from the CPU's quotient, seen on 3
      // ranks of an H200).
      const at::Tensor want = op == ReduceOp::kAvg
                                  ? on(reference_reduce(parts, ReduceOp::kSum)).div(n).cpu()
                                  : reference_reduce(parts, op);
      expect_same(all_reduce(on(parts[r]), op, world).cpu(), want, what);
    }
    const auto parts = all_inputs(n, {numel}, at::kFloat);
    // In place: the output is the input.
    at::Tensor mine = on(parts[r].clone());
    all_reduce_into(mine, mine, ReduceOp::kSum, world);
    expect_same(mine.cpu(), reference_reduce(parts, ReduceOp::kSum), "all_reduce in place");
    expect_same(all_gather_into_tensor(on(parts[r]), 0, world).cpu(), at::cat(parts),
                "all_gather of " + std::to_string(numel));
    const auto big = all_inputs(n, {n * numel}, at::kFloat);
    expect_same(reduce_scatter_tensor(on(big[r]), ReduceOp::kSum, 0, world).cpu(),
                reference_reduce(big, ReduceOp::kSum).narrow(0, r * numel, numel),
                "reduce_scatter of " + std::to_string(n * numel));
    expect_same(broadcast(on(parts[r]), n - 1, world).cpu(), parts[n - 1], "broadcast");
  }
  // Uneven all_gather: rank q contributes q * 300 + 1 rows.
  std::vector<int64_t> sizes;
  std::vector<at::Tensor> pieces;
  for (int64_t q = 0; q < n; ++q) {
    sizes.push_back(q * 300 + 1);
    pieces.push_back(input_for(q, {q * 300 + 1, 2}, at::kInt));
  }
  expect_same(all_gather_uneven(on(pieces[r]), 0, sizes, world).cpu(), at::cat(pieces),
              "uneven all_gather");
  for (const int64_t scale : {int64_t{1}, int64_t{150}}) {
    const UnevenAllToAll c = uneven_all_to_all(n, scale);
    expect_same(
        all_to_all_single(on(c.inputs[r]), c.output_splits(r), c.input_splits(r), world).cpu(),
        c.expected(r), "uneven all_to_all x" + std::to_string(scale));
  }
  // Equal all_to_all (split dim 0, concat dim 1): chunk q of rank s's rows goes to rank q.
  std::vector<at::Tensor> chunks;
  for (int64_t s = 0; s < n; ++s)
    chunks.push_back(input_for(s, {n * 40, 3}, at::kFloat, s).chunk(n)[r]);
  expect_same(all_to_all(on(input_for(r, {n * 40, 3}, at::kFloat, r)), 0, 1, world).cpu(),
              at::cat(chunks, 1), "all_to_all dim 0 -> 1");
  barrier(world);
}

TEST(CudaIpcBackend, EveryCollectiveOnStagedHostBuffers) {
  for (const int64_t n : {2, 3}) {
    run_ranks(
        n,
        [](int64_t n, int64_t r) {
          ::setenv("DTENSOR_CUDA_IPC_STAGE_CPU", "1", 1);
          ::setenv("DTENSOR_CUDA_IPC_BUFFER_BYTES", "1024", 1);
          every_collective(n, r, c10::kCPU);
        },
        ipc_options());
  }
}

// CPU tensors without the switch run on the shm backend of the same group: same results.
TEST(CudaIpcBackend, HostTensorsRunOnShmByDefault) {
  run_ranks(
      2,
      [](int64_t n, int64_t r) {
        ::unsetenv("DTENSOR_CUDA_IPC_STAGE_CPU");
        every_collective(n, r, c10::kCPU);
      },
      ipc_options());
}

// Ranks that disagree on a call fail on every rank, naming the backend and what differs.
TEST(CudaIpcBackend, DisagreeingRanksFailOnEveryRank) {
  run_ranks(
      2,
      [](int64_t, int64_t r) {
        ::setenv("DTENSOR_CUDA_IPC_STAGE_CPU", "1", 1);
        const std::string err = error_of(
            [&] { all_reduce(at::ones({r == 0 ? 4 : 6}), ReduceOp::kSum, RankContext::kWorld); });
        expect(contains(err, "cuda_ipc") && contains(err, "disagree"), "error: " + err);
      },
      ipc_options());
}

TEST(CudaIpcBackend, EveryCollectiveWithRanksSharingOneGpu) {
  if (!usable_gpu_in_a_child()) GTEST_SKIP() << "no usable GPU (or a CPU-only libtorch)";
  for (const int64_t n : {2, 3}) {
    run_ranks(
        n,
        [](int64_t n, int64_t r) {
          ::setenv("DTENSOR_CUDA_IPC_BUFFER_BYTES", "1024", 1);
          every_collective(n, r, c10::Device(c10::kCUDA, 0));
        },
        ipc_options());
  }
}

}  // namespace
}  // namespace dtensor::collectives
