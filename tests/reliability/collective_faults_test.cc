// Faults in the C++ collectives, without Python: calls that disagree, threads of one
// rank sharing a group, interrupts, leftover shared memory, malformed settings. Each case asserts
// the result one device gives or an error naming the collective, the group and the rank.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <thread>

#include "collectives/functional.h"
#include "collectives/launch_env.h"
#include "collectives/rank_context.h"
#include "collectives/shm_segment.h"
#include "collectives/testing/fork_ranks.h"

namespace dtensor::collectives {
namespace {

using std::chrono::milliseconds;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

class OnBackend : public ::testing::TestWithParam<const char*> {};

// Process ranks for "shm" and "c10d", thread ranks for "threads": fn(rank) returns 0 on success.
std::vector<int> on_ranks(const std::string& backend, int n, const std::function<int(int)>& fn,
                          milliseconds timeout = milliseconds(10000)) {
  if (backend == "threads") {
    std::vector<int> codes(n, 1);
    run_threads(
        n, [&](int64_t r) { codes[r] = fn(static_cast<int>(r)); }, "threads", timeout);
    return codes;
  }
  const int port = testing::free_port();
  return testing::run_forked(n, [&](int r) {
    testing::set_launch_env(r, n, port);
    init_from_env(backend, timeout);
    return fn(r);
  });
}

TEST_P(OnBackend, MismatchedCallsFailOnEveryRankDescribingBoth) {
  const std::string backend = GetParam();
  const auto codes = on_ranks(backend, 2, [&](int r) {
    all_reduce(at::ones({4}), ReduceOp::kSum, RankContext::kWorld);
    const std::string e = error_of([&] {
      if (r == 0) {
        all_reduce(at::ones({4}), ReduceOp::kSum, RankContext::kWorld);
      } else {
        broadcast(at::ones({4}), 0, RankContext::kWorld);
      }
    });
    const bool ok = contains(e, "ranks disagree: collective differs") &&
                    contains(e, "all_reduce #2 of 4 Float (sum)") && contains(e, "broadcast #2");
    if (!ok) std::fprintf(stderr, "[rank %d] %s\n", r, e.c_str());
    // The group goes on after a disagreement.
    const at::Tensor sum = all_reduce(at::ones({3}), ReduceOp::kSum, RankContext::kWorld);
    return ok && at::equal(sum, at::full({3}, 2.0)) ? 0 : 1;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

TEST_P(OnBackend, MismatchedSizesAndOpsAreNamed) {
  const std::string backend = GetParam();
  const auto codes = on_ranks(backend, 3, [&](int r) {
    const std::string sizes =
        error_of([&] { all_reduce(at::ones({r == 2 ? 5 : 4}), ReduceOp::kSum, "world"); });
    const std::string ops = error_of(
        [&] { all_reduce(at::ones({4}), r == 1 ? ReduceOp::kMax : ReduceOp::kSum, "world"); });
    const std::string dtypes = error_of([&] {
      all_reduce(at::ones({4}, r == 0 ? at::kFloat : at::kDouble), ReduceOp::kSum, "world");
    });
    const bool ok = contains(sizes, "number of elements differs") &&
                    contains(ops, "reduce op differs") && contains(dtypes, "dtype differs");
    if (!ok)
      std::fprintf(stderr, "[rank %d] %s | %s | %s\n", r, sizes.c_str(), ops.c_str(),
                   dtypes.c_str());
    return ok ? 0 : 1;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

// NOTE [issuing thread]: two labelled threads per rank, each with its own values; a result is
// right or the call is refused naming the threads, never another thread's data.
TEST_P(OnBackend, TwoLabelledThreadsOfARankAreCorrectOrRefused) {
  const std::string backend = GetParam();
  const auto codes = on_ranks(backend, 2, [&](int r) {
    std::shared_ptr<RankContext> ctx;
    if (backend == "threads") ctx = std::shared_ptr<RankContext>(&current_context(), [](auto*) {});
    std::atomic<int> wrong{0}, other{0};
    auto body = [&](int tid) {
      std::unique_ptr<RankScope> scope;
      if (ctx) scope = std::make_unique<RankScope>(ctx);
      set_thread_label("worker-" + std::to_string(tid));
      for (int i = 0; i < 30; ++i) {
        const double mine = tid * 1000 + i;
        try {
          const at::Tensor got =
              all_reduce(at::full({8}, mine + r), ReduceOp::kSum, RankContext::kWorld);
          if (!at::equal(got, at::full({8}, 2 * mine + 1))) ++wrong;
        } catch (const CollectiveError& e) {
          if (!contains(e.what(), "issuing thread differs")) {
            std::fprintf(stderr, "[rank %d] %s\n", r, e.what());
            ++other;
          }
        }
      }
    };
    std::thread a(body, 0), b(body, 1);
    a.join();
    b.join();
    return wrong == 0 && other == 0 ? 0 : 1;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, OnBackend, ::testing::Values("threads", "shm", "c10d"),
                         [](const auto& info) { return std::string(info.param); });

// NOTE [interrupts]: a hook that throws ends a blocked wait at once and releases the peers.
TEST(InterruptTest, AnInterruptedRankLeavesAndItsPeersFailAtOnce) {
  const int port = testing::free_port();
  const auto codes = testing::run_forked(2, [&](int r) {
    testing::set_launch_env(r, 2, port);
    init_from_env("shm", milliseconds(30000));
    barrier(RankContext::kWorld);
    const auto t0 = std::chrono::steady_clock::now();
    if (r == 0) {
      set_interrupt_hook([t0] {
        if (std::chrono::steady_clock::now() - t0 > milliseconds(300)) {
          throw std::runtime_error("interrupt!");
        }
      });
      // Rank 1 joins this call only after 5 s: rank 0 is interrupted first.
      const std::string e =
          error_of([] { all_gather_into_tensor(at::ones({2}), 0, RankContext::kWorld); });
      const auto took = std::chrono::steady_clock::now() - t0;
      const bool ok = e == "interrupt!" && took < milliseconds(1000) && interrupted();
      if (!ok) std::fprintf(stderr, "[rank 0] '%s'\n", e.c_str());
      return ok ? 0 : 1;
    }
    std::this_thread::sleep_for(milliseconds(2000));
    const std::string e =
        error_of([] { all_gather_into_tensor(at::ones({2}), 0, RankContext::kWorld); });
    const auto took = std::chrono::steady_clock::now() - t0;
    const bool ok = contains(e, "global rank 0 was interrupted (SIGINT)") &&
                    contains(e, "all_gather") && took < milliseconds(3000);
    if (!ok) std::fprintf(stderr, "[rank 1] '%s'\n", e.c_str());
    return ok ? 0 : 1;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

// NOTE [stale segments]
TEST(StaleSegmentTest, DeadCreatorsSegmentsGoLiveOnesStay) {
  const auto make = [](const std::string& name, int64_t creator) {
    std::ofstream f("/dev/shm/" + name, std::ios::binary);
    const uint64_t words[5] = {shm::kMagic, 4096, 64, 2, static_cast<uint64_t>(creator)};
    f.write(reinterpret_cast<const char*>(words), sizeof(words));
    f.write(std::string(4096 - sizeof(words), '\0').data(), 4096 - sizeof(words));
  };
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  const std::string tag = "dtensor-c0ffee" + std::to_string(::getpid());
  make(tag + "-dead", child);
  make(tag + "-live", ::getpid());
  EXPECT_GE(shm::reclaim_stale_segments(), 1);
  EXPECT_NE(::access(("/dev/shm/" + tag + "-dead").c_str(), F_OK), 0);
  EXPECT_EQ(::access(("/dev/shm/" + tag + "-live").c_str(), F_OK), 0);
  ::unlink(("/dev/shm/" + tag + "-live").c_str());
}

TEST(SettingsTest, TimeoutsAreCappedOrRefused) {
  ::setenv("DTENSOR_COLLECTIVE_TIMEOUT_MS", "9223372036854775807", 1);
  EXPECT_EQ(default_timeout(), kMaxTimeout);
  for (const char* bad : {"0", "-1", "12ms", "99999999999999999999"}) {
    ::setenv("DTENSOR_COLLECTIVE_TIMEOUT_MS", bad, 1);
    EXPECT_TRUE(contains(error_of([] { default_timeout(); }),
                         std::string("DTENSOR_COLLECTIVE_TIMEOUT_MS='") + bad + "'"))
        << bad;
  }
  ::unsetenv("DTENSOR_COLLECTIVE_TIMEOUT_MS");
  // A huge timeout still lets a collective run (the deadline used to overflow to the past).
  run_threads(
      2,
      [](int64_t) {
        EXPECT_TRUE(
            at::equal(all_reduce(at::ones({2}), ReduceOp::kSum, "world"), at::full({2}, 2.0)));
      },
      "threads", milliseconds(std::numeric_limits<int64_t>::max()));
}

TEST(SettingsTest, GroupsWithRepeatedOrForeignRanksAreRefused) {
  RankContext ctx(0, 3, "threads", "settings-test");
  EXPECT_TRUE(contains(error_of([&] { ctx.new_group({0, 0, 1}); }), "lists rank 0 twice"));
  EXPECT_TRUE(contains(error_of([&] { ctx.new_group({0, 3}); }), "outside the world of size 3"));
}

}  // namespace
}  // namespace dtensor::collectives
