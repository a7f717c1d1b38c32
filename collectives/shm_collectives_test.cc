// The shm backend across real processes: every functional collective for world sizes 1-4 against
// the single-device result computed from all ranks' deterministic inputs, chunking through small
// and default buffers, mismatched calls, dead peers turning into bounded named errors, and no
// segment left in /dev/shm by any of it.
//
// The harness (forked ranks of a fresh job, /dev/shm leftovers) is testing/shm_ranks.h;
// symmetric_memory_test.cc runs the same collectives on symmetric memory.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <sstream>
#include <thread>

#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "collectives/reduce.h"
#include "collectives/shm_segment.h"
#include "collectives/testing/collective_reference.h"
#include "collectives/testing/fork_ranks.h"
#include "collectives/testing/shm_ranks.h"

namespace dtensor::collectives {
namespace {

using namespace dtensor::testing;  // inputs and single-device references

using std::chrono::milliseconds;

// ---- inputs and references (computed inside the children) ----

const std::vector<c10::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kLong,
                                              at::kBool};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAvg,     ReduceOp::kMin,
                                    ReduceOp::kMax, ReduceOp::kProduct, ReduceOp::kBand,
                                    ReduceOp::kBor, ReduceOp::kBxor};

const std::string kWorld = RankContext::kWorld;

// ---- the collectives, each checked on every rank; `m` scales the sizes (chunking tests) ----

void check_all_reduce(int64_t n, int64_t r, int64_t m) {
  for (auto dtype : kDtypes) {
    for (auto op : kOps) {
      if (!valid_reduce(op, dtype)) continue;
      for (std::vector<int64_t> shape : {std::vector<int64_t>{0}, {7 * m}, {3, 4 * m}}) {
        const at::Tensor want = reference_reduce(all_inputs(n, shape, dtype), op);
        const at::Tensor in = input_for(r, shape, dtype);
        const at::Tensor before = in.clone();
        const at::Tensor out = all_reduce(in, op, kWorld);
        expect_same(out, want, "all_reduce " + std::string(reduce_op_name(op)));
        expect(at::equal(in, before), "all_reduce modified its input");
        // In place (NOTE [in-place all_reduce]): the output is the input.
        all_reduce_into(in, in, op, kWorld);
        expect_same(in, want, "in-place all_reduce " + std::string(reduce_op_name(op)));
      }
    }
  }
}

void check_all_gather(int64_t n, int64_t r, int64_t m) {
  for (auto dtype : {at::kFloat, at::kLong, at::kBool, at::kBFloat16}) {
    const auto inputs = all_inputs(n, {2, 3 * m, 2}, dtype);
    for (int64_t dim : {0, 1, -1}) {
      expect_same(all_gather_into_tensor(inputs[r], dim, kWorld), at::cat(inputs, dim),
                  "all_gather dim " + std::to_string(dim));
    }
  }
  expect(all_gather_into_tensor(at::empty({0, 3}), 0, kWorld).sizes() == at::IntArrayRef({0, 3}),
         "all_gather of a zero-size tensor");
  expect(all_gather_into_tensor(at::empty({2, 0}), 1, kWorld).sizes() == at::IntArrayRef({2, 0}),
         "all_gather of a zero-size tensor on dim 1");
}

void check_all_gather_uneven(int64_t n, int64_t r, int64_t m) {
  for (int64_t dim : {0, 1}) {
    std::vector<int64_t> sizes;
    std::vector<at::Tensor> inputs;
    for (int64_t q = 0; q < n; ++q) {
      sizes.push_back((q * 2 + 1) % 3 * m);  // 1, 0, 2, 1 (times m): includes empty ones
      std::vector<int64_t> shape = {3, 3};
      shape[dim] = sizes.back();
      inputs.push_back(input_for(q, shape, at::kFloat));
    }
    expect_same(all_gather_uneven(inputs[r], dim, sizes, kWorld), at::cat(inputs, dim),
                "all_gather_uneven dim " + std::to_string(dim));
  }
}

