#include "collectives/communicator.h"

#include <atomic>
#include <map>
#include <optional>
#include <stdexcept>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/error.h"

namespace dtensor::collectives {
namespace {

struct Registry {
  absl::Mutex mu;
  std::map<std::string, BackendFactory> factories ABSL_GUARDED_BY(mu);
  std::map<std::string, JobLeaveHook> leave_hooks ABSL_GUARDED_BY(mu);
};

Registry& registry() {
  static Registry* r = new Registry();  // outlives static destructors of backend libraries
  return *r;
}

std::string dtype_name(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::Undefined ? "none" : c10::toString(dtype);
}

// One rank's call in words, for mismatch messages: "all_reduce #3 of 4 Float (sum) from thread
// 'MainThread'".
std::string describe(const CallSignature& s) {
  std::string out = absl::StrCat(collective_name(s.kind), " #", s.seq);
  if (s.kind != CollectiveKind::kBarrier) {
    absl::StrAppend(&out, " of ", s.numel, " ", dtype_name(s.dtype));
    if (s.kind == CollectiveKind::kAllReduce || s.kind == CollectiveKind::kReduceScatter) {
      absl::StrAppend(&out, " (", std::string(reduce_op_name(s.op)), ")");
    }
  }
  absl::StrAppend(&out, " from thread '", std::string(s.thread), "'");
  return out;
}

std::string pair_difference(const CallSignature& a, const CallSignature& b, size_t r);

// How group rank r's call disagrees with rank 0's on what every rank passes alike, or "", with
// both calls described.
std::string pair_mismatch(const CallSignature& a, const CallSignature& b, size_t r) {
  std::string bad = pair_difference(a, b, r);
  if (bad.empty()) return bad;
  return absl::StrCat(bad, " (group rank 0: ", describe(a), "; group rank ", r, ": ", describe(b),
                      ")");
}

std::string pair_difference(const CallSignature& a, const CallSignature& b, size_t r) {
  auto diff = [&](const char* what, const std::string& x, const std::string& y) {
    return absl::StrCat(what, " differs: rank 0 has ", x, ", group rank ", r, " has ", y);
  };
  if (a.seq != b.seq) {
    return absl::StrCat("sequence differs: rank 0 is at collective #", a.seq,
                        " of this group, group rank ", r, " at #", b.seq,
                        " (a rank skipped or repeated a collective)");
  }
  if (a.purpose != b.purpose) {  // NOTE [collective purpose] in functional.h
    auto named = [](std::string_view p) {
      return p.empty() ? std::string("no named purpose") : absl::StrCat("'", std::string(p), "'");
    };
    return absl::StrCat("purpose differs: rank 0 issues this collective for ", named(a.purpose),
                        ", group rank ", r, " for ", named(b.purpose),
                        " (the ranks reached different parts of the program: e.g. a module that "
                        "ran on some ranks only, or modules run in a different order)");
  }
  if (a.program_ops != 0 && b.program_ops != 0 &&
      (a.program_ops != b.program_ops || a.program != b.program)) {
    return absl::StrCat(
        "the distributed-tensor program differs: before this collective rank 0 ran ", a.program_ops,
        " ops on the mesh (digest ", absl::Hex(a.program), "), group rank ", r, " ran ",
        b.program_ops, " (digest ", absl::Hex(b.program),
        "): an op got different non-tensor arguments on different ranks (a Python scalar drawn "
        "per process, a size, a reduction), or ran on some ranks only; every rank must run the "
        "same ops with the same arguments (NOTE [program digest]; DTENSOR_PROGRAM_CHECK=0 turns "
        "the check off)");
  }
  if (a.thread != b.thread || a.thread_seq != b.thread_seq) {
    return absl::StrCat("issuing thread differs: rank 0 called from thread '",
                        std::string(a.thread), "' (its call #", a.thread_seq,
                        " on this group), group rank ", r, " from '", std::string(b.thread),
                        "' (its call #", b.thread_seq, ")",
                        " (threads of a rank that share a group must issue its collectives in "
                        "the same order on every rank: NOTE [issuing thread])");
  }
  if (a.kind != b.kind) {
    return diff("collective", collective_name(a.kind), collective_name(b.kind));
  }
  if (a.kind == CollectiveKind::kBarrier) return "";
  if (a.dtype != b.dtype) return diff("dtype", dtype_name(a.dtype), dtype_name(b.dtype));
  if (a.op != b.op) {
    return diff("reduce op", std::string(reduce_op_name(a.op)), std::string(reduce_op_name(b.op)));
  }
  if (a.src != b.src) return diff("broadcast source", absl::StrCat(a.src), absl::StrCat(b.src));
  const bool same_numel = a.kind == CollectiveKind::kAllReduce ||
                          a.kind == CollectiveKind::kBroadcast ||
                          a.kind == CollectiveKind::kReduceScatter;
  if (same_numel && a.numel != b.numel) {
    return diff("number of elements", absl::StrCat(a.numel), absl::StrCat(b.numel));
  }
  if ((a.kind == CollectiveKind::kAllGather || a.kind == CollectiveKind::kReduceScatter) &&
      a.output_splits != b.output_splits) {
    return diff("split sizes", absl::StrCat("[", absl::StrJoin(a.output_splits, ","), "]"),
                absl::StrCat("[", absl::StrJoin(b.output_splits, ","), "]"));
  }
  return "";
}

// Whether what each rank sends matches what its peers expect to receive, or "".
std::string split_mismatch(const std::vector<CallSignature>& calls) {
  const int64_t n = static_cast<int64_t>(calls.size());
  for (int64_t r = 0; r < n; ++r) {
    const CallSignature& c = calls[r];
    if (c.kind == CollectiveKind::kAllGather && c.output_splits[r] != c.numel) {
      return absl::StrCat("group rank ", r, " sends ", c.numel,
                          " elements but the split sizes say ", c.output_splits[r]);
    }
    if (c.kind != CollectiveKind::kAllToAll) continue;
    for (int64_t s = 0; s < n; ++s) {
      if (calls[s].input_splits[r] != c.output_splits[s]) {
        return absl::StrCat("group rank ", s, " sends ", calls[s].input_splits[r],
                            " elements to group rank ", r, ", which expects ", c.output_splits[s]);
      }
    }
  }
  return "";
}

}  // namespace

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "?";
}

