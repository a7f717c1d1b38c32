// ./x bench propagation: what one sharding propagation costs, per op, on a (2,2) mesh.
//   hit:  propagate() on the same inputs in a tight loop (the propagation cache answers);
//   miss: propagate() with the propagation cache off (set_propagation_cache_capacity(0)), so
//         every call builds the rule, enumerates candidates and prices them. The redistribute
//         plans it prices are cached on their own (plan_redistribute); "miss" has them warm, as a
//         running program does after its first step. "miss, plans cold" gives every call new
//         tensor shapes (every input's but add's bias and mm's weight), so the plan cache misses
//         too (each plan is an A* search); plan_misses_per_call counts them.
// Each figure is the median over 5 repetitions of an average over many calls (hits: 1M per
// repetition; misses: 2000 per repetition; cold misses: 400 per repetition, each call on
// shapes of its own). The cache counters check that hits hit and misses miss.
// Prints a table and one JSON object per op:
//   {"bench":"propagation","op":"mm","hit_ns":...,"miss_ns":...,"miss_plans_cold_ns":...}
// Targets: hit < 300 ns, miss < 50 us (plans warm). Restores the cache capacity (8192) at the end.
//
//   propagation_bench [--reps 5]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "bench/bench_support.h"
#include "layout/dtensor_spec.h"
#include "sharding_prop/propagator.h"
#include "tools/cli_args.h"

ABSL_FLAG(int, reps, 5, "repetitions per figure (the median is reported; at least 1)");

using namespace dtensor;
using namespace dtensor::sharding;
using bench::Clock;

namespace {

constexpr double kHitTargetNs = 300;
constexpr double kMissTargetNs = 50000;

struct Case {
  const char* name;  // short name for the table and JSON
  const char* op;
  LayoutArgs args;
  std::vector<Placements> placements;  // one per input
  // The input shapes for variant `i` (0: the case's own shapes; i > 0: distinct shapes of the
  // same kind, for misses with cold plans).
  std::function<std::vector<std::vector<int64_t>>(int64_t i)> shapes;
};

std::vector<DTensorSpec> specs_for(const DeviceMesh& mesh, const Case& c, int64_t variant) {
  const auto shapes = c.shapes(variant);
  std::vector<DTensorSpec> specs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    specs.push_back(DTensorSpec::make(mesh, c.placements[i], TensorMeta::make(shapes[i])));
  }
  return specs;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "propagation_bench: cache counters disagree (%s)\n", what);
    std::exit(1);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Average ns per call of `n` calls of propagate(c, inputs[k % inputs.size()]).