void check_reduce_scatter(int64_t n, int64_t r, int64_t m) {
  for (auto dtype : kDtypes) {
    for (auto op : kOps) {
      if (!valid_reduce(op, dtype)) continue;
      for (int64_t dim : {0, 1}) {
        std::vector<int64_t> shape = {2, 3 * m};
        shape[dim] = 2 * n * m;
        const auto inputs = all_inputs(n, shape, dtype);
        expect_same(
            reduce_scatter_tensor(inputs[r], op, dim, kWorld),
            reference_reduce(inputs, op).chunk(n, dim)[r],
            "reduce_scatter " + std::string(reduce_op_name(op)) + " dim " + std::to_string(dim));
      }
    }
  }
}

void check_all_to_all_single(int64_t n, int64_t r, int64_t m) {
  const auto c = testing::uneven_all_to_all(n, m);
  expect_same(all_to_all_single(c.inputs[r], c.output_splits(r), c.input_splits(r), kWorld),
              c.expected(r), "all_to_all_single");
}

void check_all_to_all(int64_t n, int64_t r, int64_t m) {
  for (auto [split, concat] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 0}, {1, 1}, {0, 0}}) {
    std::vector<int64_t> shape = {2, 3 * m};
    shape[split] = 2 * n * m;
    const auto inputs = all_inputs(n, shape, at::kDouble);
    std::vector<at::Tensor> received;
    for (int64_t s = 0; s < n; ++s) received.push_back(inputs[s].chunk(n, split)[r]);
    expect_same(all_to_all(inputs[r], split, concat, kWorld), at::cat(received, concat),
                "all_to_all " + std::to_string(split) + "->" + std::to_string(concat));
  }
}

void check_broadcast_and_barrier(int64_t n, int64_t r, int64_t m) {
  for (auto dtype : {at::kFloat, at::kBool, at::kLong}) {
    const auto inputs = all_inputs(n, {4 * m, 2}, dtype);
    for (int64_t src = 0; src < n; ++src) {
      expect_same(broadcast(inputs[r], src, kWorld), inputs[src], "broadcast");
      barrier(kWorld);
    }
  }
  expect_same(broadcast(at::empty({0, 2}), n - 1, kWorld), at::empty({0, 2}), "zero-size bcast");
  expect_same(all_reduce(at::empty({0}), ReduceOp::kSum, kWorld), at::empty({0}), "zero-size ar");
}

void check_coalesced_and_async(int64_t n, int64_t r, int64_t m) {
  const std::vector<std::vector<int64_t>> shapes = {{3 * m}, {2, 2}, {4}};
  const std::vector<c10::ScalarType> dtypes = {at::kFloat, at::kLong, at::kFloat};
  std::vector<std::vector<at::Tensor>> inputs(n);  // [rank][tensor]
  for (int64_t q = 0; q < n; ++q) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      std::vector<int64_t> s = shapes[i];
      s[0] *= n;
      inputs[q].push_back(input_for(q, s, dtypes[i], static_cast<int64_t>(i)));
    }
  }
  const auto reduced = all_reduce_coalesced(inputs[r], ReduceOp::kMax, kWorld);
  const auto gathered = all_gather_into_tensor_coalesced(inputs[r], 0, kWorld);
  const auto scattered = reduce_scatter_tensor_coalesced(inputs[r], ReduceOp::kSum, 0, kWorld);
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::vector<at::Tensor> parts;
    for (int64_t s = 0; s < n; ++s) parts.push_back(inputs[s][i]);
    expect_same(reduced[i], reference_reduce(parts, ReduceOp::kMax), "all_reduce_coalesced");
    expect_same(gathered[i], at::cat(parts), "all_gather_coalesced");
    expect_same(scattered[i], reference_reduce(parts, ReduceOp::kSum).chunk(n)[r],
                "reduce_scatter_coalesced");
  }
  // Async calls complete in issue order; a sync call queues behind them.
  const auto sq = all_inputs(n, {4, 4 * m}, at::kFloat);
  const at::Tensor a = all_reduce(sq[r], ReduceOp::kSum, kWorld, true);
  const at::Tensor b = all_gather_into_tensor(sq[r], 1, kWorld, true);
  const at::Tensor c = broadcast(sq[r], 0, kWorld, true);
  const at::Tensor d = all_reduce(sq[r], ReduceOp::kMax, kWorld);
  expect_same(wait_tensor(a), reference_reduce(sq, ReduceOp::kSum), "async all_reduce");
  expect_same(wait_tensor(b), at::cat(sq, 1), "async all_gather");
  expect_same(wait_tensor(c), sq[0], "async broadcast");
  expect_same(d, reference_reduce(sq, ReduceOp::kMax), "sync after async");
  expect(work_of(a) == nullptr, "waited work is forgotten");
}

