#pragma once
// Work: the handle of an asynchronous collective; Worker: the per-group thread that runs
// asynchronous collectives in issue order.

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

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
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
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

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, WorkPtr>> queue_;
  bool running_ = false;  // a job is executing
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dtensor::collectives
