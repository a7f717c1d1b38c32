// ./x bench dispatch: what an ATen op costs on distributed tensors (at::Tensors dispatched to the
// DTensor kernel, NOTE [DTensor dispatch]) against the same op on the local pieces.
// Mesh (2), ranks are threads; rank 0 times while rank 1 runs the same loop (--rank1 idle: rank 1
// waits instead, which shows what the ranks' contention on process-wide state costs, e.g. the
// propagation cache's lock). The layouts need no communication (checked: no collective may be
// issued inside a timed loop):
//   add  [8] S(0) + [8] S(0);  mm  [16,16] S(0) x [16,16] R;  sum  [16,16] S(0) over dim 1;
//   view [16,16] S(0) -> [16,4,4] (keeps the shard). The local op runs on api::local(...).
// Cases: hit: the propagation cache answers every call; miss: the propagation cache is off
// (set_propagation_cache_capacity(0)), so every call propagates; the redistribute-plan cache
// stays warm (plan misses per call are printed). Times: median over --reps of per-call averages
// of --calls calls (misses: calls / 10), after a warm-up.
// Instructions (default when valgrind is installed; --no-instructions skips): the bench runs
// itself once under callgrind with collection toggled on only inside dispatch_bench_measured
// (rank 0's timed loop; rank 1 idle) and one dump per loop; instructions per op = total / calls
// (the loop's std::function calls and the result's destruction count on both sides).
// --profile N prints callgrind_annotate's top N inclusive functions of the dtensor add hit loop
// (--profile_op view: of another op's).
// Transformer block forward (examples/tp_model.h; B=4 S=64 D=256 4 heads, hidden 1024, f32,
// colwise wq wk wv w1 Shard(0), rowwise wo w2 Shard(1), input replicated) against the same
// local math on each rank's weight pieces with the Megatron all_reduces written by hand. The
// engine's plan is printed (CommDebugMode); its output may stay sharded where the hand's is
// replicated (no final gather is timed on either side).
// Random ops (NOTE [DTensor random]): randn, rand, uniform_ and dropout of [4096,2048] f32 S(0)
// drawn in chunks (the default chunk) against the whole global tensor drawn at once (the chunk
// set to its size, the memory of the engine before chunking), and one device's draw of the
// global tensor; ratio = chunked / whole.
// Intra-op threads: 1 (two ranks share the two cores). One JSON object per measurement:
//   {"bench":"dispatch","op":"add","case":"hit","dtensor_ns":...,"local_ns":...,"ratio":...}

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <valgrind/callgrind.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/bench_support.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "dtensor/api.h"
#include "examples/tp_model.h"
#include "sharding_prop/propagator.h"
#include "sharding_prop/redistribute_plan.h"
#include "tools/cli_args.h"

ABSL_FLAG(int, reps, 5, "repetitions per figure (the median is reported; at least 1)");
ABSL_FLAG(int64_t, calls, 20000, "calls per repetition of a hit loop (misses: calls / 10; >= 10)");
ABSL_FLAG(bool, instructions, std::system("command -v valgrind >/dev/null 2>&1") == 0,
          "count instructions per op under callgrind (--noinstructions or --no-instructions "
          "skips; default: whether valgrind is installed)");
ABSL_FLAG(int, profile, 0,
          "print callgrind_annotate's top N inclusive functions of the dtensor add hit loop");
ABSL_FLAG(std::string, profile_op, "add",
          "the op whose dtensor hit loop --profile annotates (add, mm, sum, view)");
ABSL_FLAG(std::string, rank1, "busy",
          "busy: rank 1 runs the same loops as rank 0; idle: rank 1 waits");
ABSL_FLAG(bool, child, false, "internal: the run under callgrind");

using Body = std::function<void()>;

// Rank 0's timed loop: callgrind collects only inside it (--toggle-collect).
extern "C" __attribute__((noinline)) void dispatch_bench_measured(const Body* body, int64_t n) {
  for (int64_t i = 0; i < n; ++i) (*body)();
  asm volatile("" : : : "memory");
}

// libhwy (loaded through libtorch's dependencies) reads rdtscp in a static initializer; this VM's
// CPU does not advertise rdtscp, so valgrind stops there (SIGILL). Under valgrind this definition,
// exported by the binary (linkopts in BUILD), answers instead; otherwise it forwards to libhwy's.
namespace hwy::platform {
uint64_t TimerResolution() {
  if (RUNNING_ON_VALGRIND) return 1;
  using Fn = uint64_t (*)();
  static const Fn next =
      reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "_ZN3hwy8platform15TimerResolutionEv"));
  return next != nullptr ? next() : 1;
}
}  // namespace hwy::platform

