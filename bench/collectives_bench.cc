// ./x bench collectives: time, algbw and busbw (nccl-tests' definitions) of all_reduce,
// all_gather, reduce_scatter and all_to_all on the threads, shm and c10d (Gloo) backends and on
// shm with symmetric memory ("shm-symmetric": inputs and outputs from symmetric_empty, NOTE
// [symmetric collectives]; it adds all_gather_in_place, whose input is its chunk of the output),
// for 2 and 4 ranks and 4 KiB .. 256 MiB (powers of 4, and 32 MiB), next to the single-thread
// memcpy bandwidth and the cost of first-touch page faults measured in the same run. Prints a
// table and one JSON object per measurement.
//
//   collectives_bench [--backends threads,shm,shm-symmetric,c10d] [--ranks 2,4]
//                     [--max-bytes 268435456] [--overlap=false]
//
// "bytes" is nccl-tests' size: the full buffer (all_reduce: the tensor; all_gather: the gathered
// output; reduce_scatter: the input; all_to_all: what one rank sends). algbw = bytes / time;
// busbw = algbw * 2(n-1)/n for all_reduce and (n-1)/n for the others.
// With 2 ranks it also reports how much CPU a rank burns while waiting for a late peer, and on shm
// what the collectives cost a matmul loop they overlap with (NOTE [overlap benchmark]).
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
#include "absl/strings/match.h"
#include "bench/bench_support.h"
#include "collectives/functional.h"
#include "collectives/launch_env.h"
#include "collectives/shm_segment.h"
#include "collectives/symmetric_memory.h"
#include "collectives/testing/fork_ranks.h"
#include "tools/cli_args.h"

ABSL_FLAG(std::vector<std::string>, backends,
          (std::vector<std::string>{"threads", "shm", "shm-symmetric", "c10d"}),
          "backends to sweep: threads, shm, shm-symmetric (shm on symmetric memory), c10d");
ABSL_FLAG(dtensor::cli::IntList, ranks, (dtensor::cli::IntList{{2, 4}}),
          "rank counts to sweep, e.g. 2,4");
ABSL_FLAG(int64_t, max_bytes, 256ll << 20, "largest buffer in bytes (also --max-bytes)");
ABSL_FLAG(std::vector<std::string>, ops, {},
          "collectives to sweep (all_reduce, all_gather, all_gather_in_place, reduce_scatter, "
          "all_to_all); default: all");
ABSL_FLAG(bool, overlap, true,
          "with shm and 2 ranks: a matmul loop overlapped with async collectives, copy-based "
          "and on symmetric memory");

