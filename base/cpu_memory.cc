#include "base/cpu_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>

namespace dtensor {
namespace {

std::atomic<int64_t> g_live{0}, g_peak{0};
std::atomic<bool> g_installed{false};

void add(int64_t n) {
  const int64_t live = g_live.fetch_add(n, std::memory_order_relaxed) + n;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

// One counted block: the wrapped allocator's DataPtr, freed with it.
struct Block {
  c10::DataPtr inner;
  int64_t bytes;
  static void free(void* ctx) {
    auto* b = static_cast<Block*>(ctx);
    g_live.fetch_sub(b->bytes, std::memory_order_relaxed);
    delete b;
  }
};

class MeteredCpuAllocator final : public c10::Allocator {
 public:
  explicit MeteredCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    add(static_cast<int64_t>(n));
    return {data, new Block{std::move(inner), static_cast<int64_t>(n)}, &Block::free, device};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

}  // namespace

void install_cpu_memory_meter() {
  static std::once_flag once;
  std::call_once(once, [] {
    static MeteredCpuAllocator meter(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&meter, /*priority=*/UINT8_MAX);
    g_installed = true;
  });
}

bool cpu_memory_meter_installed() { return g_installed; }

int64_t cpu_live_bytes() { return g_live.load(std::memory_order_relaxed); }

int64_t cpu_peak_bytes() { return g_peak.load(std::memory_order_relaxed); }

void reset_cpu_peak_bytes() { g_peak.store(g_live.load(std::memory_order_relaxed)); }

}  // namespace dtensor
