// NOTE [TSan and Debian's Abseil]: ThreadSanitizer learns about a lock from the calls it
// intercepts (pthread_mutex_*) or from annotations compiled into the lock's code. absl::Mutex
// locks through its own atomics and futex calls inside libabsl_synchronization.so, which Debian
// builds without TSan, so its annotations are compiled out: every access the project guards
// with an absl::Mutex (the spec intern table, the propagation and plan caches, the op table, the
// collectives' work queues) looks unsynchronized, and TSan reports races that cannot happen.
//
// This library, LD_PRELOADed by ./x test --tsan only (NOTE [sanitizer runs] in ./x), interposes
// absl::Mutex's and absl::CondVar's out-of-line entry points: each wrapper tells TSan what the
// real function (found with dlsym(RTLD_NEXT)) does, through the __tsan_mutex_* interface, the
// same calls Abseil makes when it is built with TSan. A real race on data outside any lock is
// still reported. Await/CondVar::Wait assume the mutex is held exclusively (as the project holds
// it); a reader-held Await would be misreported, never hidden.

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"

namespace {

// The definition after this library's of the function `ours` is (its own symbol): the real one
// in libabsl_synchronization.so, which this library links, so it follows it in the global scope
// even in Python, which loads extensions and their libraries with RTLD_LOCAL.
template <class Fn>
Fn next_definition(Fn ours) {
  Dl_info info;
  void* next = nullptr;
  if (dladdr(reinterpret_cast<void*>(ours), &info) != 0 && info.dli_sname != nullptr) {
    next = dlsym(RTLD_NEXT, info.dli_sname);
  }
  if (next == nullptr) {
    std::fprintf(stderr, "tsan_absl_mutex: no real definition of %s\n",
                 info.dli_sname ? info.dli_sname : "an absl::Mutex function");
    std::abort();
  }
  return reinterpret_cast<Fn>(next);
}

// GCC's bound-member-function extension: the address of a non-virtual member function.
#pragma GCC diagnostic ignored "-Wpmf-conversions"
#define REAL(fn, type) static const auto real = next_definition(reinterpret_cast<type>(&absl::fn))

constexpr unsigned kRead = __tsan_mutex_read_lock;

void* key(const absl::Mutex* mu) { return const_cast<absl::Mutex*>(mu); }

// Await and CondVar::Wait give the mutex up while they wait and hold it again on return. As in
// Abseil's own annotations (Mutex::AwaitCommon), the release is reported first, and what runs
// inside (the wait, and the waiters' conditions, which Abseil also evaluates inside other
// threads' Unlock) is ignored until the mutex is held again.
struct ReleasedWhileWaiting {
  explicit ReleasedWhileWaiting(absl::Mutex* mu) : mu(mu) { __tsan_mutex_pre_unlock(key(mu), 0); }
  ~ReleasedWhileWaiting() {
    __tsan_mutex_post_unlock(key(mu), 0);
    __tsan_mutex_pre_lock(key(mu), 0);
    __tsan_mutex_post_lock(key(mu), 0, 0);
  }
  absl::Mutex* mu;
};

}  // namespace

using M = absl::Mutex;
using C = absl::Condition;

void absl::Mutex::Lock() {
  REAL(Mutex::Lock, void (*)(M*));
  __tsan_mutex_pre_lock(this, 0);
  real(this);
  __tsan_mutex_post_lock(this, 0, 0);
}

void absl::Mutex::ReaderLock() {
  REAL(Mutex::ReaderLock, void (*)(M*));
  __tsan_mutex_pre_lock(this, kRead);
  real(this);
  __tsan_mutex_post_lock(this, kRead, 0);
}

void absl::Mutex::Unlock() {
  REAL(Mutex::Unlock, void (*)(M*));
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void absl::Mutex::ReaderUnlock() {
  REAL(Mutex::ReaderUnlock, void (*)(M*));
  __tsan_mutex_pre_unlock(this, kRead);
  real(this);
  __tsan_mutex_post_unlock(this, kRead);
}

bool absl::Mutex::TryLock() {
  REAL(Mutex::TryLock, bool (*)(M*));
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool locked = real(this);
  __tsan_mutex_post_lock(this, __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed),
                         0);
  return locked;
}