CallSignature signature_of(const CollectiveCall& call) {
  CallSignature s;
  s.kind = call.kind;
  s.op = call.op;
  if (call.input.defined()) {
    s.dtype = call.input.scalar_type();
    // A boxed call's input is empty: it sends its boxes, its input splits' sum.
    s.numel =
        call.boxed() ? offset_of(call.input_splits, call.input_splits.size()) : call.input.numel();
  }
  s.src = call.src;
  s.input_splits = call.input_splits;
  s.output_splits = call.output_splits;
  s.seq = call.seq;
  s.thread = call.thread;
  s.thread_seq = call.thread_seq;
  s.program_ops = call.program_ops;
  s.program = call.program;
  s.purpose = call.purpose;
  return s;
}

namespace {
ABSL_CONST_INIT absl::Mutex g_label_mu(absl::kConstInit);
std::function<std::string()>* g_label_provider ABSL_GUARDED_BY(g_label_mu) = nullptr;
thread_local std::optional<std::string> t_label;

std::string cut(std::string label) {
  if (label.size() >= kThreadLabelBytes) label.resize(kThreadLabelBytes - 1);
  return label;
}
}  // namespace

const std::string& thread_label() {
  if (!t_label) {
    std::function<std::string()> provider;
    {
      absl::MutexLock lock(&g_label_mu);
      if (g_label_provider != nullptr) provider = *g_label_provider;
    }
    t_label = cut(provider ? provider() : std::string());
  }
  return *t_label;
}

