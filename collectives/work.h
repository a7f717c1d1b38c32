#pragma once
// Work: the handle of an asynchronous collective; Worker: the per-group thread that runs
// asynchronous collectives in issue order.

#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dtensor::collectives {

class Work {
 public:
  // Blocks until the collective (and its epilogue) finished; rethrows its error.
  void wait();
  bool is_completed();
  // Completed with an error (wait() would rethrow it).
  bool failed();
  void finish(std::exception_ptr error);

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::exception_ptr error_ ABSL_GUARDED_BY(mu_);
};
using WorkPtr = std::shared_ptr<Work>;

// One background thread running queued jobs in order. Started on first use.
class Worker {
 public:
  ~Worker();
  // Queues `job`; the returned Work completes when it has run.
  WorkPtr submit(std::function<void()> job);
  // True when nothing is queued or running (a synchronous call may then run inline and still
  // keep issue order).
  bool idle();

 private:
  void loop();
  bool has_job_or_stop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !queue_.empty();
  }

  absl::Mutex mu_;
  std::deque<std::pair<std::function<void()>, WorkPtr>> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // a job is executing
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started under mu_ by the first submit(); joined by the destructor
};

}  // namespace dtensor::collectives
