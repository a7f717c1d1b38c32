#include "serving/scheduler.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "base/error.h"
#include "collectives/functional.h"
#include "collectives/rank_context.h"
#include "dtensor/engine_activity.h"

namespace dtensor::serving {
namespace {

using Clock = std::chrono::steady_clock;
enum PlanKind : int64_t { kIdle = 0, kForward = 1, kShutdown = 2 };

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

at::Tensor broadcast(const at::Tensor& t) {
  return collectives::broadcast(t, 0, collectives::RankContext::kWorld);
}

at::Tensor plan_header(int64_t kind, int64_t len, int64_t seqs) {
  return at::tensor(std::vector<int64_t>{kind, len, seqs, 0}, at::kLong);
}

// A world of one process (no rank context, or a world of 1) needs no plans.
bool single_process() {
  return !collectives::has_current_context() || collectives::current_context().world_size() == 1;
}

}  // namespace

std::optional<Event> Request::next(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, wait, [&] { return !events_.empty(); })) return std::nullopt;
  Event out;
  while (!events_.empty()) {
    Event& e = events_.front();
    out.text += e.text;
    out.token_ids.insert(out.token_ids.end(), e.token_ids.begin(), e.token_ids.end());
    out.finish_reason = e.finish_reason;
    out.status = e.status;
    out.error = e.error;
    events_.pop_front();
    if (out.final()) break;
  }
  return out;
}

void Request::push(Event e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

Scheduler::Scheduler(Model& model, const Tokenizer& tokenizer, Metrics& metrics,
                     SchedulerOptions options, bool is_rank0)
    : model_(model),
      tokenizer_(tokenizer),
      metrics_(metrics),
      options_(options),
      rank0_(is_rank0) {}

Scheduler::Admit Scheduler::submit(const std::shared_ptr<Request>& request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!healthy_ || draining_) return Admit::kUnavailable;
    if (static_cast<int64_t>(queue_.size()) >= options_.max_queue) return Admit::kQueueFull;
    queue_.push_back(request);
    // running_ belongs to the scheduler thread: its size as last published.
    metrics_.gauges(static_cast<int64_t>(queue_.size()), running_count_, healthy_);
  }
  cv_.notify_all();
  return Admit::kOk;
}

void Scheduler::drain() {
  draining_ = true;
  cv_.notify_all();
}

std::string Scheduler::health_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void Scheduler::run() {
  if (rank0_) {
    run_rank0();
  } else {
    run_follower();
  }
}

void Scheduler::run_follower() {
  while (true) {
    const at::Tensor header = broadcast(at::zeros({4}, at::kLong));
    const int64_t kind = header[0].item<int64_t>(), len = header[1].item<int64_t>();
    if (kind == kShutdown) return;
    if (kind == kIdle) continue;
    DTENSOR_CHECK(kind == kForward && len > 0, "serve: malformed step plan from rank 0 (kind ",
                  kind, ", ", len, " values)");
    const at::Tensor payload = broadcast(at::zeros({len}, at::kLong));
    const int64_t* p = payload.data_ptr<int64_t>();
    const int64_t* end = p + len;
    const auto take = [&] {
      DTENSOR_CHECK(p < end, "serve: truncated step plan from rank 0");
      return *p++;
    };
    for (int64_t i = 0, n = take(); i < n; ++i) model_.free_slot(static_cast<int>(take()));
    for (int64_t i = 0, n = take(); i < n; ++i) {
      const int64_t want = take();
      const int got = model_.alloc_slot();
      DTENSOR_CHECK(got == want, "serve: this rank allocated cache slot ", got,
                    " where rank 0 allocated ", want, " (NOTE [step plans])");
    }
    std::vector<Sequence> seqs(static_cast<size_t>(take()));
    for (auto& s : seqs) {
      s.slot = static_cast<int>(take());
      s.start = take();
      s.tokens.resize(static_cast<size_t>(take()));
      for (auto& t : s.tokens) t = take();
    }
    model_.forward(seqs);
  }
}

