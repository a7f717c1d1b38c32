// ./x bench redistribute: the plan-cache hit (and miss) cost, and redistribute time against the
// bare collective it runs, on shm with 2 ranks (processes), 1 MiB .. 64 MiB of global tensor.
// Prints a table and one JSON object per measurement:
//   {"bench":"redistribute","case":"plan_cache_hit","ns":...}
//   {"bench":"redistribute","case":"S(0)->R","bytes":...,"redistribute_us":...,
//    "collective_us":...,"ratio":...}
// The two timings of a row alternate call by call, on the same tensors, and each is the median.
//
//   redistribute_bench [--backend shm] [--ranks 2] [--max-bytes 67108864]

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/bench_support.h"
#include "collectives/functional.h"
#include "collectives/launch_env.h"
#include "collectives/testing/fork_ranks.h"
#include "dtensor/dtensor.h"
#include "dtensor/redistribute.h"
#include "layout/shard_layout.h"
#include "tools/cli_args.h"

ABSL_FLAG(std::string, backend, "shm", "collectives backend: shm or c10d");
ABSL_FLAG(int, ranks, 2, "ranks (processes)");
ABSL_FLAG(int64_t, max_bytes, 64ll << 20, "largest global tensor in bytes (also --max-bytes)");

using namespace dtensor;
using bench::Clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void plan_cache_cost() {
  const DeviceMesh mesh = DeviceMesh::arange({2, 2});
  const auto meta = TensorMeta::make({1024, 1024});
  const auto a = DTensorSpec::make(mesh, {Shard(0), Shard(1)}, meta);
  const auto b = DTensorSpec::make(mesh, {Shard(1), Shard(0)}, meta);
  plan_redistribute(a, b);
  const int iters = 1000000;
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    auto p = plan_redistribute(a, b);
    asm volatile("" : : "r"(p.get()) : "memory");
  }
  const double hit_ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / iters;
  const int misses = 200;
  const auto t1 = Clock::now();
  for (int i = 0; i < misses; ++i) compute_plan(a, b, {}, default_cost_model());
  const double miss_us =
      std::chrono::duration<double, std::micro>(Clock::now() - t1).count() / misses;
  std::printf("plan cache hit: %.1f ns   plan search (miss) for %s: %.1f us\n", hit_ns,
              plan_redistribute(a, b)->to_string().c_str(), miss_us);
  std::printf("{\"bench\":\"redistribute\",\"case\":\"plan_cache_hit\",\"ns\":%.2f}\n", hit_ns);
  std::printf("{\"bench\":\"redistribute\",\"case\":\"plan_search_miss\",\"us\":%.2f}\n", miss_us);
  std::fflush(stdout);
}

struct Case {
  const char* name;
  Placement from, to;
};

// One rank's sweep. Rank 0 prints.
void sweep(int64_t rank, int64_t n, int64_t max_bytes) {
  const DeviceMesh mesh = DeviceMesh::arange({n});
  const std::string group = collectives::current_context().new_group(mesh.ranks());
  const std::vector<Case> cases = {{"S(0)->R", Shard(0), Replicate()},
                                   {"P->R", Partial(), Replicate()},
                                   {"P->S(0)", Partial(), Shard(0)},
                                   {"S(0)->S(1)", Shard(0), Shard(1)}};
  std::vector<int64_t> sizes = {1 << 20, 4 << 20, 16 << 20, 32 << 20, 64 << 20};
  for (const Case& c : cases) {
    for (int64_t bytes : sizes) {
      if (bytes > max_bytes) continue;
      const int64_t rows = bytes / 4 / 1024;  // float32 [rows, 1024]
      const auto meta = TensorMeta::make({rows, 1024}, at::kFloat);
      const auto src = DTensorSpec::make(mesh, {c.from}, meta);
      const auto dst = DTensorSpec::make(mesh, {c.to}, meta);
      const at::Tensor local = at::ones(local_box(src, {rank}).shape, at::kFloat);
      const DTensor d(local, src);
      std::function<at::Tensor()> bare;
      if (c.to.is_replicate() && c.from.is_shard()) {
        bare = [&] { return collectives::all_gather_into_tensor(local, 0, group); };
      } else if (c.to.is_replicate()) {
        bare = [&] { return collectives::all_reduce(local, ReduceOp::kSum, group); };
      } else if (c.from.is_partial()) {
        bare = [&] { return collectives::reduce_scatter_tensor(local, ReduceOp::kSum, 0, group); };
      } else {
        bare = [&] { return collectives::all_to_all(local, 1, 0, group); };
      }
      auto redistribute = [&] { return d.redistribute({c.to}).to_local(); };
      for (int i = 0; i < 3; ++i) {  // warm up: plans, groups, pages
        redistribute();
        bare();
      }
      const int iters = bytes <= (4 << 20) ? 40 : bytes <= (16 << 20) ? 16 : 8;
      std::vector<double> t_red, t_bare;
      for (int i = 0; i < iters; ++i) {
        collectives::barrier(group);
        auto t0 = Clock::now();
        redistribute();
        t_red.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        collectives::barrier(group);
        t0 = Clock::now();
        bare();
        t_bare.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
      if (rank != 0) continue;
      const double r = median(t_red), b = median(t_bare);
      std::printf("%-12s %10lld %14.1f %14.1f %8.3f   %s\n", c.name, static_cast<long long>(bytes),
                  r, b, r / b, plan_redistribute(src, dst)->to_string().c_str());
      std::printf(
          "{\"bench\":\"redistribute\",\"case\":\"%s\",\"backend\":\"%s\",\"ranks\":%lld,"
          "\"bytes\":%lld,\"redistribute_us\":%.2f,\"collective_us\":%.2f,\"ratio\":%.4f}\n",
          c.name, collectives::current_context().backend().c_str(), static_cast<long long>(n),
          static_cast<long long>(bytes), r, b, r / b);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::cli::parse_command_line(
      argc, argv,
      "./x bench redistribute: the plan-cache cost, and redistribute time against the bare "
      "collective it runs.\n  redistribute_bench [--backend shm] [--ranks 2] "
      "[--max-bytes 67108864]");
  const std::string backend = absl::GetFlag(FLAGS_backend);
  const int n = absl::GetFlag(FLAGS_ranks);
  const int64_t max_bytes = absl::GetFlag(FLAGS_max_bytes);
  if (n < 1) {
    std::fprintf(stderr, "redistribute_bench: error: --ranks: %d is not a rank count\n", n);
    return 2;
  }
  const bool cache = bench::install_caching_allocator();
  at::set_num_threads(1);
  std::printf("caching CPU allocator: %s\n", cache ? "on" : "off");
  plan_cache_cost();
  std::printf("\n%s, %d ranks (processes); float32 [rows, 1024]; medians\n", backend.c_str(), n);
  std::printf("%-12s %10s %14s %14s %8s   %s\n", "case", "bytes", "redistribute_us",
              "collective_us", "ratio", "plan");
  std::fflush(stdout);
  const int port = testing::free_port();
  const auto codes = testing::run_forked(
      n,
      [&](int r) {
        testing::set_launch_env(r, n, port);
        at::set_num_threads(1);
        auto ctx = collectives::init_from_env(backend);
        sweep(r, n, max_bytes);
        return 0;
      },
      std::chrono::seconds(600));
  for (int code : codes) {
    if (code != 0) {
      std::fprintf(stderr, "a rank failed (exit %d)\n", code);
      return 1;
    }
  }
  return 0;
}
