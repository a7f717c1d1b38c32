#pragma once
// NOTE [caches]
// Every cache of the engine that outlives a call is an LruCache: bounded (the least recently used
// entry goes first), thread-safe (absl::Mutex), and counted (hits, misses, evictions, size,
// capacity). Values are shared_ptr<const V>, so a caller keeps a value alive after its eviction.
// A capacity of 0 caches nothing (every lookup misses and computes). Computing a missing value
// runs outside the lock: two threads that miss on one key at once both compute it, and the first
// insert wins (the values are equal by construction: caches hold pure functions of their keys).
// Hot paths that cannot afford the mutex keep a thread-private front layer over an LruCache
// (NOTE [propagation cache layers]); the LruCache stays the bounded owner and the statistics.
// Interning tables are not caches: interned specs (layout/dtensor_spec.h), the op table and the
// dispatcher's per-operator info hand out plain pointers and live for the process; they grow
// with the distinct layouts and operators a program uses, never with the number of calls.

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/hash/hash.h>
#include <absl/synchronization/mutex.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <utility>

namespace dtensor {

struct CacheStats {
  int64_t hits = 0, misses = 0, evictions = 0, size = 0, capacity = 0;
};

template <typename K, typename V, typename Hash = absl::Hash<K>, typename Eq = std::equal_to<K>>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity) {}

  // The cached value of `key` (counted as a hit), or null (a miss).
  std::shared_ptr<const V> find(const K& key) {
    absl::MutexLock lock(&mu_);
    auto it = map_.find(key);
    if (it == map_.end()) {
      ++misses_;
      return nullptr;
    }
    ++hits_;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }

  // Caches `value` under `key` unless a value is there already; returns the cached one.
  std::shared_ptr<const V> insert(const K& key, std::shared_ptr<const V> value) {
    absl::MutexLock lock(&mu_);
    if (capacity_ == 0) return value;
    auto it = map_.find(key);
    if (it != map_.end()) return it->second->second;
    order_.emplace_front(key, std::move(value));
    map_.emplace(key, order_.begin());
    while (map_.size() > capacity_) {
      map_.erase(order_.back().first);
      order_.pop_back();
      ++evictions_;
    }
    return order_.front().second;
  }

  // find(key), or compute() (outside the lock) and insert it.
  template <typename F>
  std::shared_ptr<const V> get_or_compute(const K& key, F&& compute) {
    if (auto hit = find(key)) return hit;
    return insert(key, std::shared_ptr<const V>(std::forward<F>(compute)()));
  }

  // Counts hits served elsewhere (a thread-private front layer).
  void add_hits(int64_t n) {
    absl::MutexLock lock(&mu_);
    hits_ += n;
  }

  CacheStats stats() const {
    absl::MutexLock lock(&mu_);
    return {hits_, misses_, evictions_, static_cast<int64_t>(map_.size()),
            static_cast<int64_t>(capacity_)};
  }

  // Empties the cache and bounds it anew (0: cache nothing). Statistics are kept.
  void set_capacity(size_t capacity) {
    absl::MutexLock lock(&mu_);
    capacity_ = capacity;
    map_.clear();
    order_.clear();
  }

  void clear() { set_capacity(capacity()); }

  size_t capacity() const {
    absl::MutexLock lock(&mu_);
    return capacity_;
  }

 private:
  using Order = std::list<std::pair<K, std::shared_ptr<const V>>>;
  mutable absl::Mutex mu_;
  size_t capacity_ ABSL_GUARDED_BY(mu_);
  Order order_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<K, typename Order::iterator, Hash, Eq> map_ ABSL_GUARDED_BY(mu_);
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dtensor
