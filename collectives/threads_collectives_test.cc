// Every functional collective on the threads backend, for world sizes 1-4, every dtype and every
// meaningful reduce op, against the single-device result computed from all ranks' inputs.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "collectives/reduce.h"
#include "collectives/testing/collective_reference.h"

namespace dtensor::collectives {
namespace {

using namespace dtensor::testing;  // inputs and single-device references

const std::vector<c10::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf,
                                              at::kInt,   at::kLong,   at::kBool};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAvg,     ReduceOp::kMin,
                                    ReduceOp::kMax, ReduceOp::kProduct, ReduceOp::kBand,
                                    ReduceOp::kBor, ReduceOp::kBxor};

void expect_same(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_TRUE(at::equal(got, want)) << what << "\ngot\n" << got << "\nwant\n" << want;
}

class ThreadsCollectivesTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(ThreadsCollectivesTest, AllReduceEveryDtypeAndOp) {
  const int64_t n = GetParam();
  for (auto dtype : kDtypes) {
    for (auto op : kOps) {
      if (!valid_reduce(op, dtype)) continue;
      for (std::vector<int64_t> shape : {std::vector<int64_t>{0}, {7}, {3, 4}}) {
        const at::Tensor want = reference_reduce(all_inputs(n, shape, dtype), op);
        run_threads(n, [&](int64_t r) {
          const at::Tensor in = input_for(r, shape, dtype);
          const at::Tensor before = in.clone();
          const at::Tensor out = all_reduce(in, op, RankContext::kWorld);
          expect_same(out, want, "all_reduce " + std::string(reduce_op_name(op)));
          EXPECT_TRUE(at::equal(in, before)) << "input modified";
          EXPECT_FALSE(out.is_alias_of(in));
        });
      }
    }
  }
}

TEST_P(ThreadsCollectivesTest, InvalidReduceOpIsAClearError) {
  run_threads(GetParam(), [](int64_t r) {
    try {
      all_reduce(at::ones({2}), ReduceOp::kBxor, RankContext::kWorld);
      ADD_FAILURE() << "float bxor accepted";
    } catch (const dtensor::Error& e) {
      EXPECT_NE(std::string(e.what()).find("bxor on Float"), std::string::npos) << e.what();
    }
  });
}

TEST_P(ThreadsCollectivesTest, AllGatherAnyDim) {
  const int64_t n = GetParam();
  for (auto dtype : kDtypes) {
    const std::vector<int64_t> shape = {2, 3, 2};
    const auto inputs = all_inputs(n, shape, dtype);
    for (int64_t dim : {0, 1, 2, -1}) {
      const at::Tensor want = at::cat(inputs, dim);
      run_threads(n, [&](int64_t r) {
        expect_same(all_gather_into_tensor(inputs[r], dim, RankContext::kWorld), want,
                    "all_gather dim " + std::to_string(dim));
      });
    }
  }
  // Zero-size inputs.
  run_threads(n, [&](int64_t r) {
    EXPECT_EQ(all_gather_into_tensor(at::empty({0, 3}), 0, RankContext::kWorld).sizes(),
              at::IntArrayRef({0, 3}));
    EXPECT_EQ(all_gather_into_tensor(at::empty({2, 0}), 0, RankContext::kWorld).sizes(),
              at::IntArrayRef({2 * n, 0}));
  });
}

TEST_P(ThreadsCollectivesTest, AllGatherUneven) {
  const int64_t n = GetParam();
  for (int64_t dim : {0, 1}) {
    std::vector<int64_t> sizes;
    std::vector<at::Tensor> inputs;
    for (int64_t r = 0; r < n; ++r) {
      sizes.push_back((r * 2 + 1) % 3);  // 1, 0, 2, 1: includes empty contributions
      std::vector<int64_t> shape = {3, 3};
      shape[dim] = sizes.back();
      inputs.push_back(input_for(r, shape, at::kFloat));
    }
    const at::Tensor want = at::cat(inputs, dim);
    run_threads(n, [&](int64_t r) {
      expect_same(all_gather_uneven(inputs[r], dim, sizes, RankContext::kWorld), want,
                  "all_gather_uneven dim " + std::to_string(dim));
    });
  }
}