void check_everything(int64_t n, int64_t r, int64_t m) {
  check_all_reduce(n, r, m);
  check_all_gather(n, r, m);
  check_all_gather_uneven(n, r, m);
  check_reduce_scatter(n, r, m);
  check_all_to_all_single(n, r, m);
  check_all_to_all(n, r, m);
  check_broadcast_and_barrier(n, r, m);
  check_coalesced_and_async(n, r, m);
}

class ShmCollectivesTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(ShmCollectivesTest, AllReduceEveryDtypeAndOp) {
  run_ranks(GetParam(), [](int64_t n, int64_t r) { check_all_reduce(n, r, 1); });
}

TEST_P(ShmCollectivesTest, AllGatherDimsAndZeroSize) {
  run_ranks(GetParam(), [](int64_t n, int64_t r) { check_all_gather(n, r, 1); });
}

TEST_P(ShmCollectivesTest, AllGatherUnevenWithEmptyContributions) {
  run_ranks(GetParam(), [](int64_t n, int64_t r) { check_all_gather_uneven(n, r, 1); });
}

TEST_P(ShmCollectivesTest, ReduceScatterEveryDtypeAndOp) {
  run_ranks(GetParam(), [](int64_t n, int64_t r) { check_reduce_scatter(n, r, 1); });
}

TEST_P(ShmCollectivesTest, AllToAllSingleUnevenAndSplitConcat) {
  run_ranks(GetParam(), [](int64_t n, int64_t r) {
    check_all_to_all_single(n, r, 1);
    check_all_to_all(n, r, 1);
  });
}

TEST_P(ShmCollectivesTest, BroadcastBarrierAndZeroSize) {
  run_ranks(GetParam(), [](int64_t n, int64_t r) { check_broadcast_and_barrier(n, r, 1); });
}

TEST_P(ShmCollectivesTest, CoalescedAndAsync) {
  run_ranks(GetParam(), [](int64_t n, int64_t r) { check_coalesced_and_async(n, r, 1); });
}

// 256-byte data areas (128-byte steps) push every collective through many chunk boundaries.
TEST_P(ShmCollectivesTest, EverythingThroughTinyBuffers) {
  RunOptions options;
  options.buffer_bytes = "256";
  run_ranks(
      GetParam(), [](int64_t n, int64_t r) { check_everything(n, r, 11); }, options);
}

// With DTENSOR_SHM_CMA=1, calls larger than one step go by cross memory attach (NOTE [shm cross
// memory attach]) instead of through the buffers round by round.
TEST_P(ShmCollectivesTest, EverythingByCrossMemoryAttach) {
  RunOptions options;
  options.buffer_bytes = "256";
  options.cma = "1";
  run_ranks(
      GetParam(), [](int64_t n, int64_t r) { check_everything(n, r, 11); }, options);
}

