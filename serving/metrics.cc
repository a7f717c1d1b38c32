#include "serving/metrics.h"

#include <cstdio>
#include <sstream>

namespace dtensor::serving {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

void Histogram::observe(double v) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (v <= bounds_[i]) {
      ++counts_[i];
      break;
    }
  }
  ++count_;
  sum_ += v;
}

std::string Histogram::text(const std::string& name, const std::string& help) const {
  std::ostringstream out;
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  int64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out << name << "_bucket{le=\"" << num(bounds_[i]) << "\"} " << cum << "\n";
  }
  out << name << "_bucket{le=\"+Inf\"} " << count_ << "\n";
  out << name << "_sum " << num(sum_) << "\n" << name << "_count " << count_ << "\n";
  return out.str();
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}) {}

void Metrics::request_finished(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_[reason];
}
void Metrics::request_rejected(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++rejected_[std::to_string(status)];
}
void Metrics::tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}
void Metrics::time_to_first_token(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(s);
}
void Metrics::time_per_output_token(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  tpot_.observe(s);
}
void Metrics::step(int64_t collectives, int64_t batch) {
  std::lock_guard<std::mutex> lock(mu_);
  ++steps_;
  collectives_ += collectives;
  last_step_collectives_ = collectives;
  last_batch_ = batch;
}
void Metrics::gauges(int64_t queue_depth, int64_t running, bool healthy) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_ = queue_depth;
  running_ = running;
  healthy_ = healthy;
}

void Metrics::memory(int64_t weight_bytes, int64_t model_bytes, int64_t kv_cache_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  weight_bytes_ = weight_bytes;
  model_bytes_ = model_bytes;
  kv_bytes_ = kv_cache_bytes;
}

void Metrics::decode_step(double step, const std::optional<StepProfile>& profile) {
  std::lock_guard<std::mutex> lock(mu_);
  ++decode_steps_;
  decode_s_ += step;
  if (!profile) return;
  ++profiled_steps_;
  step_s_ += step;
  kernel_s_ += profile->kernel_s;
  collective_s_ += profile->collective_s;
}

std::string Metrics::text() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream out;
  const auto counter = [&](const std::string& name, const std::string& help, int64_t v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
        << name << " " << v << "\n";
  };
  const auto counter_s = [&](const std::string& name, const std::string& help, double v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
        << name << " " << num(v) << "\n";
  };
  const auto gauge = [&](const std::string& name, const std::string& help, double v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n"
        << name << " " << num(v) << "\n";
  };
  out << "# HELP dtensor_serve_requests_total Completion requests finished, by finish reason.\n"
         "# TYPE dtensor_serve_requests_total counter\n";
  for (const char* r : {"stop", "length", "cancelled", "error"}) {
    const auto it = finished_.find(r);
    out << "dtensor_serve_requests_total{finish_reason=\"" << r << "\"} "
        << (it == finished_.end() ? 0 : it->second) << "\n";
  }
  out << "# HELP dtensor_serve_rejected_total Requests refused before reaching the ranks, by "
         "HTTP status.\n# TYPE dtensor_serve_rejected_total counter\n";
  for (const auto& [code, n] : rejected_)
    out << "dtensor_serve_rejected_total{code=\"" << code << "\"} " << n << "\n";
  counter("dtensor_serve_prompt_tokens_total", "Prompt tokens prefilled.", prompt_tokens_);
  counter("dtensor_serve_generation_tokens_total", "Tokens generated.", generated_tokens_);
  counter("dtensor_serve_steps_total", "Model forward steps (prefill or batched decode).", steps_);
  counter("dtensor_serve_collectives_total", "Collectives issued by rank 0 in forward steps.",
          collectives_);
  gauge("dtensor_serve_collectives_per_step",
        "Collectives of the last step (plan broadcast included).",
        static_cast<double>(last_step_collectives_));
  gauge("dtensor_serve_batch_size", "Sequences in the last step.",
        static_cast<double>(last_batch_));
  gauge("dtensor_serve_queue_depth", "Requests waiting for a batch slot.",
        static_cast<double>(queue_));
  gauge("dtensor_serve_running", "Requests in the running batch.", static_cast<double>(running_));
  gauge("dtensor_serve_healthy", "1 while every rank answers, 0 after a rank failed.",
        healthy_ ? 1.0 : 0.0);
  gauge("dtensor_serve_weight_bytes", "Bytes of model weights this rank (rank 0) holds.",
        static_cast<double>(weight_bytes_));
  gauge("dtensor_serve_model_bytes", "Bytes of the whole model's weights on one device.",
        static_cast<double>(model_bytes_));
  gauge("dtensor_serve_kv_cache_bytes", "Bytes of KV cache this rank (rank 0) holds.",
        static_cast<double>(kv_bytes_));
  counter("dtensor_serve_decode_steps_total", "Batched decode steps.", decode_steps_);
  counter_s("dtensor_serve_decode_seconds_total", "Wall time of the decode steps.", decode_s_);
  counter("dtensor_serve_profiled_decode_steps_total",
          "Decode steps profiled (serve --profile; NOTE [step profile]).", profiled_steps_);
  counter_s("dtensor_serve_profiled_decode_seconds_total",
            "Wall time of the profiled decode steps.", step_s_);
  counter_s("dtensor_serve_profiled_local_kernel_seconds_total",
            "Time of the profiled decode steps in local ATen kernels.", kernel_s_);
  counter_s("dtensor_serve_profiled_collective_seconds_total",
            "Time of the profiled decode steps in collectives (waits for peers included).",
            collective_s_);
  out << ttft_.text("dtensor_serve_time_to_first_token_seconds",
                    "Time from a request's arrival to its first generated token.");
  out << tpot_.text("dtensor_serve_time_per_output_token_seconds",
                    "Time between consecutive generated tokens of a request.");
  return out.str();
}

}  // namespace dtensor::serving
