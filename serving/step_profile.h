#pragma once
// NOTE [step profile]: where a decode step's time goes, for ./x bench serve's "overhead": the
// step's wall time T, the time in local ATen kernels K (ops on plain tensors: the per-rank
// compute the engine runs for each distributed op, outermost such op only, so nested kernels are
// not counted twice), and the time in collectives C (CommCounter::seconds: synchronous calls,
// waiting for peers included). Engine overhead = T - K - C: propagation, redistribute planning,
// dispatch and wrapping. K is measured with an at::RecordFunction callback on the calling
// thread, which itself costs time inside T, and ops whose inputs it cannot see count as engine
// work, so the overhead it reports is an upper bound.

#include <ATen/record_function.h>

namespace dtensor::serving {

class LocalKernelTimer {
 public:
  LocalKernelTimer();
  ~LocalKernelTimer();
  LocalKernelTimer(const LocalKernelTimer&) = delete;
  LocalKernelTimer& operator=(const LocalKernelTimer&) = delete;
  // Seconds this thread spent in local ATen ops since construction.
  double seconds() const;

 private:
  at::CallbackHandle handle_;
  double start_;
};

}  // namespace dtensor::serving