// Ranks that disagree on cross memory attach (only rank 0 asks for it) fall back to the buffers.
TEST_P(ShmCollectivesTest, EverythingWhenOnlySomeRanksUseCrossMemoryAttach) {
  RunOptions options;
  options.buffer_bytes = "256";
  options.cma = "1";
  options.cma_rank = 0;
  run_ranks(
      GetParam(), [](int64_t n, int64_t r) { check_everything(n, r, 11); }, options);
}

void check_ten_mebibyte_messages(int64_t n, int64_t r) {
  const int64_t numel = (10 << 20) / 4 + 3;  // 10 MiB of floats, not a whole number of steps
  const auto inputs = all_inputs(n, {numel}, at::kFloat);
  expect_same(all_reduce(inputs[r], ReduceOp::kSum, kWorld),
              reference_reduce(inputs, ReduceOp::kSum), "10 MiB all_reduce");
  expect_same(all_gather_into_tensor(inputs[r], 0, kWorld), at::cat(inputs), "10 MiB gather");
  expect_same(broadcast(inputs[r], n - 1, kWorld), inputs[n - 1], "10 MiB broadcast");
  const auto even = all_inputs(n, {n * (numel / n)}, at::kFloat);
  expect_same(reduce_scatter_tensor(even[r], ReduceOp::kMax, 0, kWorld),
              reference_reduce(even, ReduceOp::kMax).chunk(n)[r], "10 MiB reduce_scatter");
  std::vector<at::Tensor> received;
  for (int64_t s = 0; s < n; ++s) received.push_back(even[s].chunk(n)[r]);
  expect_same(all_to_all_single(even[r], {}, {}, kWorld), at::cat(received), "10 MiB a2a");
}

TEST_P(ShmCollectivesTest, TenMebibyteMessagesByCrossMemoryAttach) {
  RunOptions options;
  options.cma = "1";
  run_ranks(GetParam(), check_ten_mebibyte_messages, options);
}

// Messages many times larger than the default 1 MiB data area.
TEST_P(ShmCollectivesTest, TenMebibyteMessages) {
  run_ranks(GetParam(), check_ten_mebibyte_messages);
}

TEST_P(ShmCollectivesTest, MismatchedCallsFailOnEveryRankThenTheGroupGoesOn) {
  const int64_t n = GetParam();
  if (n == 1) return;
  run_ranks(n, [](int64_t n, int64_t r) {
    std::string e =
        error_of([&] { all_reduce(at::ones({r == 1 ? 4 : 3}), ReduceOp::kSum, kWorld); });
    expect(contains(e,
                    "all_reduce on group 'world' (shm): ranks disagree: number of elements "
                    "differs: rank 0 has 3, group rank 1 has 4"),
           "numel mismatch: '" + e + "'");
    e = error_of(
        [&] { all_gather_into_tensor(at::ones({2}, r == 1 ? at::kInt : at::kFloat), 0, kWorld); });
    expect(contains(e, "ranks disagree: dtype differs"), "dtype mismatch: '" + e + "'");
    e = error_of([&] { broadcast(at::ones({2}), r == 1 ? 1 : 0, kWorld); });
    expect(contains(e, "ranks disagree: broadcast source differs"), "src mismatch: '" + e + "'");
    e = error_of([&] {
      if (r == 1) return barrier(kWorld);
      all_reduce(at::ones({2}), ReduceOp::kSum, kWorld);
    });
    expect(contains(e, "ranks disagree: collective differs"), "kind mismatch: '" + e + "'");
    // NOTE [collective purpose]: equal calls for different parts of the program.
    e = error_of([&] {
      CommPurpose purpose(r == 1 ? "FSDP layers.1" : "FSDP layers.0");
      all_reduce(at::ones({2}), ReduceOp::kSum, kWorld);
    });
    expect(contains(e,
                    "ranks disagree: purpose differs: rank 0 issues this collective for "
                    "'FSDP layers.0', group rank 1 for 'FSDP layers.1'"),
           "purpose mismatch: '" + e + "'");
    // Rank 0 expects one row from everyone; the others send it two.
    std::vector<int64_t> out(n, r == 0 ? 1 : 2), in(n, 2);
    e = error_of([&] { all_to_all_single(at::ones({2 * n}), out, in, kWorld); });
    expect(contains(e, "elements to group rank 0, which expects 1"), "a2a mismatch: '" + e + "'");
    expect_same(all_reduce(at::ones({3}), ReduceOp::kSum, kWorld),
                at::full({3}, static_cast<float>(n)), "all_reduce after mismatches");
  });
}