TEST_P(ThreadsCollectivesTest, ReduceScatterAnyDimEveryOp) {
  const int64_t n = GetParam();
  for (auto dtype : kDtypes) {
    for (auto op : kOps) {
      if (!valid_reduce(op, dtype)) continue;
      for (int64_t dim : {0, 1}) {
        std::vector<int64_t> shape = {2, 3};
        shape[dim] = 2 * n;
        const auto inputs = all_inputs(n, shape, dtype);
        const at::Tensor reduced = reference_reduce(inputs, op);
        run_threads(n, [&](int64_t r) {
          expect_same(reduce_scatter_tensor(inputs[r], op, dim, RankContext::kWorld),
                      reduced.chunk(n, dim)[r], "reduce_scatter dim " + std::to_string(dim));
        });
      }
    }
  }
}

// all_reduce_into: the caller's buffer (reused across calls) gets all_reduce's result, the input
// itself too (in place); a buffer that partly overlaps the input or has another numel is refused.
TEST_P(ThreadsCollectivesTest, AllReduceIntoACallersBuffer) {
  const int64_t n = GetParam();
  run_threads(n, [&](int64_t r) {
    const at::Tensor out = at::empty({6}, at::kDouble);
    for (int round = 0; round < 3; ++round) {
      const at::Tensor in = at::arange(6, at::kDouble).view({2, 3}) * (r + 1) + round;
      all_reduce_into(in, out, ReduceOp::kMax, RankContext::kWorld);
      expect_same(out.view({2, 3}), all_reduce(in, ReduceOp::kMax, RankContext::kWorld),
                  "all_reduce_into");
    }
    // In place (NOTE [in-place all_reduce]); a partial overlap is refused.
    const at::Tensor x = at::arange(6, at::kDouble) * (r + 1);
    const at::Tensor want = all_reduce(x, ReduceOp::kSum, RankContext::kWorld);
    all_reduce_into(x, x, ReduceOp::kSum, RankContext::kWorld);
    expect_same(x, want, "in-place all_reduce_into");
    const at::Tensor in = at::ones({6}, at::kDouble);
    const at::Tensor wide = at::ones({12}, at::kDouble);
    EXPECT_THROW(all_reduce_into(wide.narrow(0, 0, 6), wide.narrow(0, 3, 6), ReduceOp::kSum,
                                 RankContext::kWorld),
                 dtensor::Error);
    EXPECT_THROW(
        all_reduce_into(in, at::empty({5}, at::kDouble), ReduceOp::kSum, RankContext::kWorld),
        dtensor::Error);
  });
}

TEST_P(ThreadsCollectivesTest, ReduceScatterNeedsDivisibleDim) {
  const int64_t n = GetParam();
  if (n == 1) return;
  run_threads(n, [&](int64_t) {
    EXPECT_THROW(reduce_scatter_tensor(at::ones({n + 1}), ReduceOp::kSum, 0, RankContext::kWorld),
                 dtensor::Error);
  });
}

TEST_P(ThreadsCollectivesTest, AllToAllSingleUnevenSplits) {
  const int64_t n = GetParam();
  const auto c = testing::uneven_all_to_all(n);
  run_threads(n, [&](int64_t r) {
    expect_same(
        all_to_all_single(c.inputs[r], c.output_splits(r), c.input_splits(r), RankContext::kWorld),
        c.expected(r), "all_to_all_single");
  });
}

TEST_P(ThreadsCollectivesTest, AllToAllSplitAndConcatDims) {
  const int64_t n = GetParam();
  for (auto [split, concat] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 0}, {1, 1}, {0, 0}}) {
    std::vector<int64_t> shape = {2, 3};
    shape[split] = 2 * n;
    const auto inputs = all_inputs(n, shape, at::kDouble);
    run_threads(n, [&](int64_t r) {
      std::vector<at::Tensor> received;
      for (int64_t s = 0; s < n; ++s) received.push_back(inputs[s].chunk(n, split)[r]);
      expect_same(all_to_all(inputs[r], split, concat, RankContext::kWorld),
                  at::cat(received, concat), "all_to_all");
    });
  }
}

TEST_P(ThreadsCollectivesTest, BroadcastFromEachSource) {
  const int64_t n = GetParam();
  for (auto dtype : kDtypes) {
    const auto inputs = all_inputs(n, {4, 2}, dtype);
    for (int64_t src = 0; src < n; ++src) {
      run_threads(n, [&](int64_t r) {
        expect_same(broadcast(inputs[r], src, RankContext::kWorld), inputs[src], "broadcast");
      });
    }
  }
}