namespace {

using namespace dtensor;
namespace api = dtensor::api;
namespace c = dtensor::collectives;
using bench::Clock;

constexpr double kAddOverheadTargetNs = 1500, kAddRatioTarget = 2.5, kBlockRatioTarget = 1.2;
constexpr int64_t kChildHitCalls = 1000, kChildMissCalls = 100;  // per loop under callgrind

struct Config {
  int reps = 5;
  int64_t calls = 20000;
  bool child = false;       // under callgrind: one loop per measurement, dumps, no block
  bool rank1_idle = false;  // rank 1 skips the timed loops (no cross-thread contention)
};

struct Row {
  std::string op, kase, layout;
  double dt_ns = 0, local_ns = 0, dt_ir = -1, local_ir = -1;
  int64_t calls = 0, comms = 0;
  double hits = 0, misses = 0, plan_misses = 0;  // per dtensor call, both ranks together
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ns per call; rank 0 runs the marked loop. Counts collectives the loop issued into `comms`.
double timed(const Config& cfg, int64_t rank, const Body& body, int64_t n, const std::string& label,
             int64_t* comms) {
  c::CommCounter counter;
  const auto t0 = Clock::now();
  if (rank == 0) {
    dispatch_bench_measured(&body, n);
  } else if (!cfg.rank1_idle) {
    for (int64_t i = 0; i < n; ++i) body();
  }
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n;
  if (rank == 0 && cfg.child) CALLGRIND_DUMP_STATS_AT(label.c_str());
  *comms += counter.total();
  return ns;
}

struct Op {
  const char* name;
  std::function<at::Tensor()> dt, local;
};

// One row: `op` timed on DTensors and on their local tensors, with the propagation cache on
// ("hit") or off ("miss"); the cache counters say what each call did.
Row measure_op(const Config& cfg, int64_t rank, const std::string& group, const Op& op,
               const at::Tensor& out, const std::string& kase) {
  const bool miss = kase == "miss";
  const int64_t n =
      cfg.child ? (miss ? kChildMissCalls : kChildHitCalls) : (miss ? cfg.calls / 10 : cfg.calls);
  c::barrier(group);
  if (rank == 0) sharding::set_propagation_cache_capacity(miss ? 0 : 8192);
  c::barrier(group);
  for (int64_t i = 0; i < std::max<int64_t>(n / 4, 50); ++i) op.dt(), op.local();
  c::barrier(group);
  const auto stats0 = sharding::propagation_cache_stats();
  const auto plans0 = plan_cache_stats();
  c::barrier(group);
  Row row{op.name, kase, api::to_string(out)};
  row.calls = n;
  const Body dt_body = [&] { op.dt(); }, local_body = [&] { op.local(); };
  const std::string label = std::string(op.name) + "/" + kase;
  std::vector<double> dt, local;
  for (int r = 0; r < (cfg.child ? 1 : cfg.reps); ++r) {
    c::barrier(group);
    dt.push_back(timed(cfg, rank, dt_body, n, label + "/dtensor", &row.comms));
    c::barrier(group);
    local.push_back(timed(cfg, rank, local_body, n, label + "/local", &row.comms));
  }
  c::barrier(group);
  const auto stats1 = sharding::propagation_cache_stats();
  const auto plans1 = plan_cache_stats();
  const double calls = (cfg.rank1_idle ? 1.0 : 2.0) * n * dt.size();
  row.hits = (stats1.hits - stats0.hits) / calls;
  row.misses = (stats1.misses - stats0.misses) / calls;
  row.plan_misses = (plans1.misses - plans0.misses) / calls;
  row.dt_ns = median(dt);
  row.local_ns = median(local);
  if (row.comms != 0) throw std::runtime_error(label + ": the timed loop issued collectives");
  return row;
}

std::vector<Row> run_ops(const Config& cfg) {
  std::vector<Row> rows;
  c::run_threads(2, [&](int64_t rank) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    const std::string group = mesh.group_name(0, rank);
    const auto f32 = at::kFloat;
    auto dist = [&](std::vector<int64_t> shape, int64_t salt, Placement p) {
      return api::distribute_tensor(examples::values(shape, salt, f32), mesh, {p});
    };
    const at::Tensor a = dist({8}, 1, Shard(0)), b = dist({8}, 2, Shard(0));
    const at::Tensor x = dist({16, 16}, 3, Shard(0)), w = dist({16, 16}, 4, Replicate());
    const at::Tensor la = api::local(a), lb = api::local(b), lx = api::local(x), lw = api::local(w);
    const std::vector<Op> ops = {
        {"add", [&] { return at::add(a, b); }, [&] { return at::add(la, lb); }},
        {"mm", [&] { return at::mm(x, w); }, [&] { return at::mm(lx, lw); }},
        {"sum", [&] { return at::sum(x, {1}); }, [&] { return at::sum(lx, {1}); }},
        {"view",
         [&] {
           return x.view({16, 4, 4});
         },
         [&] {
           return lx.view({8, 4, 4});
         }},
    };
    for (int i = 0; i < (cfg.child ? 100 : 50000); ++i) ops[0].dt(), ops[0].local();  // warm up
    for (const Op& op : ops) {
      const at::Tensor out = op.dt();
      if (!at::allclose(api::local(out), op.local())) {
        throw std::runtime_error(std::string(op.name) + ": dtensor and local results differ");
      }
      for (const char* kase : {"hit", "miss"}) {
        Row row = measure_op(cfg, rank, group, op, out, kase);
        if (rank == 0) rows.push_back(std::move(row));
      }
    }
    c::barrier(group);
    if (rank == 0) sharding::set_propagation_cache_capacity(8192);
  });
  return rows;
}

// The block on plain tensors: this rank's weight pieces, all_reduce after wo and after w2.
at::Tensor hand_block(const at::Tensor& x, const examples::Params& p, const at::Tensor& mask,
                      int64_t heads, const std::string& group) {
  const int64_t B = x.size(0), S = x.size(1), D = x.size(2), hd = D / heads;
  const int64_t local_heads = p.at("wq").size(0) / hd;
  const at::Tensor n1 = examples::rms_norm(x, p.at("g1"));
  auto split = [&](const at::Tensor& t) {
    return t.view({B, S, local_heads, hd}).permute({2, 0, 1, 3});
  };
  const at::Tensor q = split(at::linear(n1, p.at("wq")));
  const at::Tensor k = split(at::linear(n1, p.at("wk")));
  const at::Tensor v = split(at::linear(n1, p.at("wv")));
  const at::Tensor scores =
      at::matmul(q, k.transpose(-2, -1)).div(std::sqrt(static_cast<double>(hd)));
  const at::Tensor attn = at::softmax(scores.masked_fill(mask, -1e9), -1);
  const at::Tensor ctx =
      at::matmul(attn, v).permute({1, 2, 0, 3}).reshape({B, S, local_heads * hd});
  const at::Tensor h = x + c::all_reduce(at::linear(ctx, p.at("wo")), ReduceOp::kSum, group);
  const at::Tensor n2 = examples::rms_norm(h, p.at("g2"));
  const at::Tensor mlp = at::linear(at::silu(at::linear(n2, p.at("w1"))), p.at("w2"));
  return h + c::all_reduce(mlp, ReduceOp::kSum, group);
}

Row run_block(const Config& cfg) {
  const int64_t B = 4, S = 64, D = 256, heads = 4, hidden = 1024, iters = 10;
  const examples::Params global = examples::block_params(D, hidden, at::kFloat);
  const at::Tensor x = examples::values({B, S, D}, 9, at::kFloat);
  const at::Tensor causal = at::ones({S, S}, at::kBool).triu(1);
  Row row{"transformer_block_forward", "hit"};
  c::run_threads(2, [&](int64_t rank) {
    at::NoGradGuard no_grad;
    const DeviceMesh mesh = api::init_device_mesh({2});
    const std::string group = mesh.group_name(0, rank);
    const examples::Params dp =
        examples::distribute_params(global, mesh, examples::block_layout(1), false);
    examples::Params lp;
    for (const auto& [name, t] : dp) lp[name] = api::local(t);
    const at::Tensor dx = api::distribute_tensor(x, mesh, {Replicate()});
    const at::Tensor dmask = api::distribute_tensor(causal, mesh, {Replicate()});
    auto dt_fwd = [&] { return examples::transformer_block(dx, dp, dmask, heads); };
    auto hand_fwd = [&] { return hand_block(x, lp, causal, heads, group); };
    auto counted = [](auto fwd, std::string* comms) {
      c::CommCounter counter;  // what api::CommDebugMode is
      at::Tensor out = fwd();
      *comms = counter.to_string();
      return out;
    };
    std::string dt_comms, hand_comms;
    const at::Tensor dt_out = counted(dt_fwd, &dt_comms), hand_out = counted(hand_fwd, &hand_comms);
    const at::Tensor full = api::full_tensor(dt_out);
    const bool same = at::allclose(full, hand_out, 1e-4, 1e-5);
    const double diff = (full - hand_out).abs().max().item<double>();
    if (rank == 0) {
      std::printf("transformer block forward, dtensor collectives (CommDebugMode, rank 0):\n%s",
                  dt_comms.c_str());
      std::printf("by hand:\n%s", hand_comms.c_str());
      std::printf(
          "output: dtensor %s, by hand replicated %s; allclose(full_tensor(dtensor), by "
          "hand) = %s (max abs diff %.3g)\n\n",
          api::to_string(dt_out).c_str(), c10::str(hand_out.sizes()).c_str(),
          same ? "true" : "false", diff);
      row.layout = api::to_string(dt_out);
    }
    for (int i = 0; i < 2; ++i) dt_fwd(), hand_fwd();
    std::vector<double> dt, hand;
    auto time_fwd = [&](const std::function<at::Tensor()>& fwd) {
      c::barrier(group);
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < iters; ++i) fwd();
      return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / iters;
    };
    for (int r = 0; r < cfg.reps; ++r) {
      dt.push_back(time_fwd(dt_fwd));
      hand.push_back(time_fwd(hand_fwd));
    }
    if (rank == 0) row.dt_ns = median(dt), row.local_ns = median(hand), row.calls = iters;
  });
  return row;
}

