// ./x bench collectives: time, algbw and busbw (nccl-tests' definitions) of all_reduce,
// all_gather, reduce_scatter and all_to_all on the threads, shm and c10d (Gloo) backends, for 2
// and 4 ranks and 4 KiB .. 64 MiB (powers of 4, and 32 MiB), next to the single-thread memcpy
// bandwidth and the cost of first-touch page faults measured in the same run. Prints a table and
// one JSON object per measurement.
//
//   collectives_bench [--backends threads,shm,c10d] [--ranks 2,4] [--max-bytes 67108864]
//
// "bytes" is nccl-tests' size: the full buffer (all_reduce: the tensor; all_gather: the gathered
// output; reduce_scatter: the input; all_to_all: what one rank sends). algbw = bytes / time;
// busbw = algbw * 2(n-1)/n for all_reduce and (n-1)/n for the others.
// With 2 ranks it also reports how much CPU a rank burns while waiting for a late peer.
// DTENSOR_BENCH_NO_CACHING=1 measures with libtorch's default CPU allocator (fresh memory and its
// page faults on every call of 32 MiB or more, see main()).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <c10/core/Allocator.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/bench_support.h"
#include "collectives/functional.h"
#include "collectives/launch_env.h"
#include "collectives/testing/fork_ranks.h"
#include "tools/cli_args.h"

ABSL_FLAG(std::vector<std::string>, backends, (std::vector<std::string>{"threads", "shm", "c10d"}),
          "backends to sweep: threads, shm, c10d");
ABSL_FLAG(dtensor::cli::IntList, ranks, (dtensor::cli::IntList{{2, 4}}),
          "rank counts to sweep, e.g. 2,4");
ABSL_FLAG(int64_t, max_bytes, 64ll << 20, "largest buffer in bytes (also --max-bytes)");

using namespace dtensor;
using namespace dtensor::collectives;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {  // from the flags (their defaults: the ABSL_FLAGs above)
  std::vector<std::string> backends;
  std::vector<int> ranks;
  int64_t max_bytes = 0;
};

// Microseconds per 4 KiB page to first touch fresh memory (what a call pays when its output is
// new memory from the kernel): one 64 MiB anonymous mapping, written once.
double fault_us_per_page() {
  const size_t n = 64ull << 20;
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 0;
  const auto t0 = Clock::now();
  std::memset(p, 1, n);
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  ::munmap(p, n);
  return us / (n / 4096);
}

