#pragma once
// Continuous batching over the ranks of a tensor-parallel model (vLLM's and TGI's scheme).
//
// Rank 0 owns the requests: HTTP threads submit() them into a bounded queue. Every step, rank 0
// admits queued requests into free cache slots (up to max_batch running, and while the model's
// cache can reserve their prompt and max_tokens: Model::can_reserve), prefills each newly
// admitted prompt, then runs one batched decode step for every running request; requests join
// and leave at step boundaries, each with its own slot, sampling parameters and generator.
//
// NOTE [step plans]: every rank runs the same model calls in the same order. Rank 0 decides each
// call and broadcasts it as a plan (two broadcasts through the engine's collectives: a 4-int64
// header, then the payload): the slots freed since the last plan, the slots allocated, and the
// sequences (slot, start position, token ids). The other ranks replay the frees and
// allocations (lowest free slot first, so they get the slots rank 0 got; a mismatch is an
// error) and call the model with the same batch. Only rank 0 samples (NOTE [sampling on rank
// 0]): the ids it picks reach the others as the next plan's tokens. When there is nothing to
// do, rank 0 broadcasts an idle plan every `heartbeat`, so waiting ranks never reach the
// collective timeout and rank 0 learns within one timeout that a rank died: it then marks
// itself unhealthy, fails every pending request with 503, and refuses new ones. drain() (on
// SIGTERM) stops admitting; once the running and queued requests have finished, rank 0
// broadcasts a shutdown plan and run() returns on every rank.

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "serving/completions_api.h"
#include "serving/metrics.h"
#include "serving/models/model.h"
#include "serving/tokenizer.h"

namespace dtensor::serving {

// What a request's consumer (its HTTP thread) receives: new text and ids, and at the end a finish
// reason ("stop", "length") or an error (status 503 and a message).
struct Event {
  std::string text;
  std::vector<int64_t> token_ids;
  std::string finish_reason;
  int status = 200;
  std::string error;
  bool final() const { return !finish_reason.empty() || status != 200; }
};

class Request {
 public:
  Request(std::string id, CompletionRequest params)
      : id_(std::move(id)), params_(std::move(params)) {}
  const std::string& id() const { return id_; }
  const CompletionRequest& params() const { return params_; }

  // Consumer side: waits up to `wait` for events; returns them merged into one (text and ids
  // appended, the final fields of the last), or nullopt on timeout.
  std::optional<Event> next(std::chrono::milliseconds wait);
  // The client went away: the scheduler drops the request at the next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Scheduler side.
  void push(Event e);

 private:
  friend class Scheduler;
  std::string id_;
  CompletionRequest params_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;

  // Rank 0's generation state (scheduler thread only).
  int slot_ = -1;
  int64_t position_ = 0;  // tokens in the cache
  std::vector<int64_t> generated_;
  std::unique_ptr<StreamDecoder> stream_;  // generated_ to text_
  std::string text_;
  size_t emitted_ = 0;  // bytes of text_ sent
  std::optional<at::Generator> gen_;
  std::chrono::steady_clock::time_point arrived_ = std::chrono::steady_clock::now(), last_token_;
};

struct SchedulerOptions {
  int64_t max_batch = 8;   // running requests (the model's cache slots)
  int64_t max_queue = 32;  // waiting requests; more get 429
  std::chrono::milliseconds heartbeat{200};
  // Time each decode step's local kernels and collectives (NOTE [step profile]); costs a
  // callback per ATen op.
  bool profile = false;
};

class Scheduler {
 public:
  Scheduler(Model& model, const Tokenizer& tokenizer, Metrics& metrics, SchedulerOptions options,
            bool is_rank0);

  enum class Admit { kOk, kQueueFull, kUnavailable };
  // Rank 0: queues a request (kQueueFull: 429; kUnavailable, unhealthy or draining: 503).
  Admit submit(const std::shared_ptr<Request>& request);
  // Rank 0: stop admitting; run() returns once the admitted requests have finished.
  void drain();
  bool healthy() const { return healthy_; }
  std::string health_error() const;
  bool draining() const { return draining_; }

  // Every rank: the step loop. Returns after the shutdown plan, or on rank 0 after a failure of
  // the ranks (healthy() is then false); on the other ranks a failure throws.
  void run();

 private:
  void run_rank0();
  void run_follower();
  // Rank 0: one model call for `seqs` (broadcast plan, forward); returns the logits.
  at::Tensor call(int64_t kind, const std::vector<int>& allocs,
                  const std::vector<std::shared_ptr<Request>>& reqs, bool prefill);
  void emit(const std::shared_ptr<Request>& r, int64_t token);
  void finish(const std::shared_ptr<Request>& r, const std::string& reason);
  void fail_all(const std::string& error);

  Model& model_;
  const Tokenizer& tokenizer_;
  Metrics& metrics_;
  SchedulerOptions options_;
  bool rank0_;
  std::atomic<bool> healthy_{true}, draining_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  std::string error_;
  int64_t running_count_ = 0;  // running_.size() as the scheduler last published it (under mu_)
  // Scheduler thread only.
  std::vector<std::shared_ptr<Request>> running_;
  std::vector<int> freed_;  // slots freed on rank 0 since the last plan
};

}  // namespace dtensor::serving
