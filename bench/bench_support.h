#pragma once
// What the benchmarks share: a caching CPU allocator (so that functional collectives' fresh
// outputs do not measure the kernel's page faults) and the single-thread memcpy bandwidth.

#include <c10/core/Allocator.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "base/torch_compat.h"

namespace dtensor::bench {

using Clock = std::chrono::steady_clock;

// A caching CPU allocator, as PyTorch's CUDA caching allocator and any long-running job's heap
// in steady state: freed blocks are kept by size and handed out again, never returned to the
// kernel. Functional collectives allocate their outputs on every call; through glibc, blocks of
// 32 MiB and more (its largest mmap threshold) are mmapped per call and unmapped on free, so
// every call would pay fresh page faults (~12-20 us per page on this VM: ~200 ms for 64 MiB)
// and measure the kernel instead of the collective. That cost is measured and reported on its
// own (fault_us_per_page, and page faults per call in every row).
class CachingCpuAllocator final : public c10::Allocator {
 public:
  DTENSOR_ALLOCATOR_ALLOCATE(n) { return allocate_block(n); }
  DTENSOR_ALLOCATOR_COPY_DATA
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

 private:
  static c10::DataPtr allocate_block(size_t n) {
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(n);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
      }
    }
    if (p == nullptr && n > 0) {
      p = std::aligned_alloc(64, (n + 63) / 64 * 64);
      if (p == nullptr) throw std::bad_alloc();
      std::lock_guard<std::mutex> lock(mu_);
      size_of_[p] = n;
    }
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  static void release(void* p) {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    free_[size_of_.at(p)].push_back(p);
  }
  static inline std::mutex mu_;
  static inline std::map<size_t, std::vector<void*>> free_;  // by size
  static inline std::map<void*, size_t> size_of_;
};

inline double memcpy_gbs() {
  const size_t n = 64ull << 20;
  std::vector<char> a(n, 1), b(n, 0);
  std::memcpy(b.data(), a.data(), n);  // warm the pages
  const int iters = 5;
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) std::memcpy(b.data(), a.data(), n);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<double>(n) * iters / s / 1e9;
}

// Installs CachingCpuAllocator for CPU tensors unless DTENSOR_BENCH_NO_CACHING is set; returns
// whether it did.
inline bool install_caching_allocator() {
  static CachingCpuAllocator caching;
  if (std::getenv("DTENSOR_BENCH_NO_CACHING") != nullptr) return false;
  c10::SetAllocator(c10::DeviceType::CPU, &caching, /*priority=*/1);
  return true;
}

}  // namespace dtensor::bench
