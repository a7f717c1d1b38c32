// Symmetric memory across real processes (NOTE [symmetric memory]) and the shm backend's
// collectives on it (NOTE [symmetric collectives]): every collective for 2-4 ranks, dtypes and
// reduce ops against the single-device result, in place and not, ranks that mix symmetric and
// plain tensors, signal pads, rendezvous errors, and a rank that dies mid-collective: the
// survivors fail within the timeout naming it, and nothing of the job stays in /dev/shm.

#include "collectives/symmetric_memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "collectives/testing/collective_reference.h"
#include "collectives/testing/shm_ranks.h"

namespace dtensor::collectives {
namespace {

using namespace dtensor::testing;

const std::string kWorld = RankContext::kWorld;

// A symmetric tensor holding `value`, rendezvoused on the world group. Every rank allocates
// `capacity` elements (at least value's numel; rendezvous needs equal sizes) and views the start.
at::Tensor symmetric_copy(const at::Tensor& value, int64_t capacity = 0) {
  const at::Tensor buf = symmetric_empty({std::max(capacity, value.numel())}, value.scalar_type());
  rendezvous(buf, kWorld);
  at::Tensor t = buf.narrow(0, 0, value.numel()).view(value.sizes());
  t.copy_(value);
  return t;
}

// Runs fn and checks that it ran exactly `calls` collectives on symmetric memory.
void expect_symmetric(int64_t calls, const std::function<void()>& fn, const std::string& what) {
  const int64_t before = symmetric_collectives_run();
  fn();
  expect(symmetric_collectives_run() - before == calls,
         what + ": ran " + std::to_string(symmetric_collectives_run() - before) +
             " collectives on symmetric memory, not " + std::to_string(calls));
}

const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAvg,     ReduceOp::kMin,
                                    ReduceOp::kMax, ReduceOp::kProduct, ReduceOp::kBxor};

// numel 0, small (one-shot), and past kTwoShotBytes for doubles (two-shot), not a multiple of n
// nor of the fused fold's block.
const std::vector<int64_t> kNumels = {0, 37, (256 << 10) / 8 + 13};

void check_all_reduce(int64_t n, int64_t r) {
  for (auto dtype : {at::kFloat, at::kDouble, at::kLong, at::kBFloat16}) {
    for (auto op : kOps) {
      if (!valid_reduce(op, dtype)) continue;
      for (int64_t numel : kNumels) {
        const std::string what = "all_reduce " + std::string(reduce_op_name(op)) + " of " +
                                 std::to_string(numel) + " " + c10::toString(dtype);
        const at::Tensor want = reference_reduce(all_inputs(n, {numel}, dtype), op);
        const at::Tensor in = symmetric_copy(input_for(r, {numel}, dtype));
        const at::Tensor out = symmetric_copy(at::zeros({numel}, dtype));
        const int64_t sym = numel > 0 ? 1 : 0;  // empty tensors have no memory to look up
        expect_symmetric(
            sym, [&] { expect_same(all_reduce(in, op, kWorld), want, what); },
            what + " (one-shot)");
        expect_symmetric(
            sym, [&] { all_reduce_into(in, out, op, kWorld); }, what + " (into)");
        expect_same(out, want, what + " into a symmetric output");
        expect_same(in, input_for(r, {numel}, dtype), what + ": the input is unchanged");
        expect_symmetric(
            sym, [&] { all_reduce_into(in, in, op, kWorld); }, what + " in place");
        expect_same(in, want, what + " in place");
      }
    }
  }
}

void check_all_gather(int64_t n, int64_t r) {
  for (auto dtype : {at::kFloat, at::kLong, at::kBool}) {
    const auto inputs = all_inputs(n, {5, 3}, dtype);
    const at::Tensor want = at::cat(inputs);
    const at::Tensor in = symmetric_copy(inputs[r]);
    expect_symmetric(
        1, [&] { expect_same(all_gather_into_tensor(in, 0, kWorld), want, "pull"); }, "pull");
    // Along dim 1 the input is made contiguous first (a copy, not symmetric): through the buffers.
    expect_symmetric(
        0, [&] { expect_same(all_gather_into_tensor(in, 1, kWorld), at::cat(inputs, 1), "dim 1"); },
        "pull along dim 1");
    // Push: the outputs are symmetric (the inputs are plain, then symmetric too).
    const at::Tensor out = symmetric_copy(at::zeros({5 * n, 3}, dtype));
    expect_symmetric(
        1, [&] { all_gather_into(inputs[r], out, kWorld); }, "push");
    expect_same(out, want, "push");
    out.zero_();
    expect_symmetric(
        1, [&] { all_gather_into(in, out, kWorld); }, "push from symmetric");
    expect_same(out, want, "push from symmetric");
    // In place: each rank's input is its own chunk of the output.
    out.zero_();
    out.narrow(0, 5 * r, 5).copy_(inputs[r]);
    expect_symmetric(
        1, [&] { all_gather_into(out.narrow(0, 5 * r, 5), out, kWorld); }, "in place");
    expect_same(out, want, "in-place all_gather");
  }
}

void check_reduce_scatter_all_to_all_broadcast(int64_t n, int64_t r) {
  for (auto dtype : {at::kFloat, at::kDouble, at::kLong}) {
    for (auto op : kOps) {
      if (!valid_reduce(op, dtype)) continue;
      const auto inputs = all_inputs(n, {n * 70001}, dtype);  // pieces cross kPieceBytes
      const at::Tensor in = symmetric_copy(inputs[r]);
      expect_symmetric(
          1,
          [&] {
            expect_same(reduce_scatter_tensor(in, op, 0, kWorld),
                        reference_reduce(inputs, op).chunk(n)[r], "reduce_scatter");
          },
          "reduce_scatter");
    }
  }
  const UnevenAllToAll u = uneven_all_to_all(n, 3);
  const at::Tensor in = symmetric_copy(u.inputs[r], 64 * n);
  expect_symmetric(
      1,
      [&] {
        expect_same(all_to_all_single(in, u.output_splits(r), u.input_splits(r), kWorld),
                    u.expected(r), "uneven all_to_all");
      },
      "all_to_all");
  const auto inputs = all_inputs(n, {9, 2}, at::kFloat);
  const at::Tensor b = symmetric_copy(inputs[r]);
  expect_symmetric(
      1, [&] { expect_same(broadcast(b, n - 1, kWorld), inputs[n - 1], "broadcast"); },
      "broadcast");
}

// Only rank 0's tensors are symmetric: every call goes through the buffers, and is right.
void check_mixed(int64_t n, int64_t r) {
  const auto inputs = all_inputs(n, {1000}, at::kFloat);
  at::Tensor in = inputs[r].clone();
  const at::Tensor sym = symmetric_empty({1000}, at::kFloat);
  sym.copy_(inputs[r]);
  rendezvous(sym, kWorld);  // every rank rendezvous; only rank 0 passes it
  if (r == 0) in = sym;
  expect_symmetric(
      0,
      [&] {
        expect_same(all_reduce(in, ReduceOp::kSum, kWorld),
                    reference_reduce(inputs, ReduceOp::kSum), "mixed all_reduce");
        expect_same(all_gather_into_tensor(in, 0, kWorld), at::cat(inputs), "mixed all_gather");
      },
      "mixed");
}

class SymmetricMemoryTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(SymmetricMemoryTest, PeersBuffersAndSignalPads) {
  run_ranks(GetParam(), [](int64_t n, int64_t r) {
    const at::Tensor t = symmetric_empty({4, 8}, at::kInt);
    expect(is_symmetric(t) && !is_symmetric(at::empty({4})), "is_symmetric");
    t.fill_(static_cast<int>(100 + r));
    auto mem = rendezvous(t, kWorld);
    expect(rendezvous(t, kWorld) == mem, "a second rendezvous returns the same handle");
    expect(mem->rank() == r && mem->world_size() == n && mem->buffer_bytes() == 128, "facts");
    mem->barrier();
    for (int64_t p = 0; p < n; ++p) {
      expect_same(mem->buffer_of(p, {4, 8}, at::kInt), at::full({4, 8}, 100 + p, at::kInt),
                  "buffer of peer " + std::to_string(p));
    }
    // Each rank writes its rank into its right neighbour's buffer, then signals it.
    const int64_t right = (r + 1) % n, left = (r + n - 1) % n;
    mem->barrier(1);
    mem->buffer_of(right, {32}, at::kInt, 0).fill_(static_cast<int>(r));
    mem->put_signal(right, 2);
    mem->wait_signal(left, 2);
    expect_same(t, at::full({4, 8}, left, at::kInt), "written by the left neighbour");
    mem->barrier(1);
  });
}

// The fused fold (NOTE [fused fold]) with ordinary stores under 128 KiB, streaming from there
// (NOTE [streaming stores]): the largest case of every dtype streams. (A 4 MiB case took the
// 4-rank run past two minutes under ASan.)
TEST_P(SymmetricMemoryTest, AllReduceOneShotTwoShotAndInPlace) {
  RunOptions options;
  options.stream_bytes = "131072";
  run_ranks(GetParam(), check_all_reduce, options);
}

// Every copy with streaming stores (NOTE [streaming stores]), down to a few unaligned bytes.
TEST_P(SymmetricMemoryTest, AllGatherPullPushAndInPlace) {
  RunOptions options;
  options.stream_bytes = "0";
  run_ranks(GetParam(), check_all_gather, options);
}

TEST_P(SymmetricMemoryTest, ReduceScatterAllToAllBroadcast) {
  RunOptions options;
  options.stream_bytes = "0";
  run_ranks(GetParam(), check_reduce_scatter_all_to_all_broadcast, options);
}

TEST_P(SymmetricMemoryTest, RanksMixingSymmetricAndPlainTensors) {
  RunOptions options;
  options.buffer_bytes = "256";  // the fallback crosses many chunks
  run_ranks(GetParam(), check_mixed, options);
}

// By default calls under 64 KiB go through the buffers (DTENSOR_SHM_SYMMETRIC_MIN_BYTES).
TEST(SymmetricMemoryThreshold, SmallCallsGoThroughTheBuffers) {
  RunOptions options;
  options.symmetric_min_bytes = "";  // the default
  run_ranks(
      2,
      [](int64_t n, int64_t r) {
        for (int64_t numel : {int64_t{1000}, int64_t{64 << 10}}) {
          const auto inputs = all_inputs(n, {numel}, at::kFloat);
          const at::Tensor in = symmetric_copy(inputs[r]);
          expect_symmetric(
              numel * 4 >= (64 << 10) ? 1 : 0,
              [&] {
                expect_same(all_reduce(in, ReduceOp::kSum, kWorld),
                            reference_reduce(inputs, ReduceOp::kSum), "all_reduce");
              },
              "all_reduce of " + std::to_string(numel * 4) + " bytes");
        }
      },
      options);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SymmetricMemoryTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(SymmetricMemoryErrors, SizesThatDifferFailRendezvousOnEveryRank) {
  run_ranks(2, [](int64_t, int64_t r) {
    const at::Tensor t = symmetric_empty({r == 0 ? 4 : 5}, at::kFloat);
    std::string err;
    try {
      rendezvous(t, kWorld);
    } catch (const Error& e) {
      err = e.what();
    }
    expect(contains(err, "allocated different sizes") && contains(err, "global rank 0: 16") &&
               contains(err, "global rank 1: 20"),
           "rendezvous error: " + err);
    bool refused = false;
    try {
      rendezvous(at::empty({4}), kWorld);
    } catch (const Error& e) {
      refused = contains(e.what(), "not allocated by symmetric_empty");
    }
    expect(refused, "a plain tensor is refused");
  });
}

TEST(SymmetricMemoryErrors, WaitForASignalThatNeverComesNamesThePeer) {
  RunOptions options;
  options.timeout = milliseconds(500);
  run_ranks(
      2,
      [](int64_t, int64_t r) {
        auto mem = rendezvous(symmetric_empty({8}, at::kFloat), kWorld);
        if (r == 1) {
          const std::string err = error_of([&] { mem->wait_signal(0, 3); });
          expect(contains(err, "wait_signal") && contains(err, "global rank 0 did not answer"),
                 "error: " + err);
        }
      },
      options);
}

// A rank dies in the middle of a job that uses symmetric memory: the survivor's next collective
// on it fails within the timeout naming the dead rank, and nothing of the job is left in
// /dev/shm (every name was unlinked at rendezvous).
TEST(SymmetricMemoryErrors, RankThatDiesMidJobIsNamedAndNothingIsLeft) {
  const std::string job = new_job();
  const auto codes = run_forked(2, [&](int rank) {
    at::set_num_threads(1);
    auto ctx = std::make_shared<RankContext>(rank, 2, "shm", job, milliseconds(500));
    RankScope scope(ctx);
    const at::Tensor t = symmetric_copy(at::ones({1 << 16}));
    all_reduce(t, ReduceOp::kSum, kWorld);
    if (rank == 1) ::_exit(0);  // dies without a word
    const auto start = std::chrono::steady_clock::now();
    const std::string err = error_of([&] { all_reduce(t, ReduceOp::kSum, kWorld); });
    const auto waited = std::chrono::steady_clock::now() - start;
    expect(contains(err, "ranks [1] did not") && waited < std::chrono::seconds(5), "error: " + err);
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  EXPECT_EQ(leftover_segments(job), std::vector<std::string>{});
}

}  // namespace
}  // namespace dtensor::collectives