at::Tensor Scheduler::call(int64_t kind, const std::vector<int>& allocs,
                           const std::vector<std::shared_ptr<Request>>& reqs, bool prefill) {
  std::vector<Sequence> seqs;
  for (const auto& r : reqs) {
    Sequence s{r->slot_, {}, r->position_};
    if (prefill) {
      s.tokens = r->params().prompt;
    } else {
      s.tokens = {r->generated_.back()};
    }
    seqs.push_back(std::move(s));
  }
  if (!single_process()) {
    std::vector<int64_t> plan = {static_cast<int64_t>(freed_.size())};
    plan.insert(plan.end(), freed_.begin(), freed_.end());
    plan.push_back(static_cast<int64_t>(allocs.size()));
    plan.insert(plan.end(), allocs.begin(), allocs.end());
    plan.push_back(static_cast<int64_t>(seqs.size()));
    for (const auto& s : seqs) {
      plan.push_back(s.slot);
      plan.push_back(s.start);
      plan.push_back(static_cast<int64_t>(s.tokens.size()));
      plan.insert(plan.end(), s.tokens.begin(), s.tokens.end());
    }
    const int64_t len = static_cast<int64_t>(plan.size());
    broadcast(plan_header(kind, len, static_cast<int64_t>(seqs.size())));
    broadcast(at::tensor(plan, at::kLong));
  }
  freed_.clear();
  return model_.forward(seqs);
}

void Scheduler::emit(const std::shared_ptr<Request>& r, int64_t token) {
  const auto now = Clock::now();
  if (r->generated_.empty()) {
    metrics_.time_to_first_token(seconds(now - r->arrived_));
  } else {
    metrics_.time_per_output_token(seconds(now - r->last_token_));
  }
  r->last_token_ = now;
  r->generated_.push_back(token);
  // The text grows by whole characters (NOTE [streaming decode]); the last token flushes the rest.
  if (!r->stream_) r->stream_ = std::make_unique<StreamDecoder>(tokenizer_);
  r->text_ += r->stream_->push(token);
  if (static_cast<int64_t>(r->generated_.size()) >= r->params().max_tokens)
    r->text_ += r->stream_->finish();
  const auto& stops = r->params().stop;
  size_t longest = 0;
  for (const auto& s : stops) longest = std::max(longest, s.size());
  // The earliest stop string in the text not yet sent (and the bytes before it that could start
  // one): the text ends before it.
  size_t cut = std::string::npos;
  const size_t from = r->emitted_ >= longest ? r->emitted_ - longest + 1 : 0;
  for (const auto& s : stops) cut = std::min(cut, r->text_.find(s, from));
  Event e;
  e.token_ids = {token};
  if (cut != std::string::npos) {
    r->text_.resize(std::max(cut, r->emitted_));
    e.finish_reason = "stop";
  } else if (static_cast<int64_t>(r->generated_.size()) >= r->params().max_tokens) {
    e.finish_reason = "length";
  }
  // While running, hold back the bytes that could begin a stop string.
  size_t safe = r->text_.size();
  if (e.finish_reason.empty() && longest > 0)
    safe = r->text_.size() >= longest - 1 ? r->text_.size() - (longest - 1) : 0;
  if (safe > r->emitted_) {
    e.text = r->text_.substr(r->emitted_, safe - r->emitted_);
    r->emitted_ = safe;
  }
  // Metrics and the slot first: a client that saw its final event sees them counted.
  if (!e.finish_reason.empty()) finish(r, e.finish_reason);
  r->push(std::move(e));
}

void Scheduler::finish(const std::shared_ptr<Request>& r, const std::string& reason) {
  metrics_.request_finished(reason);
  metrics_.tokens(static_cast<int64_t>(r->params().prompt.size()),
                  static_cast<int64_t>(r->generated_.size()));
  if (reason == "cancelled") r->push(Event{"", {}, "cancelled", 200, ""});
  if (r->slot_ >= 0) {
    model_.free_slot(r->slot_);
    freed_.push_back(r->slot_);
    r->slot_ = -1;
  }
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
}

void Scheduler::fail_all(const std::string& error) {
  std::deque<std::shared_ptr<Request>> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    healthy_ = false;
    error_ = error;
    queued.swap(queue_);
  }
  const auto fail = [&](const std::shared_ptr<Request>& r) {
    metrics_.request_finished("error");
    r->push(Event{"", {}, "", 503, "the model's ranks failed: " + error});
  };
  for (const auto& r : running_) fail(r);
  for (const auto& r : queued) fail(r);
  running_.clear();
  metrics_.gauges(0, 0, false);
}