// The backend does not care whether ranks are processes or threads: all ranks as threads of one
// (forked, so that this process stays single-threaded) child process.
TEST_P(ShmCollectivesTest, RanksAsThreadsOfOneProcess) {
  const int64_t n = GetParam();
  const std::string job = new_job();
  const auto codes = testing::run_forked(1, [&](int) {
    std::vector<std::string> errors(n);
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          auto ctx = std::make_shared<RankContext>(r, n, "shm", job, milliseconds(30000));
          RankScope scope(ctx);
          check_everything(n, r, 3);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int64_t r = 0; r < n; ++r) {
      if (!errors[r].empty())
        throw std::runtime_error("rank " + std::to_string(r) + ": " + errors[r]);
    }
    return 0;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(leftover_segments(job), std::vector<std::string>{});
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmCollectivesTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });

TEST(ShmGroupsTest, MeshDimsAndSubgroupsHaveTheirOwnSegments) {
  run_ranks(4, [](int64_t, int64_t r) {
    const DeviceMesh mesh = DeviceMesh::arange({2, 2}, {"dp", "tp"});
    const auto names = current_context().register_mesh(mesh);
    const at::Tensor x = at::full({2}, static_cast<double>(r), at::kDouble);
    const at::Tensor tp = all_reduce(x, ReduceOp::kSum, names[1]);
    const at::Tensor dp = all_reduce(x, ReduceOp::kSum, names[0]);
    double tp_sum = 0, dp_sum = 0;
    for (int64_t q : mesh.group_ranks(1, r)) tp_sum += q;
    for (int64_t q : mesh.group_ranks(0, r)) dp_sum += q;
    expect(tp[0].item<double>() == tp_sum && dp[0].item<double>() == dp_sum, "mesh sums");
    const std::string a = current_context().new_group({0, 1, 2, 3}, "a");
    const std::string b = current_context().new_group({0, 1, 2, 3}, "b");
    barrier(a);
    barrier(b);
    expect_same(all_reduce(x, ReduceOp::kMax, a), at::full({2}, 3.0, at::kDouble), "group a");
  });
}

// ---- dead peers ----

// Runs `fn` and returns its error and how long it took.
std::pair<std::string, milliseconds> timed_error(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of(fn);
  return {e, std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0)};
}

// A failing rank's error arrives when the first waiting rank's timeout expires (a rank that
// started its call later learns it from that rank, so it may have waited less) and soon after it
// (2 s of slack for a loaded 2-core machine); a later call fails at once with the same message.
void expect_dead_peer(const std::function<void()>& call, const std::string& collective,
                      const std::string& missing) {
  auto [e, took] = timed_error(call);
  expect(contains(e, collective + " #") && contains(e, " on group 'world' (shm, ranks ["),
         "names the call: '" + e + "'");
  expect(contains(e, "ranks [" + missing + "] did not arrive within the timeout of 500 ms"),
         "names the missing ranks: '" + e + "'");
  expect(took >= milliseconds(200) && took < milliseconds(2500),
         "failed after " + std::to_string(took.count()) + " ms");
  auto [again, took_again] = timed_error(call);
  expect(again == e, "a later call repeats the error: '" + again + "'");
  // "At once": well under the 500 ms timeout, with slack for a loaded 2-core machine.
  expect(took_again < milliseconds(400), "a later call fails at once");
}