bool absl::Mutex::ReaderTryLock() {
  REAL(Mutex::ReaderTryLock, bool (*)(M*));
  __tsan_mutex_pre_lock(this, kRead | __tsan_mutex_try_lock);
  const bool locked = real(this);
  __tsan_mutex_post_lock(
      this, kRead | __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  return locked;
}

// The LockWhen* functions return holding the mutex, also after a timeout.
void absl::Mutex::LockWhen(const C& cond) {
  REAL(Mutex::LockWhen, void (*)(M*, const C&));
  __tsan_mutex_pre_lock(this, 0);
  real(this, cond);
  __tsan_mutex_post_lock(this, 0, 0);
}

void absl::Mutex::ReaderLockWhen(const C& cond) {
  REAL(Mutex::ReaderLockWhen, void (*)(M*, const C&));
  __tsan_mutex_pre_lock(this, kRead);
  real(this, cond);
  __tsan_mutex_post_lock(this, kRead, 0);
}

// NOTE [timeouts are deadlines]: Abseil's *WithTimeout functions compute now + timeout and jump to
// their *WithDeadline sibling through the PLT, that is into this library's wrapper. Wrapping them
// as well annotated one lock twice (TSan then saw a recursive lock, and the waiter's read of data
// the finisher wrote under the mutex was reported as a race: Work::wait's error_, seen with
// threads_collectives_test). So each forwards to the deadline wrapper, as Abseil itself does, and
// only that one tells TSan.
bool absl::Mutex::LockWhenWithTimeout(const C& cond, absl::Duration timeout) {
  return LockWhenWithDeadline(cond, absl::Now() + timeout);
}

bool absl::Mutex::ReaderLockWhenWithTimeout(const C& cond, absl::Duration timeout) {
  return ReaderLockWhenWithDeadline(cond, absl::Now() + timeout);
}

bool absl::Mutex::LockWhenWithDeadline(const C& cond, absl::Time deadline) {
  REAL(Mutex::LockWhenWithDeadline, bool (*)(M*, const C&, absl::Time));
  __tsan_mutex_pre_lock(this, 0);
  const bool met = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, 0, 0);
  return met;
}

bool absl::Mutex::ReaderLockWhenWithDeadline(const C& cond, absl::Time deadline) {
  REAL(Mutex::ReaderLockWhenWithDeadline, bool (*)(M*, const C&, absl::Time));
  __tsan_mutex_pre_lock(this, kRead);
  const bool met = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, kRead, 0);
  return met;
}

void absl::Mutex::Await(const C& cond) {
  REAL(Mutex::Await, void (*)(M*, const C&));
  if (cond.Eval()) return;  // as Abseil does first, with the mutex held
  const ReleasedWhileWaiting waiting(this);
  real(this, cond);
}

bool absl::Mutex::AwaitWithTimeout(const C& cond, absl::Duration timeout) {
  return AwaitWithDeadline(cond, absl::Now() + timeout);  // NOTE [timeouts are deadlines]
}

bool absl::Mutex::AwaitWithDeadline(const C& cond, absl::Time deadline) {
  REAL(Mutex::AwaitWithDeadline, bool (*)(M*, const C&, absl::Time));
  if (cond.Eval()) return true;  // as Abseil does first, with the mutex held
  const ReleasedWhileWaiting waiting(this);
  return real(this, cond, deadline);
}

void absl::CondVar::Wait(M* mu) {
  REAL(CondVar::Wait, void (*)(absl::CondVar*, M*));
  const ReleasedWhileWaiting waiting(mu);
  real(this, mu);
}

bool absl::CondVar::WaitWithTimeout(M* mu, absl::Duration timeout) {
  return WaitWithDeadline(mu, absl::Now() + timeout);  // NOTE [timeouts are deadlines]
}

bool absl::CondVar::WaitWithDeadline(M* mu, absl::Time deadline) {
  REAL(CondVar::WaitWithDeadline, bool (*)(absl::CondVar*, M*, absl::Time));
  const ReleasedWhileWaiting waiting(mu);
  return real(this, mu, deadline);
}
