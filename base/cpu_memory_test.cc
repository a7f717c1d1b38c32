// NOTE [CPU memory meter]: tensors allocated after install count while they live, their frees on
// any thread count, the peak holds the most live, and the tensors' data is intact.

#include "base/cpu_memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

namespace dtensor {
namespace {

TEST(CpuMemoryTest, CountsLiveAndPeakBytes) {
  install_cpu_memory_meter();
  install_cpu_memory_meter();  // idempotent
  ASSERT_TRUE(cpu_memory_meter_installed());
  reset_cpu_peak_bytes();
  const int64_t base = cpu_live_bytes();
  {
    at::Tensor a = at::arange(1 << 20, at::kFloat);  // 4 MiB
    EXPECT_EQ(cpu_live_bytes() - base, 4 << 20);
    {
      at::Tensor b = at::empty({1 << 18}, at::kDouble);  // 2 MiB
      EXPECT_EQ(cpu_live_bytes() - base, 6 << 20);
    }
    EXPECT_EQ(cpu_live_bytes() - base, 4 << 20);
    EXPECT_EQ(a[12345].item<float>(), 12345.0f);
    // Freed on another thread: still uncounted.
    std::thread([t = std::move(a)]() mutable { t = at::Tensor(); }).join();
  }
  EXPECT_EQ(cpu_live_bytes(), base);
  EXPECT_EQ(cpu_peak_bytes() - base, 6 << 20);
  reset_cpu_peak_bytes();
  EXPECT_EQ(cpu_peak_bytes(), cpu_live_bytes());
}

TEST(CpuMemoryTest, ResizeAndOpsWorkThroughTheMeter) {
  install_cpu_memory_meter();
  const int64_t base = cpu_live_bytes();
  at::Tensor t = at::ones({16});
  t.resize_({1 << 20});  // reallocates through the meter, keeping the first 16 values
  EXPECT_EQ(cpu_live_bytes() - base, 4 << 20);
  EXPECT_EQ(t.narrow(0, 0, 16).sum().item<float>(), 16.0f);
  at::Tensor a = at::randn({64, 64});
  EXPECT_TRUE(at::allclose(at::mm(a, at::eye(64)), a));
  t = at::Tensor();
  a = at::Tensor();
  EXPECT_EQ(cpu_live_bytes(), base);
}

}  // namespace
}  // namespace dtensor
