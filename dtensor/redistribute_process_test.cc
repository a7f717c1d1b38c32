// Redistribute across real processes: 4 forked ranks rendezvous through a TCPStore and run every
// pair of layouts over R, S(0), S(1), P(sum) on a (2,2) mesh (even and uneven shapes) on the shm
// backend and on c10d (Gloo); each rank's result must equal its piece of the global tensor. Plus
// a DTensor gradient through processes.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "collectives/launch_env.h"
#include "collectives/rank_context.h"
#include "collectives/testing/fork_ranks.h"
#include "dtensor/dtensor.h"
#include "dtensor/local_tensor.h"
#include "dtensor/redistribute.h"

namespace dtensor {
namespace {

int rank_body(int rank, int n, int port, const std::string& backend) {
  testing::set_launch_env(rank, n, port);
  at::set_num_threads(1);
  auto ctx = collectives::init_from_env(backend, std::chrono::seconds(60));
  const DeviceMesh mesh = DeviceMesh::arange({2, 2});
  const auto coord = *mesh.coordinate(rank);
  const std::vector<Placement> choices = {Replicate(), Partial(), Shard(0), Shard(1)};
  int failures = 0, runs = 0;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{4, 6}, {5, 3}}) {
    const auto meta = TensorMeta::make(shape, at::kDouble);
    const at::Tensor global =
        (at::arange(meta.numel(), at::kLong) * 5 % 17 - 8).reshape(shape).to(at::kDouble);
    for (Placement a0 : choices) {
      for (Placement a1 : choices) {
        const auto src = DTensorSpec::make(mesh, {a0, a1}, meta);
        for (Placement b0 : choices) {
          for (Placement b1 : choices) {
            if ((b0.is_partial() && !a0.is_partial()) || (b1.is_partial() && !a1.is_partial())) {
              continue;
            }
            const auto dst = DTensorSpec::make(mesh, {b0, b1}, meta);
            const at::Tensor got =
                redistribute_local(local_tensor_for(global, src, coord), src, dst);
            ++runs;
            if (!at::equal(got, local_tensor_for(global, dst, coord))) {
              std::fprintf(stderr, "[rank %d] %s: wrong values\n", rank,
                           plan_redistribute(src, dst)->to_string().c_str());
              ++failures;
            }
          }
        }
      }
    }
  }
  // A gradient through processes: S(0) -> R -> sum(x * w) gives this rank's piece of w.
  const at::Tensor w = at::arange(24, at::kDouble).reshape({4, 6});
  const auto sharded =
      DTensorSpec::make(mesh, {Shard(0), Shard(1)}, TensorMeta::make({4, 6}, at::kDouble));
  const at::Tensor leaf = at::zeros({2, 3}, at::kDouble).requires_grad_(true);
  (from_local(leaf, mesh, {Shard(0), Shard(1)}).full_tensor() * w).sum().backward();
  if (!at::equal(leaf.grad(), local_tensor_for(w, sharded, coord))) {
    std::fprintf(stderr, "[rank %d] wrong gradient\n", rank);
    ++failures;
  }
  std::printf("[rank %d] %s: %d redistributes, %d failures\n", rank, backend.c_str(), runs,
              failures);
  return failures == 0 ? 0 : 1;
}

class RedistributeProcessTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RedistributeProcessTest, EveryPairOnFourProcesses) {
  const std::string backend = GetParam();
  const int port = testing::free_port();
  const auto codes = testing::run_forked(
      4, [&](int r) { return rank_body(r, 4, port, backend); }, std::chrono::seconds(240));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " on " << backend;
}

INSTANTIATE_TEST_SUITE_P(Backends, RedistributeProcessTest, ::testing::Values("shm", "c10d"));

}  // namespace
}  // namespace dtensor
