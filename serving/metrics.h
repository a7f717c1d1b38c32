#pragma once
// The server's counters, gauges and histograms, written in Prometheus' text format (version
// 0.0.4) for GET /metrics. Thread safe.

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace dtensor::serving {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds)
      : bounds_(std::move(upper_bounds)), counts_(bounds_.size(), 0) {}
  void observe(double v);
  // "# TYPE name histogram" and its _bucket/_sum/_count lines.
  std::string text(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative)
  int64_t count_ = 0;
  double sum_ = 0;
};

class Metrics {
 public:
  Metrics();
  void request_finished(const std::string& finish_reason);  // stop, length, cancelled, error
  void request_rejected(int status);                        // 400, 413, 429, 503
  void tokens(int64_t prompt, int64_t generated);
  void time_to_first_token(double seconds);
  void time_per_output_token(double seconds);
  void step(int64_t collectives, int64_t batch);
  void gauges(int64_t queue_depth, int64_t running, bool healthy);
  // This rank's resident model memory: local weight bytes, their one-device total, KV cache bytes.
  void memory(int64_t weight_bytes, int64_t model_bytes, int64_t kv_cache_bytes);
  // NOTE [step profile]: where a decode step's time goes, for ./x bench serve's "overhead": the
  // step's wall time T, the time in local ATen kernels K, and the time in collectives C
  // (CommCounter::seconds: synchronous calls, their copies and waiting for peers included).
  // Engine overhead = T - K - C. K is what the engine itself times as the local computation of
  // each distributed op (dtensor::LocalKernelClock, NOTE [engine activity]): two clock reads per
  // op and no RecordFunction observer (one that recorded every op's inputs cost the demo's model
  // a quarter of its step). Everything else counts as overhead: propagation, redistribute
  // planning and its local copies, dispatch, wrapping, and the model's own few ops on plain
  // tensors (building the token and position tensors), so the figure is an upper bound.
  struct StepProfile {
    double kernel_s = 0, collective_s = 0;
  };
  // One decode step's wall seconds, with its profile when the server profiles.
  void decode_step(double step, const std::optional<StepProfile>& profile);
  std::string text() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, int64_t> finished_, rejected_;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0, steps_ = 0, collectives_ = 0;
  int64_t last_step_collectives_ = 0, last_batch_ = 0, queue_ = 0, running_ = 0;
  bool healthy_ = true;
  int64_t decode_steps_ = 0, profiled_steps_ = 0, weight_bytes_ = 0, model_bytes_ = 0,
          kv_bytes_ = 0;
  double decode_s_ = 0, step_s_ = 0, kernel_s_ = 0, collective_s_ = 0;
  Histogram ttft_, tpot_;
};

}  // namespace dtensor::serving