using namespace dtensor;
using namespace dtensor::collectives;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {  // from the flags (their defaults: the ABSL_FLAGs above)
  std::vector<std::string> backends;
  std::vector<int> ranks;
  int64_t max_bytes = 0;
  bool overlap = true;
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

// all_gather_in_place: the input is this rank's chunk of the output (symmetric memory only).
// all_reduce_in_place: torch.distributed's all_reduce(t) (symmetric memory only).
const char* kOps[] = {"all_reduce",          "all_reduce_in_place", "all_gather",
                      "all_gather_in_place", "reduce_scatter",      "all_to_all"};

// The tensors of one measurement: plain ones, or for "shm-symmetric" symmetric memory
// (NOTE [symmetric memory]) rendezvoused on the world group, outputs included.
struct Buffers {
  at::Tensor full, part, out;  // out: the gathered / reduced output (symmetric only)
};

at::Tensor symmetric_buffer(int64_t numel) {
  at::Tensor t = symmetric_empty({numel}, at::kFloat);
  t.fill_(1);
  rendezvous(t, RankContext::kWorld);
  return t;
}

Buffers buffers_for(bool symmetric, int64_t numel, int64_t n) {
  if (!symmetric) return {at::ones({numel}, at::kFloat), at::ones({numel / n}, at::kFloat), {}};
  return {symmetric_buffer(numel), symmetric_buffer(numel / n), symmetric_buffer(numel)};
}

// One collective of `bytes` (nccl-tests' size) on the world group. On symmetric memory the
// outputs are symmetric too where the call takes one (all_reduce two-shot, all_gather push).
void run_op(const std::string& op, const Buffers& b, int64_t rank) {
  const std::string& w = RankContext::kWorld;
  const bool sym = b.out.defined();
  if (op == "all_reduce") {
    if (sym) {
      all_reduce_into(b.full, b.out, ReduceOp::kSum, w);
    } else {
      all_reduce(b.full, ReduceOp::kSum, w);
    }
  }
  if (op == "all_gather") {
    if (sym) {
      all_gather_into(b.part, b.out, w);
    } else {
      all_gather_into_tensor(b.part, 0, w);
    }
  }
  if (op == "all_reduce_in_place") all_reduce_into(b.full, b.full, ReduceOp::kSum, w);
  if (op == "all_gather_in_place") {
    const int64_t k = b.part.numel();
    all_gather_into(b.out.narrow(0, rank * k, k), b.out, w);
  }
  if (op == "reduce_scatter") reduce_scatter_tensor(b.full, ReduceOp::kSum, 0, w);
  if (op == "all_to_all") all_to_all_single(b.full, {}, {}, w);
}

// Page faults this process (rank 0 of a forked run; the whole process for threads) has taken.
long minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Runs the sweep on this rank; rank 0 prints (flt/call: rank 0's page faults per call).
void sweep(const std::string& backend, int64_t rank, int64_t n, int64_t max_bytes, double mc) {
  const bool sym = backend == "shm-symmetric";
  for (const char* op : kOps) {
    if (!sym && absl::EndsWith(op, "_in_place")) continue;
    const auto only = absl::GetFlag(FLAGS_ops);
    if (!only.empty() && std::find(only.begin(), only.end(), op) == only.end()) continue;
    for (int64_t bytes : sizes_up_to(max_bytes)) {
      const int64_t numel = bytes / 4 / n * n;  // float32, divisible by n
      const Buffers b = buffers_for(sym, numel, n);
      // The median of `reps` loops' per-call averages: one scheduler hiccup of this VM (a
      // millisecond) would otherwise move a 4 KiB average by several microseconds.
      // Gloo takes milliseconds even for 4 KiB: fewer calls keep its sweep to minutes.
      const int64_t most = backend == "c10d" ? 50 : 1000;
      const int iters = static_cast<int>(std::clamp<int64_t>((256ll << 20) / bytes, 3, most));
      const int reps = bytes < (16ll << 20) ? 5 : 3;
      run_op(op, b, rank);  // warm up (and create the communicator)
      const int64_t sym_calls = symmetric_collectives_run();
      const long faults0 = minor_faults();
      std::vector<double> per_call;
      for (int rep = 0; rep < reps; ++rep) {
        barrier(RankContext::kWorld);
        const auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) run_op(op, b, rank);
        barrier(RankContext::kWorld);
        per_call.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                           iters);
      }
      // Calls under DTENSOR_SHM_SYMMETRIC_MIN_BYTES go through the buffers by design.
      const bool direct = static_cast<size_t>(numel * 4) >= shm::symmetric_min_bytes();
      if (sym && direct && numel > 0 && symmetric_collectives_run() - sym_calls != iters * reps) {
        throw std::runtime_error(std::string(op) + " did not run on symmetric memory");
      }
      const double faults = static_cast<double>(minor_faults() - faults0) / (iters * reps);
      std::sort(per_call.begin(), per_call.end());
      const double us = per_call[per_call.size() / 2];
      if (rank != 0) continue;
      const double algbw = static_cast<double>(numel * 4) / (us * 1e-6) / 1e9;
      const double factor =
          absl::StartsWith(op, "all_reduce") ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
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

// NOTE [overlap benchmark]
// What a collective costs the compute it overlaps with: every rank runs a matmul loop (kMatmuls
// products of kDim x kDim floats per step, one BLAS thread) while the step's collectives (an
// all_gather and a reduce_scatter of kOverlapBytes) run asynchronously on the group's worker
// thread beside it; the same loop with no collectives is the baseline. Reported per path (shm:
// plain tensors, staged through the segment; shm-symmetric: symmetric inputs, no staging): the
// loop's slowdown, the collectives' time alone, and the step's time. The loop is sized to take
// about as long as the copy-based collectives, the case where overlapping matters. On a machine
// with no spare core (2 vCPUs, 2 ranks: each rank's copying thread shares a core with another
// rank's matmul) every copied byte slows the matmul, so the slowdown measures the copies' CPU cost.
// The step's time is reported too: a collective starved of CPU would flatter the matmul's figure.
// The floor: the collectives' own CPU time (this process's, run alone) over the matmul loop's time,
// what the matmul must lose when they share its core.
constexpr int64_t kOverlapBytes = 8ll << 20;

double process_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
constexpr int64_t kDim = 384;
constexpr int kMatmuls = 6, kSteps = 30;

void overlap(const std::string& backend, int64_t rank, int64_t n) {
  const std::string& w = RankContext::kWorld;
  const int64_t numel = kOverlapBytes / 4 / n * n;
  const Buffers b = buffers_for(backend == "shm-symmetric", numel, n);
  const at::Tensor x = at::randn({kDim, kDim}), y = at::randn({kDim, kDim});
  at::Tensor z = at::empty({kDim, kDim});
  const auto matmuls = [&] {
    for (int k = 0; k < kMatmuls; ++k) at::mm_out(z, x, y);
  };
  const auto collectives = [&](bool async) {
    return std::vector<at::Tensor>{all_gather_into_tensor(b.part, 0, w, async),
                                   reduce_scatter_tensor(b.full, ReduceOp::kSum, 0, w, async)};
  };
  const auto seconds = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  matmuls();
  collectives(false);
  std::vector<double> alone_s, comm_s, comm_cpu_s, overlapped_s, step_s;
  for (int rep = 0; rep < 7; ++rep) {  // interleaved; medians of 7 each
    barrier(w);
    auto t0 = Clock::now();
    for (int i = 0; i < kSteps; ++i) matmuls();
    alone_s.push_back(seconds(t0));
    barrier(w);
    t0 = Clock::now();
    const double cpu0 = process_cpu_s();
    for (int i = 0; i < kSteps; ++i) collectives(false);
    comm_cpu_s.push_back(process_cpu_s() - cpu0);
    comm_s.push_back(seconds(t0));
    barrier(w);
    double mm = 0;
    t0 = Clock::now();
    for (int i = 0; i < kSteps; ++i) {
      const auto outs = collectives(true);
      const auto m0 = Clock::now();
      matmuls();
      mm += seconds(m0);
      for (const auto& o : outs) wait_tensor(o);
    }
    step_s.push_back(seconds(t0));
    overlapped_s.push_back(mm);
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double alone = median(alone_s), comm = median(comm_s), overlapped = median(overlapped_s),
               step = median(step_s), comm_cpu = median(comm_cpu_s);
  if (rank != 0) return;
  const double us = 1e6 / kSteps;
  std::printf(
      "%-13s overlap: matmul loop %.0f us alone, %.0f us beside the collectives "
      "(slowdown %.1f%%); collectives alone %.0f us, %.0f us of CPU (floor of the slowdown when "
      "they share the matmul's core: %.1f%%); overlapped step %.0f us\n",
      backend.c_str(), alone * us, overlapped * us, 100 * (overlapped / alone - 1), comm * us,
      comm_cpu * us, 100 * comm_cpu / alone, step * us);
  std::printf(
      "{\"bench\":\"collectives\",\"backend\":\"%s\",\"op\":\"overlap_matmul\",\"ranks\":%lld,"
      "\"bytes\":%lld,\"matmul_alone_us\":%.1f,\"matmul_overlapped_us\":%.1f,\"slowdown\":%.4f,"
      "\"collectives_us\":%.1f,\"collectives_cpu_us\":%.1f,\"slowdown_floor\":%.4f,"
      "\"step_us\":%.1f}\n",
      backend.c_str(), static_cast<long long>(n), static_cast<long long>(numel * 4), alone * us,
      overlapped * us, overlapped / alone - 1, comm * us, comm_cpu * us, comm_cpu / alone,
      step * us);
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
  o.overlap = absl::GetFlag(FLAGS_overlap);
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
            auto ctx = init_from_env(backend == "shm-symmetric" ? "shm" : backend);
            sweep(backend, r, n, o.max_bytes, mc);
            if (n == 2) wait_cost(backend, r, CLOCK_PROCESS_CPUTIME_ID);
            if (n == 2 && o.overlap && backend != "c10d") overlap(backend, r, n);
            return 0;
          },
          std::chrono::seconds(1800));
      for (int c : codes) failures += c != 0;
    }
  }
  return failures == 0 ? 0 : 1;
}
