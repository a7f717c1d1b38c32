#include "dtensor/engine_activity.h"

namespace dtensor {
namespace {

using Clock = std::chrono::steady_clock;

thread_local EngineActivity t_activity;

}  // namespace

const EngineActivity& engine_activity() { return t_activity; }

EngineScope::EngineScope() {
  ++t_activity.depth;
  ++t_activity.entries;
}
EngineScope::~EngineScope() { --t_activity.depth; }

LocalKernelScope::LocalKernelScope() {
  if (t_activity.local++ == 0 && (t_activity.local_timed = t_activity.clocks > 0)) {
    t_activity.local_start = Clock::now();
  }
}
LocalKernelScope::~LocalKernelScope() {
  if (--t_activity.local == 0 && t_activity.local_timed) {
    t_activity.local_seconds +=
        std::chrono::duration<double>(Clock::now() - t_activity.local_start).count();
  }
}

LocalKernelClock::LocalKernelClock() : start_(t_activity.local_seconds) { ++t_activity.clocks; }
LocalKernelClock::~LocalKernelClock() { --t_activity.clocks; }
double LocalKernelClock::seconds() const { return t_activity.local_seconds - start_; }

}  // namespace dtensor