// 4 KiB, 16 KiB, ... (powers of 4) and 32 MiB, up to max_bytes.
std::vector<int64_t> sizes_up_to(int64_t max_bytes) {
  std::vector<int64_t> sizes;
  for (int64_t b = 4096; b <= max_bytes; b *= 4) sizes.push_back(b);
  if ((32ll << 20) <= max_bytes) sizes.push_back(32ll << 20);
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

const char* kOps[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};

// One collective of `bytes` (nccl-tests' size) on the world group.
void run_op(const std::string& op, const at::Tensor& full, const at::Tensor& part) {
  if (op == "all_reduce") all_reduce(full, ReduceOp::kSum, RankContext::kWorld);
  if (op == "all_gather") all_gather_into_tensor(part, 0, RankContext::kWorld);
  if (op == "reduce_scatter") reduce_scatter_tensor(full, ReduceOp::kSum, 0, RankContext::kWorld);
  if (op == "all_to_all") all_to_all_single(full, {}, {}, RankContext::kWorld);
}

// Page faults this process (rank 0 of a forked run; the whole process for threads) has taken.
long minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Runs the sweep on this rank; rank 0 prints (flt/call: rank 0's page faults per call).
void sweep(const std::string& backend, int64_t rank, int64_t n, int64_t max_bytes, double mc) {
  for (const char* op : kOps) {
    for (int64_t bytes : sizes_up_to(max_bytes)) {
      const int64_t numel = bytes / 4 / n * n;  // float32, divisible by n
      const at::Tensor full = at::ones({numel}, at::kFloat);
      const at::Tensor part = at::ones({numel / n}, at::kFloat);
      const int iters = static_cast<int>(std::clamp<int64_t>((256ll << 20) / bytes, 3, 200));
      run_op(op, full, part);  // warm up (and create the communicator)
      barrier(RankContext::kWorld);
      const auto t0 = Clock::now();
      const long faults0 = minor_faults();
      for (int i = 0; i < iters; ++i) run_op(op, full, part);
      const double faults = static_cast<double>(minor_faults() - faults0) / iters;
      barrier(RankContext::kWorld);
      const double us =
          std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
      if (rank != 0) continue;
      const double algbw = static_cast<double>(numel * 4) / (us * 1e-6) / 1e9;
      const double factor =
          std::string(op) == "all_reduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
      const double busbw = algbw * factor;
      std::printf("%-8s %-15s %5lld %12lld %12.1f %10.2f %10.2f %8.2f %9.1f\n", backend.c_str(), op,
                  static_cast<long long>(n), static_cast<long long>(numel * 4), us, algbw, busbw,
                  busbw / mc, faults);
      std::printf(
          "{\"bench\":\"collectives\",\"backend\":\"%s\",\"op\":\"%s\",\"ranks\":%lld,"
          "\"bytes\":%lld,\"us\":%.2f,\"algbw_gbs\":%.4f,\"busbw_gbs\":%.4f,\"memcpy_gbs\":%.3f,"
          "\"busbw_over_memcpy\":%.4f,\"faults_per_call\":%.1f}\n",
          backend.c_str(), op, static_cast<long long>(n), static_cast<long long>(numel * 4), us,
          algbw, busbw, mc, busbw / mc, faults);
      std::fflush(stdout);
    }
  }
}

// How busy a rank is while it waits: rank 1 arrives `delay` late to an all_reduce; rank 0 reports
// the CPU time it spent inside the call over the wall time (1.0 = one core busy throughout).
void wait_cost(const std::string& backend, int64_t rank, clockid_t clock) {
  const at::Tensor x = at::ones({1024}, at::kFloat);
  all_reduce(x, ReduceOp::kSum, RankContext::kWorld);  // create the communicator first
  barrier(RankContext::kWorld);
  const auto delay = std::chrono::milliseconds(1000);
  if (rank != 0) {
    std::this_thread::sleep_for(delay);
    all_reduce(x, ReduceOp::kSum, RankContext::kWorld);
    return;
  }
  timespec c0{}, c1{};
  ::clock_gettime(clock, &c0);
  const auto t0 = Clock::now();
  all_reduce(x, ReduceOp::kSum, RankContext::kWorld);
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  ::clock_gettime(clock, &c1);
  const double cpu = (c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) * 1e-9;
  std::printf("%-8s waiting %.2f s for a late peer used %.3f s of CPU (%.1f%% of a core)\n",
              backend.c_str(), wall, cpu, 100 * cpu / wall);
  std::printf(
      "{\"bench\":\"collectives\",\"backend\":\"%s\",\"op\":\"wait_cpu\",\"ranks\":2,"
      "\"wall_s\":%.3f,\"cpu_s\":%.4f,\"busy_cores\":%.4f}\n",
      backend.c_str(), wall, cpu, cpu / wall);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::cli::parse_command_line(
      argc, argv,
      "./x bench collectives: time, algbw and busbw of the collectives per backend, ranks and "
      "size.\n  collectives_bench [--backends threads,shm,c10d] [--ranks 2,4] "
      "[--max-bytes 67108864]");
  Options o;
  o.backends = absl::GetFlag(FLAGS_backends);
  for (int64_t r : absl::GetFlag(FLAGS_ranks).values) {
    if (r < 1) {
      std::fprintf(stderr, "collectives_bench: error: --ranks: %lld is not a rank count\n",
                   static_cast<long long>(r));
      return 2;
    }
    o.ranks.push_back(static_cast<int>(r));
  }
  o.max_bytes = absl::GetFlag(FLAGS_max_bytes);
  const bool cache = bench::install_caching_allocator();
  at::set_num_threads(1);
  const double mc = bench::memcpy_gbs();
  const double fault_us = fault_us_per_page();
  std::printf("caching CPU allocator (reuse freed blocks): %s\n", cache ? "on" : "off");
  std::printf("single-thread memcpy (64 MiB): %.2f GB/s\n", mc);
  std::printf("first touch of fresh memory: %.2f us per 4 KiB page (%.1f ms per 64 MiB)\n",
              fault_us, fault_us * 16384 / 1000);
  std::printf("{\"bench\":\"collectives\",\"op\":\"memcpy\",\"bytes\":%lld,\"memcpy_gbs\":%.3f}\n",
              64ll << 20, mc);
  std::printf("{\"bench\":\"collectives\",\"op\":\"page_fault\",\"us_per_page\":%.3f}\n", fault_us);
  std::printf("%-8s %-15s %5s %12s %12s %10s %10s %8s %9s\n", "backend", "op", "ranks", "bytes",
              "time_us", "algbw", "busbw", "bus/mcpy", "flt/call");
  std::fflush(stdout);
  int failures = 0;
  for (const auto& backend : o.backends) {
    for (int n : o.ranks) {
      if (backend == "threads") {
        run_threads(n, [&](int64_t r) {
          sweep(backend, r, n, o.max_bytes, mc);
          if (n == 2) wait_cost(backend, r, CLOCK_THREAD_CPUTIME_ID);
        });
        continue;
      }
      const int port = dtensor::testing::free_port();
      const auto codes = dtensor::testing::run_forked(
          n,
          [&](int r) {
            dtensor::testing::set_launch_env(r, n, port);
            at::set_num_threads(1);
            auto ctx = init_from_env(backend);
            sweep(backend, r, n, o.max_bytes, mc);
            if (n == 2) wait_cost(backend, r, CLOCK_PROCESS_CPUTIME_ID);
            return 0;
          },
          std::chrono::seconds(1800));
      for (int c : codes) failures += c != 0;
    }
  }
  return failures == 0 ? 0 : 1;
}