void set_thread_label(const std::string& label) { t_label = cut(label); }

namespace {
std::function<void()>* g_interrupt_hook ABSL_GUARDED_BY(g_label_mu) = nullptr;
std::atomic<bool> g_interrupted{false};
}  // namespace

void set_interrupt_hook(std::function<void()> hook) {
  absl::MutexLock lock(&g_label_mu);
  delete g_interrupt_hook;
  g_interrupt_hook = hook ? new std::function<void()>(std::move(hook)) : nullptr;
}

bool interrupted() { return g_interrupted.load(std::memory_order_acquire); }

void check_interrupt() {
  if (interrupted()) {
    throw CollectiveError(
        "this process was interrupted (SIGINT) during a collective: its groups "
        "are broken (NOTE [interrupts])");
  }
  std::function<void()> hook;
  {
    absl::MutexLock lock(&g_label_mu);
    if (g_interrupt_hook != nullptr) hook = *g_interrupt_hook;
  }
  if (!hook) return;
  try {
    hook();
  } catch (...) {
    g_interrupted.store(true, std::memory_order_release);
    throw;
  }
}

void set_thread_label_provider(std::function<std::string()> provider) {
  absl::MutexLock lock(&g_label_mu);
  delete g_label_provider;
  g_label_provider = provider ? new std::function<std::string()>(std::move(provider)) : nullptr;
}

std::string mismatch(const std::vector<CallSignature>& calls) {
  for (size_t r = 1; r < calls.size(); ++r) {
    std::string bad = pair_mismatch(calls[0], calls[r], r);
    if (!bad.empty()) return bad;
  }
  return split_mismatch(calls);
}

int64_t group_rank_of(const CommunicatorOptions& options) {
  const auto& ranks = options.group.ranks;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == options.global_rank) return static_cast<int64_t>(i);
  }
  throw Error("rank " + std::to_string(options.global_rank) + " is not a member of group '" +
              options.group.name + "'");
}

void register_backend(const std::string& name, BackendFactory factory, JobLeaveHook on_leave) {
  Registry& reg = registry();
  absl::MutexLock lock(&reg.mu);
  if (!reg.factories.emplace(name, std::move(factory)).second) {
    throw Error("collectives backend '" + name + "' is registered twice");
  }
  if (on_leave) reg.leave_hooks.emplace(name, std::move(on_leave));
}

void leave_job(const std::string& backend, const std::string& job, int64_t rank,
               const std::string& why) {
  JobLeaveHook hook;
  {
    Registry& reg = registry();
    absl::MutexLock lock(&reg.mu);
    auto it = reg.leave_hooks.find(backend);
    if (it != reg.leave_hooks.end()) hook = it->second;
  }
  if (hook) hook(job, rank, why);
}

bool has_backend(const std::string& name) {
  Registry& reg = registry();
  absl::MutexLock lock(&reg.mu);
  return reg.factories.count(name) > 0;
}

std::vector<std::string> backend_names() {
  Registry& reg = registry();
  absl::MutexLock lock(&reg.mu);
  std::vector<std::string> names;
  for (const auto& [name, f] : reg.factories) names.push_back(name);
  return names;
}

std::unique_ptr<Communicator> make_communicator(const CommunicatorOptions& options) {
  BackendFactory factory;
  {
    Registry& reg = registry();
    absl::MutexLock lock(&reg.mu);
    auto it = reg.factories.find(options.group.backend);
    if (it != reg.factories.end()) factory = it->second;
  }
  if (!factory) {
    const std::string known = absl::StrJoin(backend_names(), ", ");
    throw Error("unknown collectives backend '" + options.group.backend + "' for group '" +
                options.group.name + "'; registered: " + (known.empty() ? "none" : known));
  }
  return factory(options);
}

}  // namespace dtensor::collectives
