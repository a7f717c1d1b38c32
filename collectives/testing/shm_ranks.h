#pragma once
// Test harness for the shm backend and symmetric memory: ranks as forked processes of a fresh
// job, checks that report from inside the children, and the job's leftovers in /dev/shm.
//
// Each test forks its ranks before any ATen work in the parent: the parent only forks, waits and
// looks at /dev/shm, so the children never inherit a thread pool.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/rank_context.h"
#include "collectives/shm_segment.h"
#include "collectives/testing/fork_ranks.h"

namespace dtensor::testing {

using collectives::CollectiveError;
using collectives::RankContext;
using collectives::RankScope;
using collectives::shm_job_tag;
using std::chrono::milliseconds;

// Children cannot report through gtest (their failures would die with them): they throw, the
// fork harness prints the message and the child exits non-zero.
inline void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

inline void expect_same(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (got.scalar_type() == want.scalar_type() && got.sizes() == want.sizes() &&
      at::equal(got, want)) {
    return;
  }
  std::ostringstream os;
  os << what << ": got " << got.scalar_type() << got.sizes() << "\n"
     << got << "\nwant " << want.scalar_type() << want.sizes() << "\n"
     << want;
  throw std::runtime_error(os.str());
}

inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const CollectiveError& e) {
    return e.what();
  }
  return "";
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- the fork harness ----

inline std::string new_job() {
  static std::atomic<int> counter{0};
  return "shm-test-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
}

// Whether a forked child sees a GPU through a CUDA build of libtorch: the parent itself never
// touches CUDA (a CUDA context does not survive fork).
inline bool usable_gpu_in_a_child() {
  const auto codes =
      run_forked(1, [](int) { return at::hasCUDA() && at::getNumGPUs() > 0 ? 0 : 1; });
  return codes[0] == 0;
}

inline std::vector<std::string> leftover_segments(const std::string& job) {
  std::vector<std::string> found;
  const std::string tag = shm_job_tag(job);
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("dtensor-", 0) == 0 && contains(name, tag)) found.push_back(name);
  }
  return found;
}

struct RunOptions {
  milliseconds timeout{30000};
  std::string buffer_bytes;  // DTENSOR_SHM_BUFFER_BYTES in the children; empty = default
  std::string cma;           // DTENSOR_SHM_CMA in the children; empty = unset (off)
  int64_t cma_rank = -1;     // >= 0: only this rank gets `cma`
  std::string symmetric_min_bytes = "0";  // DTENSOR_SHM_SYMMETRIC_MIN_BYTES in the children
  std::string stream_bytes;               // DTENSOR_SHM_STREAM_BYTES in the children; empty = unset
  std::string backend = "shm";            // the job's backend (cuda_ipc runs over shm too)
};

// Runs body(n, rank) on n forked ranks of a fresh job (on options.backend), then checks that every
// rank exited 0 and that no segment of the job is left in /dev/shm.
inline void run_ranks(int64_t n, const std::function<void(int64_t n, int64_t rank)>& body,
                      const RunOptions& options = {}, const std::string& job = new_job()) {
  const auto codes = testing::run_forked(static_cast<int>(n), [&](int rank) {
    at::set_num_threads(1);  // n processes share the machine's cores
    ::setenv("DTENSOR_SHM_SYMMETRIC_MIN_BYTES", options.symmetric_min_bytes.c_str(), 1);
    if (!options.stream_bytes.empty()) {
      ::setenv("DTENSOR_SHM_STREAM_BYTES", options.stream_bytes.c_str(), 1);
    }
    if (!options.buffer_bytes.empty()) {
      ::setenv("DTENSOR_SHM_BUFFER_BYTES", options.buffer_bytes.c_str(), 1);
    }
    if (!options.cma.empty() && (options.cma_rank < 0 || options.cma_rank == rank)) {
      ::setenv("DTENSOR_SHM_CMA", options.cma.c_str(), 1);
    }
    auto ctx = std::make_shared<RankContext>(rank, n, options.backend, job, options.timeout);
    RankScope scope(ctx);
    body(n, rank);
    return 0;
  });
  for (int64_t r = 0; r < n; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " of " << n;
  EXPECT_EQ(leftover_segments(job), std::vector<std::string>{}) << "job " << job;
}

}  // namespace dtensor::testing