RunOptions short_timeout() {
  RunOptions o;
  o.timeout = milliseconds(500);
  return o;
}

TEST(ShmDeadPeerTest, RankThatNeverArrivesIsNamedWithinTheTimeout) {
  run_ranks(
      3,
      [](int64_t, int64_t r) {
        if (r == 2) return;  // "dies" before the collective (exits without touching the group)
        expect_dead_peer([] { all_reduce(at::ones({2}), ReduceOp::kSum, kWorld); }, "all_reduce",
                         "2");
      },
      short_timeout());
}

TEST(ShmDeadPeerTest, CreatorThatNeverArrivesIsNamedWithinTheTimeout) {
  run_ranks(
      3,
      [](int64_t, int64_t r) {
        if (r == 0) return;  // group rank 0 would have created the segment
        expect_dead_peer([] { barrier(kWorld); }, "barrier", "0");
      },
      short_timeout());
}

TEST(ShmDeadPeerTest, RankThatDiesMidJobIsNamedWithinTheTimeout) {
  run_ranks(
      3,
      [](int64_t, int64_t r) {
        all_reduce(at::ones({2}), ReduceOp::kSum, kWorld);  // everyone has mapped the segment
        if (r == 1) ::_exit(0);                             // dies without any cleanup
        expect_dead_peer([] { all_gather_into_tensor(at::ones({2}), 0, kWorld); },
                         "all_gather_into_tensor", "1");
      },
      short_timeout());
}

// A rank that dies after publishing its input for cross memory attach: the reader's
// process_vm_readv fails, which becomes a CollectiveError naming the rank (never a crash).
TEST(ShmDeadPeerTest, RankThatDiesBeforeItsInputIsReadIsNamed) {
  RunOptions options;
  options.cma = "1";
  run_ranks(
      2,
      [](int64_t, int64_t r) {
        all_reduce(at::ones({2}), ReduceOp::kSum,
                   kWorld);                          // the first call probes cross memory attach
        const at::Tensor big = at::ones({1 << 20});  // 4 MiB: more than one step
        if (r == 1) {
          all_gather_into_tensor(big, 0, kWorld, /*async=*/true);  // posts its input, then waits
          std::this_thread::sleep_for(milliseconds(300));
          ::_exit(0);  // dies while rank 0 has not read its input yet
        }
        std::this_thread::sleep_for(milliseconds(1000));
        const std::string e = error_of([&] { all_gather_into_tensor(big, 0, kWorld); });
        expect(contains(e,
                        "all_gather_into_tensor on group 'world' (shm, ranks [0,1]): reading the "
                        "input of rank 1 (process ") &&
                   contains(e, "by cross memory attach failed"),
               "names the rank: '" + e + "'");
        expect(error_of([&] { all_gather_into_tensor(big, 0, kWorld); }) == e,
               "a later call repeats the error");
      },
      options);
}

TEST(ShmCrossMemoryAttachTest, ReadProcessReportsErrorsAsErrno) {
  const uint64_t word = shm::kProbeWord;
  uint64_t got = 0;
  EXPECT_EQ(shm::read_process(::getpid(), reinterpret_cast<uint64_t>(&word), &got, 8), 0);
  EXPECT_EQ(got, shm::kProbeWord);
  EXPECT_EQ(shm::read_process(::getpid(), 8, &got, 8), EFAULT);  // an unmapped address
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(shm::read_process(child, reinterpret_cast<uint64_t>(&word), &got, 8), ESRCH);
  ::setenv("DTENSOR_SHM_CMA", "1", 1);
  EXPECT_TRUE(shm::cma_enabled());
  ::setenv("DTENSOR_SHM_CMA", "yes", 1);
  EXPECT_THROW(shm::cma_enabled(), dtensor::Error);
  ::setenv("DTENSOR_SHM_CMA", "0", 1);
  EXPECT_FALSE(shm::cma_enabled());
  ::unsetenv("DTENSOR_SHM_CMA");
  EXPECT_FALSE(shm::cma_enabled());
}