// NOTE [DTensor random]: each random op drawn in chunks against the whole draw (chunk = the
// tensor's size) and against one device's draw of the global tensor; one JSON line per op.
std::vector<std::string> run_random(const Config& cfg) {
  const std::vector<int64_t> shape = {4096, 2048};
  const int64_t numel = shape[0] * shape[1];
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  std::vector<std::string> lines;
  c::run_threads(2, [&](int64_t rank) {
    const DeviceMesh mesh = api::init_device_mesh({2});
    const std::string group = mesh.group_name(0, rank);
    const Placements pl = {Shard(0)};
    api::manual_seed(0);
    const at::Tensor x = api::zeros(shape, mesh, pl, f32);
    const at::Tensor plain = at::zeros(shape, f32);
    struct RandomOp {
      const char* name;
      std::function<void()> dt, one_device;
    };
    const std::vector<RandomOp> ops = {
        {"randn", [&] { (void)api::randn(shape, mesh, pl, f32); },
         [&] { (void)at::randn(shape, f32); }},
        {"rand", [&] { (void)api::rand(shape, mesh, pl, f32); },
         [&] { (void)at::rand(shape, f32); }},
        {"uniform_", [&] { x.uniform_(); }, [&] { plain.uniform_(); }},
        {"dropout", [&] { (void)at::dropout(x, 0.1, true); },
         [&] { (void)at::dropout(plain, 0.1, true); }},
    };
    auto ms_of = [&](const std::function<void()>& body, int64_t chunk) {
      std::vector<double> ms;
      for (int r = 0; r < cfg.reps; ++r) {
        c::barrier(group);
        if (rank == 0) api::set_random_chunk_elements(chunk);
        c::barrier(group);
        const auto t0 = Clock::now();
        body();
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      return median(ms);
    };
    for (const RandomOp& op : ops) {
      op.dt();  // warm up
      const double whole = ms_of(op.dt, numel), chunked = ms_of(op.dt, 0);
      // One device on rank 0 only (the default generator is the process's).
      const double one = rank == 0 ? ms_of(op.one_device, 0) : ms_of([] {}, 0);
      if (rank != 0) continue;
      char buf[512];
      std::snprintf(buf, sizeof(buf),
                    "{\"bench\":\"dispatch\",\"op\":\"%s\",\"case\":\"random_chunked\","
                    "\"chunk_elements\":%lld,\"numel\":%lld,\"chunked_ms\":%.2f,\"whole_ms\":%.2f,"
                    "\"one_device_ms\":%.2f,\"ratio\":%.3f,\"layout\":\"%s\"}",
                    op.name, static_cast<long long>(api::random_chunk_elements()),
                    static_cast<long long>(numel), chunked, whole, one, chunked / whole,
                    api::to_string(x).c_str());
      lines.push_back(buf);
    }
  });
  return lines;
}

// Runs this binary under callgrind (--child) and fills the rows' instruction counts from its
// dumps; prints the top `profile` inclusive functions of the dtensor add hit loop.
void count_instructions(std::vector<Row>& rows, int profile) {
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/dispatch_bench_cg.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  const fs::path dir = tmpl;
  const std::string cmd =
      "valgrind --tool=callgrind --collect-atstart=no "
      "--toggle-collect=dispatch_bench_measured --callgrind-out-file=" +
      (dir / "cg.out").string() + " " + fs::read_symlink("/proc/self/exe").string() +
      " --child --rank1 idle > " + (dir / "log").string() + " 2>&1";
  std::fprintf(stderr, "[dispatch] counting instructions under callgrind (~1 min)...\n");
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream log(dir / "log");
    std::fprintf(stderr, "callgrind run failed; no instruction counts:\n%s\n",
                 std::string(std::istreambuf_iterator<char>(log), {}).c_str());
    fs::remove_all(dir);
    return;
  }
  std::map<std::string, std::pair<double, std::string>> by_label;  // label -> (Ir, file)
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path());
    std::string line, label;
    const std::string trigger = "desc: Trigger: Client Request: ";
    while (std::getline(in, line)) {
      if (line.rfind(trigger, 0) == 0) label = line.substr(trigger.size());
      if (!label.empty() && line.rfind("totals: ", 0) == 0) {
        by_label[label] = {std::stod(line.substr(8)), entry.path().string()};
      }
    }
  }
  for (Row& r : rows) {
    const std::string label = r.op + "/" + r.kase;
    const int64_t n = r.kase == "miss" ? kChildMissCalls : kChildHitCalls;
    if (by_label.count(label + "/dtensor")) r.dt_ir = by_label[label + "/dtensor"].first / n;
    if (by_label.count(label + "/local")) r.local_ir = by_label[label + "/local"].first / n;
  }
  const std::string op = absl::GetFlag(FLAGS_profile_op), loop = op + "/hit/dtensor";
  if (profile > 0 && by_label.count(loop)) {
    std::printf(
        "callgrind_annotate --inclusive=yes, dtensor %s hit loop (%lld calls), top %d "
        "functions inside it:\n",
        op.c_str(), static_cast<long long>(kChildHitCalls), profile);
    // Drops the bench's frames (the loop, its lambdas) and shortens library paths to names.
    const std::string annotate =
        "callgrind_annotate --inclusive=yes --threshold=100 " + by_label[loop].second +
        " 2>/dev/null | grep -E '^ *[0-9,]+ ' | grep -v '(100.0%)\\|_Function_handler' | "
        "sed -E 's| \\[/[^]]*/| [|' | head -n " +
        std::to_string(profile);
    std::fflush(stdout);
    if (std::system(annotate.c_str()) != 0) std::printf("(callgrind_annotate failed)\n");
    std::printf("\n");
  }
  fs::remove_all(dir);
}

