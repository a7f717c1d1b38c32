#include "collectives/work.h"

#include "collectives/communicator.h"

namespace dtensor::collectives {

void Work::wait() {
  std::exception_ptr error;
  // Backends bound every blocking step by their timeout, so this wait ends; meanwhile an
  // interrupt is answered within a poll period (NOTE [interrupts]): the collective itself then
  // fails on the worker, whose waits see the process marked interrupted.
  while (!mu_.LockWhenWithTimeout(absl::Condition(&done_), absl::FromChrono(kInterruptPoll))) {
    mu_.Unlock();
    check_interrupt();
  }
  error = error_;
  mu_.Unlock();
  if (error) std::rethrow_exception(error);
}

bool Work::is_completed() {
  absl::MutexLock lock(&mu_);
  return done_;
}

bool Work::failed() {
  absl::MutexLock lock(&mu_);
  return done_ && error_ != nullptr;
}

void Work::finish(std::exception_ptr error) {
  absl::MutexLock lock(&mu_);  // waiters re-check done_ when it is released
  done_ = true;
  error_ = error;
}

Worker::~Worker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

WorkPtr Worker::submit(std::function<void()> job) {
  auto work = std::make_shared<Work>();
  absl::MutexLock lock(&mu_);
  queue_.emplace_back(std::move(job), work);
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  return work;
}

bool Worker::idle() {
  absl::MutexLock lock(&mu_);
  return queue_.empty() && !running_;
}

void Worker::loop() {
  mu_.Lock();  // held except while a job runs
  while (true) {
    mu_.Await(absl::Condition(this, &Worker::has_job_or_stop));
    if (queue_.empty()) break;  // stopping and drained
    auto [job, work] = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    mu_.Unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    // NOTE [worker releases before finishing]
    // The job's captures (tensors, whose last reference may be a Python object) are destroyed
    // here, before finish() wakes the waiter: once woken, the main thread may return to the
    // interpreter and shut it down, and a tensor freed on this thread afterwards would re-enter a
    // finalizing Python, which ends the thread with a forced unwind through a noexcept frame
    // (std::terminate, "terminate called without an active exception", exit -6).
    job = nullptr;
    work->finish(error);
    mu_.Lock();
    running_ = false;
  }
  mu_.Unlock();
}

}  // namespace dtensor::collectives
