#include "dtensor/random.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>

#include <mutex>
#include <optional>

namespace dtensor {
namespace {
thread_local std::optional<at::Generator> t_generator;
}  // namespace

void manual_seed(uint64_t seed) {
  if (!t_generator) t_generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::lock_guard<std::mutex> lock(t_generator->mutex());
  t_generator->set_current_seed(seed);
}

at::Generator rank_generator() {
  return t_generator ? *t_generator : at::detail::getDefaultCPUGenerator();
}

void draw_with_rank_generator(const std::function<void()>& draw) {
  if (!t_generator) {
    draw();
    return;
  }
  static std::mutex swap_mu;  // the default generator is shared by every thread rank
  std::lock_guard<std::mutex> swap_lock(swap_mu);
  at::Generator def = at::detail::getDefaultCPUGenerator();
  at::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(def.mutex());
    saved = def.get_state();
    std::lock_guard<std::mutex> mine(t_generator->mutex());
    def.set_state(t_generator->get_state());
  }
  auto hand_back = [&] {
    std::lock_guard<std::mutex> lock(def.mutex());
    {
      std::lock_guard<std::mutex> mine(t_generator->mutex());
      t_generator->set_state(def.get_state());
    }
    def.set_state(saved);
  };
  try {
    draw();
  } catch (...) {
    hand_back();
    throw;
  }
  hand_back();
}

}  // namespace dtensor