// A crash before every rank attached, with no survivor, leaves a segment; the next run of the
// same job name replaces it.
TEST(ShmDeadPeerTest, StaleSegmentOfACrashedRunIsReplaced) {
  const std::string job = new_job();
  {
    ShmSegment stale = ShmSegment::create(shm_segment_name(job, RankContext::kWorld), 1 << 16);
    ASSERT_TRUE(stale.valid());
    stale.data()[0] = 1;  // a header whose creator never finished it
  }                       // unmapped, not unlinked
  ASSERT_EQ(leftover_segments(job).size(), 1u);
  run_ranks(
      2,
      [](int64_t n, int64_t r) {
        expect_same(all_reduce(at::ones({3}), ReduceOp::kSum, kWorld), at::full({3}, 2.0f),
                    "all_reduce over a stale segment's name");
      },
      {}, job);
}

// Seconds per call of fn, over `reps` calls after one warm-up call.
double seconds_per(int reps, const std::function<void()>& fn) {
  fn();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// Informational: latency and bandwidth on this machine (no assertion; machines and their load
// vary). "backend" runs the communicator on a reused output; "functional" allocates its outputs
// per call, as the API does (on this VM fresh pages cost more than the copies).
TEST(ShmPerformance, Report) {
  run_ranks(2, [](int64_t n, int64_t r) {
    const at::Tensor small = at::ones({1024});  // 4 KiB
    const double ar = seconds_per(2000, [&] { all_reduce(small, ReduceOp::kSum, kWorld); });
    Communicator& comm = *current_context().endpoint(kWorld).comm;
    for (int64_t bytes : {int64_t{64} << 10, int64_t{1} << 20, int64_t{16} << 20}) {
      const at::Tensor in = at::ones({bytes / 4});
      CollectiveCall call;
      call.kind = CollectiveKind::kAllGather;
      call.input = in;
      call.output = at::empty({n * bytes / 4});
      call.output_splits.assign(n, bytes / 4);
      const int reps = bytes > (1 << 20) ? 10 : 50;
      const double backend = seconds_per(reps, [&] { comm.run(call); });
      const double functional = seconds_per(reps, [&] { all_gather_into_tensor(in, 0, kWorld); });
      at::Tensor dst = at::empty({bytes / 4});
      const double copy = seconds_per(reps, [&] { dst.copy_(in); });
      // busbw of all_gather: (n - 1) / n of the output bytes per second.
      auto busbw = [&](double s) { return static_cast<double>(bytes) * (n - 1) / s / 1e9; };
      if (r == 0) {
        std::printf(
            "all_gather %8lld B/rank: backend %8.1f us (busbw %5.2f GB/s), functional %8.1f "
            "us (busbw %5.2f GB/s); memcpy %5.2f GB/s\n",
            static_cast<long long>(bytes), backend * 1e6, busbw(backend), functional * 1e6,
            busbw(functional), bytes / copy / 1e9);
      }
    }
    if (r == 0) std::printf("4 KiB all_reduce on 2 ranks: %.1f us\n", ar * 1e6);
  });
  for (int64_t n : {3, 4}) {
    run_ranks(n, [](int64_t n, int64_t r) {
      const at::Tensor small = at::ones({1024});
      const double ar = seconds_per(500, [&] { all_reduce(small, ReduceOp::kSum, kWorld); });
      const double bar = seconds_per(500, [&] { barrier(kWorld); });
      if (r == 0) {
        std::printf("%lld ranks: 4 KiB all_reduce %.1f us, barrier %.1f us\n",
                    static_cast<long long>(n), ar * 1e6, bar * 1e6);
      }
    });
  }
}

}  // namespace
}  // namespace dtensor::collectives