void Scheduler::run_rank0() {
  auto last_plan = Clock::now();
  std::optional<LocalKernelClock> kernels;  // NOTE [step profile] in metrics.h
  if (options_.profile) kernels.emplace();
  while (true) {
    std::vector<std::shared_ptr<Request>> admitted;
    std::vector<int> allocs;
    bool stop = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (running_.empty())
        cv_.wait_until(lock, last_plan + options_.heartbeat,
                       [&] { return !queue_.empty() || draining_; });
    }
    for (const auto& r : std::vector<std::shared_ptr<Request>>(running_))
      if (r->cancelled()) finish(r, "cancelled");
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (static_cast<int64_t>(running_.size() + admitted.size()) < options_.max_batch &&
             !queue_.empty()) {
        auto r = queue_.front();
        if (r->cancelled()) {
          queue_.pop_front();
          metrics_.request_finished("cancelled");
          continue;
        }
        const int64_t need =
            static_cast<int64_t>(r->params().prompt.size()) + r->params().max_tokens;
        if (!model_.can_reserve(need)) {
          // Waits for running requests to free cache blocks; with none running it never fits.
          if (!running_.empty() || !admitted.empty()) break;
          queue_.pop_front();
          metrics_.request_finished("error");
          r->push(
              Event{"",
                    {},
                    "",
                    400,
                    c10::str("the request needs ", need, " positions of KV cache; the cache holds ",
                             "fewer (raise --kv-cache-memory)")});
          continue;
        }
        queue_.pop_front();
        r->slot_ = model_.alloc_slot();
        model_.reserve(r->slot_, need);
        r->gen_ = make_request_generator(r->params().sampling.seed);
        allocs.push_back(r->slot_);
        admitted.push_back(r);
      }
      stop = draining_ && queue_.empty() && running_.empty() && admitted.empty();
      running_count_ = static_cast<int64_t>(running_.size() + admitted.size());
      metrics_.gauges(static_cast<int64_t>(queue_.size()), running_count_, healthy_);
    }
    try {
      if (stop) {
        if (!single_process()) broadcast(plan_header(kShutdown, 0, 0));
        return;
      }
      if (admitted.empty() && running_.empty()) {
        if (Clock::now() - last_plan >= options_.heartbeat) {
          if (!single_process()) broadcast(plan_header(kIdle, 0, 0));
          last_plan = Clock::now();
        }
        continue;
      }
      if (!admitted.empty()) {
        collectives::CommCounter counter;
        const at::Tensor logits = call(kForward, allocs, admitted, /*prefill=*/true);
        metrics_.step(counter.total(), static_cast<int64_t>(admitted.size()));
        for (size_t i = 0; i < admitted.size(); ++i) {
          const auto& r = admitted[i];
          r->position_ = static_cast<int64_t>(r->params().prompt.size());
          running_.push_back(r);
          emit(r, sample_token(logits[static_cast<int64_t>(i)], r->params().sampling, *r->gen_));
        }
      }
      if (!running_.empty()) {
        const std::vector<std::shared_ptr<Request>> batch = running_;
        collectives::CommCounter counter;
        const double k0 = kernels ? kernels->seconds() : 0;
        const auto t0 = Clock::now();
        const at::Tensor logits = call(kForward, {}, batch, /*prefill=*/false);
        const double step_s = seconds(Clock::now() - t0);
        std::optional<Metrics::StepProfile> profile;
        if (kernels) profile = Metrics::StepProfile{kernels->seconds() - k0, counter.seconds()};
        metrics_.step(counter.total(), static_cast<int64_t>(batch.size()));
        metrics_.decode_step(step_s, profile);
        for (size_t i = 0; i < batch.size(); ++i) {
          const auto& r = batch[i];
          ++r->position_;
          emit(r, sample_token(logits[static_cast<int64_t>(i)], r->params().sampling, *r->gen_));
        }
      }
      last_plan = Clock::now();
    } catch (const std::exception& e) {
      fail_all(e.what());
      return;
    }
  }
}

}  // namespace dtensor::serving