TEST_P(ThreadsCollectivesTest, CoalescedFormsMixDtypes) {
  const int64_t n = GetParam();
  const std::vector<std::vector<int64_t>> shapes = {{3}, {2, 2}, {4}};
  const std::vector<c10::ScalarType> dtypes = {at::kFloat, at::kLong, at::kFloat};
  std::vector<std::vector<at::Tensor>> inputs(n);  // [rank][tensor]
  for (int64_t r = 0; r < n; ++r) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      std::vector<int64_t> s = shapes[i];
      s[0] *= n;
      inputs[r].push_back(input_for(r, s, dtypes[i], static_cast<int64_t>(i)));
    }
  }
  run_threads(n, [&](int64_t r) {
    const auto reduced = all_reduce_coalesced(inputs[r], ReduceOp::kMax, RankContext::kWorld);
    const auto gathered = all_gather_into_tensor_coalesced(inputs[r], 0, RankContext::kWorld);
    const auto scattered =
        reduce_scatter_tensor_coalesced(inputs[r], ReduceOp::kSum, 0, RankContext::kWorld);
    for (size_t i = 0; i < shapes.size(); ++i) {
      std::vector<at::Tensor> parts;
      for (int64_t s = 0; s < n; ++s) parts.push_back(inputs[s][i]);
      expect_same(reduced[i], reference_reduce(parts, ReduceOp::kMax), "all_reduce_coalesced");
      expect_same(gathered[i], at::cat(parts), "all_gather_coalesced");
      expect_same(scattered[i], reference_reduce(parts, ReduceOp::kSum).chunk(n)[r],
                  "reduce_scatter_coalesced");
    }
  });
}

TEST_P(ThreadsCollectivesTest, AsyncCallsCompleteInIssueOrderAfterWait) {
  const int64_t n = GetParam();
  const auto inputs = all_inputs(n, {4, 4}, at::kFloat);
  const at::Tensor sum = reference_reduce(inputs, ReduceOp::kSum);
  run_threads(n, [&](int64_t r) {
    const at::Tensor a = all_reduce(inputs[r], ReduceOp::kSum, RankContext::kWorld, true);
    const at::Tensor b = all_gather_into_tensor(inputs[r], 1, RankContext::kWorld, true);
    const at::Tensor c = broadcast(inputs[r], 0, RankContext::kWorld, true);
    const at::Tensor d = all_reduce(inputs[r], ReduceOp::kMax, RankContext::kWorld);  // sync
    expect_same(wait_tensor(a), sum, "async all_reduce");
    expect_same(wait_tensor(b), at::cat(inputs, 1), "async all_gather");
    expect_same(wait_tensor(c), inputs[0], "async broadcast");
    expect_same(d, reference_reduce(inputs, ReduceOp::kMax), "sync after async");
    EXPECT_EQ(work_of(a), nullptr);  // waited work is forgotten
  });
}

TEST_P(ThreadsCollectivesTest, MeshGroupsAndSubgroups) {
  const int64_t n = GetParam();
  if (n != 4) return;
  const DeviceMesh mesh = DeviceMesh::arange({2, 2}, {"dp", "tp"});
  run_threads(4, [&](int64_t r) {
    const auto names = current_context().register_mesh(mesh);
    const at::Tensor x = at::full({2}, static_cast<double>(r), at::kDouble);
    const at::Tensor tp = all_reduce(x, ReduceOp::kSum, names[1]);
    const at::Tensor dp = all_reduce(x, ReduceOp::kSum, names[0]);
    double tp_sum = 0, dp_sum = 0;
    for (int64_t q : mesh.group_ranks(1, r)) tp_sum += q;
    for (int64_t q : mesh.group_ranks(0, r)) dp_sum += q;
    EXPECT_EQ(tp[0].item<double>(), tp_sum);
    EXPECT_EQ(dp[0].item<double>(), dp_sum);
    // Two tagged groups over the same ranks are distinct groups.
    const std::string a = current_context().new_group({0, 1, 2, 3}, "a");
    const std::string b = current_context().new_group({0, 1, 2, 3}, "b");
    EXPECT_NE(a, b);
    barrier(a);
    barrier(b);
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ThreadsCollectivesTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });

TEST(ThreadsFailureTest, MismatchedShapesAreReportedOnEveryRank) {
  std::atomic<int> errors{0};
  run_threads(2, [&](int64_t r) {
    try {
      all_reduce(at::ones({r == 0 ? 3 : 4}), ReduceOp::kSum, RankContext::kWorld);
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find("ranks disagree: number of elements differs"),
                std::string::npos)
          << e.what();
      ++errors;
    }
  });
  EXPECT_EQ(errors.load(), 2);
}

