// The c10d backend (ProcessGroupGloo over a real TCPStore) across real processes: every
// functional collective for world sizes 1-4 against the single-device result, rendezvous through
// the torchrun variables (init_from_env), and a dead peer turning into a bounded, named error.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>

#include "collectives/functional.h"
#include "collectives/launch_env.h"
#include "collectives/testing/collective_reference.h"
#include "collectives/testing/fork_ranks.h"

namespace dtensor::collectives {
namespace {

using namespace dtensor::testing;  // inputs and single-device references

struct Checker {
  int64_t rank;
  int failures = 0;
  void operator()(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
    if (got.scalar_type() != want.scalar_type() || got.sizes() != want.sizes() ||
        !at::equal(got, want)) {
      ++failures;
      std::cerr << "[rank " << rank << "] " << what << ": got " << got << " want " << want << "\n";
    }
  }
  void expect(bool ok, const std::string& what) {
    if (ok) return;
    ++failures;
    std::cerr << "[rank " << rank << "] " << what << "\n";
  }
};

void set_launch_env(int rank, int n, int port) { testing::set_launch_env(rank, n, port); }

int conformance(int rank, int n, int port) {
  set_launch_env(rank, n, port);
  auto ctx = init_from_env("c10d", std::chrono::milliseconds(30000));
  Checker check{rank};
  const std::string world = RankContext::kWorld;
  // all_reduce: dtypes Gloo lacks (bool, bfloat16) included.
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kLong, at::kBool}) {
    const auto ins = all_inputs(n, {3, 4}, dtype);
    const at::Tensor s = at::stack(ins);
    if (dtype != at::kBool) {
      check(all_reduce(ins[rank], ReduceOp::kSum, world), s.sum(0).to(dtype), "all_reduce sum");
    }
    check(all_reduce(ins[rank], ReduceOp::kMax, world), std::get<0>(s.max(0)), "all_reduce max");
    check(all_reduce(ins[rank], ReduceOp::kMin, world), std::get<0>(s.min(0)), "all_reduce min");
  }
  {
    const auto ins = all_inputs(n, {5}, at::kDouble);
    check(all_reduce(ins[rank], ReduceOp::kAvg, world), at::stack(ins).sum(0).div(n), "avg");
    const auto li = all_inputs(n, {5}, at::kLong);
    at::Tensor x = li[0].clone();
    for (int r = 1; r < n; ++r) x = at::bitwise_xor(x, li[r]);
    check(all_reduce(li[rank], ReduceOp::kBxor, world), x, "all_reduce bxor");
  }
  // all_gather on dims 0 and 1, uneven, zero-size.
  const auto g = all_inputs(n, {2, 3}, at::kFloat);
  check(all_gather_into_tensor(g[rank], 0, world), at::cat(g, 0), "all_gather dim 0");
  check(all_gather_into_tensor(g[rank], 1, world), at::cat(g, 1), "all_gather dim 1");
  std::vector<int64_t> sizes;
  std::vector<at::Tensor> parts;
  for (int r = 0; r < n; ++r) {
    sizes.push_back(r % 3);
    parts.push_back(input_for(r, {r % 3, 2}, at::kFloat));
  }
  check(all_gather_uneven(parts[rank], 0, sizes, world), at::cat(parts), "all_gather_uneven");
  check(all_gather_into_tensor(at::empty({0, 2}), 0, world), at::empty({0, 2}), "empty gather");
  // reduce_scatter (composed on Gloo).
  const auto rs = all_inputs(n, {2 * n, 3}, at::kFloat);
  check(reduce_scatter_tensor(rs[rank], ReduceOp::kSum, 0, world),
        at::stack(rs).sum(0).chunk(n)[rank], "reduce_scatter");
  // all_to_all, single (uneven) and split/concat.
  const auto a2a = testing::uneven_all_to_all(n);
  check(all_to_all_single(a2a.inputs[rank], a2a.output_splits(rank), a2a.input_splits(rank), world),
        a2a.expected(rank), "all_to_all_single");
  const auto tt = all_inputs(n, {2 * n, 3}, at::kFloat);
  std::vector<at::Tensor> recv;
  for (int s = 0; s < n; ++s) recv.push_back(tt[s].chunk(n, 0)[rank]);
  check(all_to_all(tt[rank], 0, 1, world), at::cat(recv, 1), "all_to_all 0->1");
  // broadcast, coalesced, async, barrier.
  check(broadcast(g[rank], n - 1, world), g[n - 1], "broadcast");
  const auto co = all_reduce_coalesced({g[rank], rs[rank]}, ReduceOp::kSum, world);
  check(co[1], at::stack(rs).sum(0), "all_reduce_coalesced");
  const at::Tensor pending = all_reduce(g[rank], ReduceOp::kSum, world, /*async_op=*/true);
  check(wait_tensor(pending), at::stack(g).sum(0), "async all_reduce");
  barrier(world);
  // NOTE [collective purpose]: equal calls for different parts fail on every rank, naming both.
  if (n > 1) {
    std::string e;
    try {
      CommPurpose purpose(rank == 1 ? "FSDP layers.1" : "FSDP layers.0");
      all_reduce(g[rank], ReduceOp::kSum, world);
    } catch (const CollectiveError& err) {
      e = err.what();
    }
    check.expect(e.find("ranks disagree: purpose differs: rank 0 issues this collective for "
                        "'FSDP layers.0', group rank 1 for 'FSDP layers.1'") != std::string::npos,
                 "purpose mismatch: '" + e + "'");
    check(all_reduce(g[rank], ReduceOp::kSum, world), at::stack(g).sum(0), "after a mismatch");
  }
  // Mesh sub-groups: each dim's group gets its own Gloo group over the one store.
  if (n == 4) {
    const auto names = ctx->register_mesh(DeviceMesh::arange({2, 2}));
    const at::Tensor x = at::full({1}, static_cast<double>(rank), at::kDouble);
    const double row = rank / 2 * 2, col = rank % 2;
    check(all_reduce(x, ReduceOp::kSum, names[1]), at::full({1}, 2 * row + 1, at::kDouble), "tp");
    check(all_reduce(x, ReduceOp::kSum, names[0]), at::full({1}, 2 * col + 2, at::kDouble), "dp");
  }
  // Rank 0 hosts the store: it may not leave while others still set up groups through it (seen:
  // ranks 1 and 3 failed connecting their dp group, "Connection reset by peer", after rank 0,
  // done with its own dp group, had exited). PyTorch's rule too: a barrier before exit.
  barrier(world);
  return check.failures == 0 ? 0 : 1;
}