std::string json(const Row& r) {
  std::string s = "{\"bench\":\"dispatch\",\"op\":\"" + r.op + "\",\"case\":\"" + r.kase + "\"";
  auto add = [&](const char* key, double v, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), ",\"%s\":%.*f", key, digits, v);
    s += buf;
  };
  add("dtensor_ns", r.dt_ns, 1), add("local_ns", r.local_ns, 1);
  add("ratio", r.dt_ns / r.local_ns, 3), add("overhead_ns", r.dt_ns - r.local_ns, 1);
  if (r.op == "transformer_block_forward") {
    add("target_ratio", kBlockRatioTarget, 2);
    add("ratio_vs_target", r.dt_ns / r.local_ns / kBlockRatioTarget, 3);
  } else {
    add("calls", r.calls, 0), add("collectives", r.comms, 0);
    add("prop_hits_per_call", r.hits, 2), add("prop_misses_per_call", r.misses, 2);
    add("plan_misses_per_call", r.plan_misses, 2);
  }
  if (r.dt_ir >= 0 && r.local_ir > 0) {
    add("dtensor_instructions", r.dt_ir, 0), add("local_instructions", r.local_ir, 0);
    add("instructions_ratio", r.dt_ir / r.local_ir, 3);
  }
  return s + ",\"layout\":\"" + r.layout + "\"}";
}

}  // namespace