TEST(ThreadsFailureTest, MismatchedDtypesAreReported) {
  EXPECT_THROW(run_threads(2,
                           [](int64_t r) {
                             all_gather_into_tensor(at::ones({2}, r ? at::kInt : at::kFloat), 0,
                                                    RankContext::kWorld);
                           }),
               CollectiveError);
}

TEST(ThreadsFailureTest, AbsentPeerTimesOutNamingCollectiveGroupAndRanks) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run_threads(
        3,
        [](int64_t r) {
          if (r == 2) return;  // rank 2 "dies" before the collective
          all_reduce(at::ones({2}), ReduceOp::kSum, RankContext::kWorld);
        },
        "threads", std::chrono::milliseconds(300));
    ADD_FAILURE() << "no timeout";
  } catch (const CollectiveError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("all_reduce #1 on group 'world'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ranks [2] did not arrive"), std::string::npos) << msg;
    EXPECT_NE(msg.find("timeout of 300 ms"), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

// A rank that leaves before it ever joined a group (its thread raised first) fails its peers'
// waits on that group at once, those already waiting and those that come later, naming it
// (NOTE [leaving a group]: the backend's JobLeaveHook).
TEST(ThreadsFailureTest, LeavingFailsGroupsTheRankNeverJoined) {
  for (const bool peers_first : {true, false}) {
    const auto t0 = std::chrono::steady_clock::now();
    std::atomic<int> failed{0};
    try {
      run_threads(3, [&](int64_t r) {
        if (r == 2) {
          if (peers_first) std::this_thread::sleep_for(std::chrono::milliseconds(200));
          throw Error("rank 2 gives up");
        }
        if (!peers_first) std::this_thread::sleep_for(std::chrono::milliseconds(200));
        const std::string g = current_context().new_group({0, 1, 2}, "late");
        try {
          all_reduce(at::ones({2}), ReduceOp::kSum, g);
        } catch (const CollectiveError& e) {
          const std::string msg = e.what();
          EXPECT_NE(msg.find("global rank 2 left with an error: rank 2 gives up"),
                    std::string::npos)
              << msg;
          ++failed;
        }
      });
      ADD_FAILURE() << "rank 2's error was not raised";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2 gives up"), std::string::npos) << e.what();
    }
    EXPECT_EQ(failed.load(), 2) << "peers_first " << peers_first;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  }
}

// NOTE [async work registry]: an async collective fails, its output is freed without a wait, and
// a new tensor whose storage lands at the freed StorageImpl's address must not inherit the old
// Work and its error. Keyed by the raw address alone (as before the fix), it did.
TEST(ThreadsFailureTest, FreedFailedAsyncOutputDoesNotPassItsErrorToANewTensor) {
  bool reused = false;
  run_threads(2, [&](int64_t r) {
    const std::string solo = current_context().register_group("solo" + std::to_string(r), {r});
    barrier(solo);  // creates the endpoint now, so that its allocations come before the search
    const c10::StorageImpl* old_storage = nullptr;
    {
      const at::Tensor x =
          all_reduce(at::ones({r == 0 ? 3 : 4}), ReduceOp::kSum, RankContext::kWorld, true);
      const WorkPtr work = work_of(x);
      ASSERT_NE(work, nullptr);
      EXPECT_THROW(work->wait(), CollectiveError);  // ranks disagree; wait_tensor never called
      // An idle worker has dropped the job, so x holds the last reference to its storage.
      while (!current_context().endpoint(RankContext::kWorld).worker->idle()) {
        std::this_thread::yield();
      }
      old_storage = x.storage().unsafeGetStorageImpl();
    }
    if (r != 0) return;
    std::vector<at::Tensor> held;  // kept alive, so each allocation takes a fresh address
    const auto find_reuse = [&] {
      for (int i = 0; i < 1000; ++i) {
        held.push_back(at::empty({3}));
        if (held.back().storage().unsafeGetStorageImpl() == old_storage) return held.back();
      }
      return at::Tensor();
    };
    at::Tensor t = find_reuse();
    if (!t.defined()) {
      // The registry's weak reference keeps the old StorageImpl's memory until the next async
      // submit prunes the expired entry.
      wait_tensor(all_reduce(at::ones({1}), ReduceOp::kSum, solo, true));
      t = find_reuse();
    }
    if (!t.defined()) return;
    reused = true;
    EXPECT_EQ(work_of(t), nullptr);
    EXPECT_NO_THROW(wait_tensor(t));
  });
  if (!reused) GTEST_SKIP() << "the allocator never reused the freed StorageImpl's address";
}

TEST(ThreadsFailureTest, UnknownGroupAndNonMember) {
  run_threads(2, [](int64_t r) {
    EXPECT_THROW(all_reduce(at::ones({1}), ReduceOp::kSum, "nope"), dtensor::Error);
    current_context().register_group("only0", {0});
    if (r == 1) {
      try {
        all_reduce(at::ones({1}), ReduceOp::kSum, "only0");
        ADD_FAILURE();
      } catch (const dtensor::Error& e) {
        EXPECT_NE(std::string(e.what()).find("not a member of group 'only0'"), std::string::npos);
      }
    }
    EXPECT_THROW(current_context().register_group("only0", {1}), dtensor::Error);
    EXPECT_THROW(current_context().register_group("bad", {5}), dtensor::Error);
  });
}

TEST(ThreadsFailureTest, NoContextIsAClearError) {
  try {
    all_reduce(at::ones({1}), ReduceOp::kSum, "world");
    ADD_FAILURE();
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no collectives context"), std::string::npos);
  }
}

// The agreement check both CPU backends (threads, shm) report through.
TEST(CallMismatchTest, NamesTheFirstDisagreement) {
  const std::vector<int64_t> a = {1, 2}, b = {2, 1}, c = {2, 3};
  CallSignature r0, r1;
  r0.kind = r1.kind = CollectiveKind::kAllGather;
  r0.dtype = r1.dtype = at::kFloat;
  r0.numel = 1;
  r1.numel = 3;
  r0.output_splits = a;
  r1.output_splits = b;
  EXPECT_EQ(mismatch({r0, r1}),
            "split sizes differs: rank 0 has [1,2], group rank 1 has [2,1] (group rank 0: "
            "all_gather #0 of 1 Float from thread ''; group rank 1: all_gather #0 of 3 Float from "
            "thread '')");
  r1.output_splits = a;
  EXPECT_EQ(mismatch({r0, r1}), "group rank 1 sends 3 elements but the split sizes say 2");
  r1.numel = 2;
  EXPECT_EQ(mismatch({r0, r1}), "");
  r1.dtype = at::kInt;
  EXPECT_EQ(mismatch({r0, r1}),
            "dtype differs: rank 0 has Float, group rank 1 has Int (group rank 0: all_gather #0 of "
            "1 Float from thread ''; group rank 1: all_gather #0 of 2 Int from thread '')");
  r0.kind = r1.kind = CollectiveKind::kAllToAll;
  r1.dtype = at::kFloat;
  r0.input_splits = r0.output_splits = a;
  r1.input_splits = c;
  r1.output_splits = a;
  EXPECT_EQ(mismatch({r0, r1}), "group rank 0 sends 2 elements to group rank 1, which expects 1");
  r0.kind = CollectiveKind::kBarrier;
  EXPECT_EQ(mismatch({r0, r1}),
            "collective differs: rank 0 has barrier, group rank 1 has all_to_all (group rank 0: "
            "barrier #0 from thread ''; group rank 1: all_to_all #0 of 2 Float from thread '')");
  // NOTE [issuing thread]: the sequence number and the issuing thread come first.
  r1.kind = CollectiveKind::kBarrier;
  r0.thread = "Thread-1";
  r1.thread = "Thread-2";
  EXPECT_EQ(mismatch({r0, r1}).rfind(
                "issuing thread differs: rank 0 called from thread 'Thread-1' (its call #0 on this "
                "group), group rank 1 from 'Thread-2' (its call #0) (threads",
                0),
            0u);
  r1.thread = "Thread-1";
  r1.thread_seq = 2;
  EXPECT_EQ(mismatch({r0, r1}).rfind(
                "issuing thread differs: rank 0 called from thread 'Thread-1' (its call #0 on this "
                "group), group rank 1 from 'Thread-1' (its call #2) (threads",
                0),
            0u);
  r1.seq = 4;
  EXPECT_EQ(mismatch({r0, r1}).substr(0, 81),
            "sequence differs: rank 0 is at collective #0 of this group, group rank 1 at #4 (a");
}

TEST(BackendRegistryTest, UnknownBackendListsRegisteredOnes) {
  try {
    run_threads(
        1, [](int64_t) { barrier(RankContext::kWorld); }, "no-such-backend");
    ADD_FAILURE();
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown collectives backend 'no-such-backend'"),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find("threads"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dtensor::collectives