double time_calls(const Case& c, const std::vector<std::vector<DTensorSpec>>& inputs, int n) {
  const auto t0 = Clock::now();
  for (int k = 0; k < n; ++k) {
    auto s = propagate(c.op, inputs[k % inputs.size()], c.args);
    asm volatile("" : : "r"(s.get()) : "memory");
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n;
}

std::string placements_text(const Case& c) {
  std::string s;
  for (size_t i = 0; i < c.placements.size(); ++i) {
    if (i) s += " ";
    s += to_string(c.placements[i]);
  }
  return s;
}

// The ops measured: one Case per op, shapes growing by multiples of 4 per variant so every
// variant shards evenly alike.
std::vector<Case> bench_cases() {
  const Placement S0 = Shard(0), S1 = Shard(1), R = Replicate();
  return {
      {"add",
       "aten::add.Tensor",
       {},
       {{S0, S1}, {R, S0}},  // x + bias, bias sharded like x's dim 1
       [](int64_t i) {
         return std::vector<std::vector<int64_t>>{{1024 + 4 * i, 1024}, {1024}};
       }},
      {"mm",
       "aten::mm",
       {},
       {{S0, R}, {R, S1}},  // batch-sharded x times column-sharded w
       [](int64_t i) {
         return std::vector<std::vector<int64_t>>{{1024 + 4 * i, 512}, {512, 256}};
       }},
      {"sum",
       "aten::sum.dim_IntList",
       {{0, 1}},
       {{S0, S1}},  // keepdim 0, dim 1: a Partial
       [](int64_t i) {
         return std::vector<std::vector<int64_t>>{{1024 + 4 * i, 1024}};
       }},
      {"softmax",
       "aten::_softmax",
       {{-1}},
       {{S0, S1}},  // dim -1 sharded: must be gathered
       [](int64_t i) {
         return std::vector<std::vector<int64_t>>{{1024 + 4 * i, 1024}};
       }},
      {"view",
       "aten::view",
       {{-1}},
       {{S0, R}},  // flatten through the sharded major dim
       [](int64_t i) {
         return std::vector<std::vector<int64_t>>{{64 + 4 * i, 32}};
       }},
      {"cat",
       "aten::cat",
       {{0}},
       {{R, S1}, {R, S1}, {R, S1}},  // cat dim 0, dim 1 sharded
       [](int64_t i) {
         return std::vector<std::vector<int64_t>>{
             {16 + 4 * i, 8}, {16 + 4 * i, 8}, {16 + 4 * i, 8}};
       }},
  };
}

constexpr int kHitCalls = 1000000, kMissCalls = 2000, kColdCalls = 400;

struct Measured {
  double hit_ns, miss_ns, cold_ns, plan_misses_per_call;
  std::shared_ptr<const OpSharding> chosen;
};

// Hit, miss (plans warm) and cold-miss medians for one case; the cache counters check that
// hits hit and misses miss. `next_variant` hands out distinct shapes across cases.
Measured measure(const DeviceMesh& mesh, const Case& c, int reps, int64_t& next_variant) {
  const std::vector<std::vector<DTensorSpec>> same = {specs_for(mesh, c, 0)};
  set_propagation_cache_capacity(8192);
  Measured m;
  m.chosen = propagate(c.op, same[0], c.args);
  std::vector<double> hit, miss, cold;
  auto before = propagation_cache_stats();
  for (int r = 0; r < reps; ++r) hit.push_back(time_calls(c, same, kHitCalls));
  check(propagation_cache_stats().hits - before.hits == int64_t{reps} * kHitCalls, "hits");
  set_propagation_cache_capacity(0);  // every call misses; plans stay cached
  before = propagation_cache_stats();
  const auto plans_before = plan_cache_stats();
  for (int r = 0; r < reps; ++r) miss.push_back(time_calls(c, same, kMissCalls));
  check(propagation_cache_stats().misses - before.misses == int64_t{reps} * kMissCalls, "misses");
  check(plan_cache_stats().misses == plans_before.misses, "warm plans");
  const auto cold_before = plan_cache_stats();
  for (int r = 0; r < reps; ++r) {
    std::vector<std::vector<DTensorSpec>> distinct;  // interned outside the timed loop
    for (int k = 0; k < kColdCalls; ++k) distinct.push_back(specs_for(mesh, c, next_variant++));
    cold.push_back(time_calls(c, distinct, kColdCalls));
  }
  m.hit_ns = median(hit);
  m.miss_ns = median(miss);
  m.cold_ns = median(cold);
  m.plan_misses_per_call =
      static_cast<double>(plan_cache_stats().misses - cold_before.misses) / (reps * kColdCalls);
  return m;
}

// One table row on stdout; returns the case's JSON line.
std::string report(const Case& c, const Measured& m) {
  std::string outs;
  for (const auto& o : m.chosen->outputs)
    outs += (outs.empty() ? "" : " ") + to_string(o.placements());
  std::printf("%-8s %-27s %-24s %8.1f %8.2f %8.2f %8.3f %13.2f %12.2f\n", c.name,
              placements_text(c).c_str(),
              ("-> " + outs + (m.chosen->needs_redistribute() ? " (redist)" : "")).c_str(),
              m.hit_ns, m.hit_ns / kHitTargetNs, m.miss_ns / 1e3, m.miss_ns / kMissTargetNs,
              m.cold_ns / 1e3, m.plan_misses_per_call);
  std::fflush(stdout);
  return absl::StrFormat(
      "{\"bench\":\"propagation\",\"op\":\"%s\",\"aten\":\"%s\",\"inputs\":\"%s\","
      "\"hit_ns\":%.1f,\"miss_ns\":%.0f,\"miss_plans_cold_ns\":%.0f,"
      "\"plan_misses_per_call\":%.2f,\"hit_target_ratio\":%.3f,\"miss_target_ratio\":%.3f}",
      c.name, c.op, placements_text(c), m.hit_ns, m.miss_ns, m.cold_ns, m.plan_misses_per_call,
      m.hit_ns / kHitTargetNs, m.miss_ns / kMissTargetNs);
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::cli::parse_command_line(
      argc, argv,
      "./x bench propagation: what one sharding propagation costs, per op, on a (2,2) mesh.\n"
      "  propagation_bench [--reps 5]");
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const DeviceMesh mesh = DeviceMesh::arange({2, 2});
  std::printf("propagate() on mesh (2,2); medians of %d repetitions of per-call averages\n", reps);
  std::printf(
      "hit: %d calls on the same inputs; miss: %d calls with the propagation cache off "
      "(plan cache warm, the typical miss);\nmiss, plans cold: %d calls on distinct "
      "shapes (propagation and redistribute plan caches both miss)\n\n",
      kHitCalls, kMissCalls, kColdCalls);
  std::printf("%-8s %-27s %-24s %8s %8s %8s %8s %13s %12s\n", "op", "inputs", "chosen", "hit_ns",
              "hit/300", "miss_us", "miss/50", "cold_miss_us", "plans/cold");
  std::vector<std::string> json, explain;
  int64_t next_variant = 1;
  for (const Case& c : bench_cases()) {
    const Measured m = measure(mesh, c, reps, next_variant);
    json.push_back(report(c, m));
    explain.push_back(m.chosen->to_string());
  }
  set_propagation_cache_capacity(8192);
  std::printf("\ntargets: hit < 300 ns, miss < 50 us (plans warm); ratio = measured / target\n\n");
  for (const auto& e : explain) std::printf("%s\n", e.c_str());
  std::printf("\n");
  for (const auto& j : json) std::printf("%s\n", j.c_str());
  const auto stats = propagation_cache_stats();
  std::printf("propagation cache after: capacity %lld\n", static_cast<long long>(stats.capacity));
  return 0;
}