class C10dCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(C10dCollectivesTest, EveryCollectiveMatchesTheSingleDeviceResult) {
  const int n = GetParam();
  const int port = testing::free_port();
  const auto codes = testing::run_forked(n, [&](int r) { return conformance(r, n, port); });
  for (int r = 0; r < n; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, C10dCollectivesTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });

TEST(C10dFailureTest, DeadPeerGivesABoundedNamedError) {
  const int port = testing::free_port();
  const auto t0 = std::chrono::steady_clock::now();
  const auto codes = testing::run_forked(3, [&](int r) {
    set_launch_env(r, 3, port);
    init_from_env("c10d", std::chrono::milliseconds(2000));
    barrier(RankContext::kWorld);  // everyone is up
    if (r == 2) ::_exit(0);        // rank 2 dies without a word
    try {
      all_reduce(at::ones({4}), ReduceOp::kSum, RankContext::kWorld);
      std::cerr << "[rank " << r << "] all_reduce with a dead peer succeeded\n";
      return 1;
    } catch (const CollectiveError& e) {
      const std::string msg = e.what();
      const bool ok =
          msg.find("all_reduce #2 on group 'world' (c10d/gloo, ranks [0,1,2], global rank " +
                   std::to_string(r) + ")") != std::string::npos &&
          msg.find("global rank 2 reported nothing") != std::string::npos;
      if (!ok) std::cerr << "[rank " << r << "] unexpected message: " << msg << "\n";
      return ok ? 0 : 1;
    }
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

TEST(C10dFailureTest, MissingStoreIsAClearError) {
  try {
    run_threads(
        1, [](int64_t) { barrier(RankContext::kWorld); }, "c10d");
    ADD_FAILURE();
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no rendezvous store"), std::string::npos);
  }
}

TEST(LaunchEnvTest, MalformedVariablesAreNamed) {
  ::setenv("RANK", "x", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  EXPECT_THROW(launch_env_from_environ(), dtensor::Error);
  ::setenv("RANK", "2", 1);
  try {
    launch_env_from_environ();
    ADD_FAILURE();
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("RANK=2 is not in a world of WORLD_SIZE=2"),
              std::string::npos);
  }
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  EXPECT_FALSE(launch_env_from_environ().has_value());
}

}  // namespace
}  // namespace dtensor::collectives