int main(int argc, char** argv) {
  cli::parse_command_line(
      argc, argv,
      "./x bench dispatch: what an ATen op costs on distributed tensors against the same op on "
      "the local pieces.\n  dispatch_bench [--reps 5] [--calls 20000] "
      "[--instructions | --no-instructions] [--profile N] [--rank1 busy|idle]");
  return cli::guarded_main("dispatch_bench", [&] {
    Config cfg;
    cfg.reps = std::max(1, absl::GetFlag(FLAGS_reps));
    cfg.calls = std::max<int64_t>(10, absl::GetFlag(FLAGS_calls));
    cfg.child = absl::GetFlag(FLAGS_child);
    const std::string rank1 = absl::GetFlag(FLAGS_rank1);
    if (rank1 != "busy" && rank1 != "idle") {
      throw std::invalid_argument("--rank1: expected busy or idle, got '" + rank1 + "'");
    }
    cfg.rank1_idle = rank1 == "idle";
    at::set_num_threads(1);
    std::vector<Row> rows = run_ops(cfg);
    if (cfg.child) return 0;
    if (absl::GetFlag(FLAGS_instructions)) count_instructions(rows, absl::GetFlag(FLAGS_profile));
    rows.push_back(run_block(cfg));
    const std::vector<std::string> random_lines = run_random(cfg);

    std::printf(
        "mesh (2), ranks are threads, rank 0 timed, rank 1 %s; medians of %d repetitions; "
        "hit: %lld calls, miss: %lld calls (propagation cache off, plan cache warm)\n\n",
        cfg.rank1_idle ? "idle" : "runs the same loops", cfg.reps,
        static_cast<long long>(cfg.calls), static_cast<long long>(cfg.calls / 10));
    std::printf("%-25s %-5s %12s %11s %11s %7s %10s %9s %7s %10s  %s\n", "op", "case", "dtensor_ns",
                "local_ns", "overhead", "ratio", "dt_instr", "loc_instr", "i_ratio", "prop h/m",
                "output");
    for (const Row& r : rows) {
      char ir[64] = "-          -         -";
      if (r.dt_ir >= 0 && r.local_ir > 0) {
        std::snprintf(ir, sizeof(ir), "%10.0f %9.0f %7.2f", r.dt_ir, r.local_ir,
                      r.dt_ir / r.local_ir);
      }
      std::printf("%-25s %-5s %12.1f %11.1f %11.1f %7.2f %28s %4.1f/%-4.1f  %s\n", r.op.c_str(),
                  r.kase.c_str(), r.dt_ns, r.local_ns, r.dt_ns - r.local_ns, r.dt_ns / r.local_ns,
                  ir, r.hits, r.misses, r.layout.c_str());
    }
    std::printf("\n");
    const Row &add = rows[0], &block = rows.back();
    const double over = add.dt_ns - add.local_ns, ratio = add.dt_ns / add.local_ns;
    std::printf(
        "targets: add hit overhead %.0f ns <= %.0f (%.2f of it), ratio %.2f <= %.1f (%.2f "
        "of it); transformer block ratio %.3f <= %.1f (%.2f of it)\n\n",
        over, kAddOverheadTargetNs, over / kAddOverheadTargetNs, ratio, kAddRatioTarget,
        ratio / kAddRatioTarget, block.dt_ns / block.local_ns, kBlockRatioTarget,
        block.dt_ns / block.local_ns / kBlockRatioTarget);
    for (const Row& r : rows) std::printf("%s\n", json(r).c_str());
    for (const std::string& line : random_lines) std::printf("%s\n", line.c_str());
    std::printf(
        "{\"bench\":\"dispatch\",\"target\":\"add_hit\",\"overhead_ns\":%.1f,"
        "\"overhead_target_ns\":%.0f,\"overhead_vs_target\":%.3f,\"ratio\":%.3f,"
        "\"ratio_target\":%.1f,\"ratio_vs_target\":%.3f,\"met\":%s}\n",
        over, kAddOverheadTargetNs, over / kAddOverheadTargetNs, ratio, kAddRatioTarget,
        ratio / kAddRatioTarget,
        over <= kAddOverheadTargetNs && ratio <= kAddRatioTarget ? "true" : "false");
    return 0;
  });
}
