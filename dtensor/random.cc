#include "dtensor/random.h"

#include <ATen/CPUGeneratorImpl.h>

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

}  // namespace dtensor
