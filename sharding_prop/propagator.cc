// The propagator's entry points (propagator.h) and its cache (NOTE [propagation cache layers]); on
// a miss they run the candidate search of propagator_search.cc.

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>

#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>

#include "base/error.h"
#include "base/lru_cache.h"
#include "sharding_prop/propagator.h"
#include "sharding_prop/propagator_internal.h"

namespace dtensor::sharding {
namespace {

using detail::compute;
using detail::specs_text;

// Key flags: what else changes the answer besides the op, the inputs and the arguments.
constexpr uint8_t kStrict = 1;     // strict mode
constexpr uint8_t kAtenMetas = 2;  // output metadata from ATen (NOTE [output metadata from ATen])

struct Key {
  const OpEntry* op;
  std::vector<DTensorSpec> inputs;
  LayoutArgs args;
  uint8_t flags;
  bool matches(const OpEntry* o, const std::vector<DTensorSpec>& in, const LayoutArgs& a,
               uint8_t fl) const {
    return op == o && flags == fl && inputs == in && args == a;
  }
  friend bool operator==(const Key& a, const Key& b) {
    return a.matches(b.op, b.inputs, b.args, b.flags);
  }
};

size_t key_hash(const OpEntry* op, const std::vector<DTensorSpec>& inputs, const LayoutArgs& args,
                uint8_t flags) {
  size_t h = std::hash<const void*>()(op) ^ (flags * 0x9e3779b97f4a7c15ull);
  for (const auto& s : inputs) h = h * 1000003u ^ s.hash();
  return h * 1000003u ^ args.hash();
}

struct KeyHash {
  size_t operator()(const Key& k) const { return key_hash(k.op, k.inputs, k.args, k.flags); }
};

using SharedCache = LruCache<Key, OpSharding, KeyHash>;
constexpr size_t kDefaultCapacity = 8192;

// NOTE [propagation cache layers]
// The shared LRU below takes a mutex; ranks that are threads of one process hit it at once on
// every op, and the lock, the LRU move and the shared reference count then cost several times
// the lookup (measured: 52-75 ns alone, 360-400 ns with two threads). So each thread keeps a
// small direct-mapped front cache of thread-private copies of the entries it used: a hit there
// touches no shared cache line. Clearing or resizing the shared cache bumps a generation that
// empties every front cache; a capacity of 0 bypasses both. The shared layer is the engine's one
// cache idiom (NOTE [caches]); front hits are added to its hits when statistics are read.
SharedCache& shared_cache() {
  static auto* c = new SharedCache(kDefaultCapacity);
  return *c;
}

// The front hits of every thread: live counters and the total of threads that ended.
struct FrontHits {
  absl::Mutex mu;
  int64_t retired ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_set<const std::atomic<int64_t>*> live ABSL_GUARDED_BY(mu);
};

FrontHits& front_hits() {
  static auto* f = new FrontHits();
  return *f;
}

std::atomic<uint64_t> g_generation{1};
std::atomic<bool> g_enabled{true};

// Hits of one thread (single writer; read by propagation_cache_stats).
struct ThreadHits {
  std::atomic<int64_t> n{0};
  ThreadHits() {
    FrontHits& f = front_hits();
    absl::MutexLock lock(&f.mu);
    f.live.insert(&n);
  }
  ~ThreadHits() {
    FrontHits& f = front_hits();
    absl::MutexLock lock(&f.mu);
    f.live.erase(&n);
    f.retired += n.load();
  }
  void add() { n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
};

struct FrontSlot {
  uint64_t generation = 0;
  size_t hash = 0;
  Key key;
  std::shared_ptr<const OpSharding> value;
};

struct Front {
  static constexpr size_t kSlots = 256;
  std::array<FrontSlot, kSlots> slots;
  ThreadHits hits;
};

Front& front() {
  thread_local Front f;
  return f;
}

}  // namespace

bool OpSharding::needs_redistribute() const {
  return std::any_of(input_plans.begin(), input_plans.end(),
                     [](const auto& p) { return !p->is_noop(); });
}

std::string OpSharding::to_string() const {
  if (in_place_by_copy) {
    return op + " (rule " + rule +
           "): no layout keeps self's placements; runs out of place, then copies into self";
  }
  std::vector<std::string> ins, outs;
  for (const auto& s : input_targets) ins.push_back(dtensor::to_string(s.placements()));
  for (const auto& s : outputs) outs.push_back(dtensor::to_string(s.placements()));
  char cost_text[96];
  if (flops > 0) {
    std::snprintf(cost_text, sizeof(cost_text), "%.2f us, %.0f FLOPs per rank", cost, flops);
  } else {
    std::snprintf(cost_text, sizeof(cost_text), "%.2f us", cost);
  }
  std::string s = op + " " + absl::StrJoin(ins, ",") + " -> " + absl::StrJoin(outs, ",") +
                  " (rule " + rule + ", cost " + cost_text + ")";
  for (size_t i = 0; i < input_plans.size(); ++i) {
    if (!input_plans[i]->is_noop())
      s += "\n  input " + std::to_string(i) + ": " + input_plans[i]->to_string();
  }
  return s;
}

std::string no_rule_message(std::string_view op, const std::vector<DTensorSpec>& inputs) {
  return std::string(op) + " has no sharding rule (inputs: " + specs_text(inputs) +
         "); nearest supported: " + absl::StrJoin(nearest_ops(op), ", ") +
         " (./x ops lists them all)";
}

std::shared_ptr<const OpSharding> propagate(std::string_view op,
                                            const std::vector<DTensorSpec>& inputs,
                                            const LayoutArgs& args, PropagateOptions options) {
  const OpEntry* entry = find_op(op);
  if (entry == nullptr) throw Error(no_rule_message(op, inputs));
  return propagate(*entry, inputs, args, options);
}

std::shared_ptr<const OpSharding> propagate(const OpEntry& op,
                                            const std::vector<DTensorSpec>& inputs,
                                            const LayoutArgs& args, PropagateOptions options,
                                            const OutputMetas* aten_metas) {
  const OpEntry* entry = &op;
  const bool enabled = g_enabled.load(std::memory_order_relaxed);
  const uint64_t generation = g_generation.load(std::memory_order_acquire);
  const uint8_t flags = (options.strict ? kStrict : 0) | (aten_metas != nullptr ? kAtenMetas : 0);
  const size_t hash = key_hash(entry, inputs, args, flags);
  Front& f = front();
  FrontSlot& slot = f.slots[hash % Front::kSlots];
  if (enabled && slot.generation == generation && slot.hash == hash &&
      slot.key.matches(entry, inputs, args, flags)) {
    f.hits.add();
    return slot.value;
  }
  if (inputs.empty()) throw Error(entry->name + ": no distributed tensor inputs");
  for (size_t i = 1; i < inputs.size(); ++i) {
    if (inputs[i].mesh() != inputs[0].mesh()) {
      throw Error(entry->name + ": inputs live on different meshes (input 0 on " +
                  inputs[0].mesh().to_string() + ", input " + std::to_string(i) + " on " +
                  inputs[i].mesh().to_string() + "); redistribute cannot move between meshes");
    }
  }
  Key key{entry, inputs, args, flags};
  std::shared_ptr<const OpSharding> value = shared_cache().get_or_compute(
      key, [&] { return compute(*entry, inputs, args, options, aten_metas); });
  if (enabled) {  // a private copy: its reference count is this thread's alone
    slot.value = std::make_shared<const OpSharding>(*value);
    slot.key = std::move(key);
    slot.hash = hash;
    slot.generation = generation;
    return slot.value;
  }
  return value;
}

CacheStats propagation_cache_stats() {
  CacheStats s = shared_cache().stats();
  FrontHits& f = front_hits();
  absl::MutexLock lock(&f.mu);
  s.hits += f.retired;
  for (const auto* n : f.live) s.hits += n->load(std::memory_order_relaxed);
  return s;
}

void set_propagation_cache_capacity(size_t capacity) {
  shared_cache().set_capacity(capacity);
  g_enabled.store(capacity > 0);
  g_generation.fetch_add(1, std::memory_order_acq_rel);
}

}  // namespace dtensor::sharding
