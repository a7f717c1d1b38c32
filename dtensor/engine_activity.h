#pragma once
// NOTE [engine activity]: what this thread's engine is doing, for profilers that split a step's
// time into the engine's own work and the local kernels it runs (NOTE [step profile] in
// serving/metrics.h). The dispatch kernel and the redistribute and distribute entry points hold an
// EngineScope; the local computation of a distributed op (the same op on this rank's pieces, or a
// special execution's ATen calls) runs inside a LocalKernelScope, which a LocalKernelClock on the
// thread times (two clock reads per outermost scope; nothing when no clock is running).

#include <chrono>
#include <cstdint>

namespace dtensor {

struct EngineActivity {
  int depth = 0;             // nesting of engine entry points on this thread
  int local = 0;             // > 0 while the engine runs a local kernel
  uint64_t entries = 0;      // engine entry points entered so far on this thread
  int clocks = 0;            // running LocalKernelClocks on this thread
  double local_seconds = 0;  // time in outermost LocalKernelScopes while a clock ran
  bool local_timed = false;  // the open outermost scope started with a clock running
  std::chrono::steady_clock::time_point local_start;
};

// This thread's activity.
const EngineActivity& engine_activity();

class EngineScope {
 public:
  EngineScope();
  ~EngineScope();
  EngineScope(const EngineScope&) = delete;
  EngineScope& operator=(const EngineScope&) = delete;
};

class LocalKernelScope {
 public:
  LocalKernelScope();
  ~LocalKernelScope();
  LocalKernelScope(const LocalKernelScope&) = delete;
  LocalKernelScope& operator=(const LocalKernelScope&) = delete;
};

// Times this thread's local kernels from construction: seconds() so far.
class LocalKernelClock {
 public:
  LocalKernelClock();
  ~LocalKernelClock();
  LocalKernelClock(const LocalKernelClock&) = delete;
  LocalKernelClock& operator=(const LocalKernelClock&) = delete;
  double seconds() const;

 private:
  double start_;
};

}  // namespace dtensor
