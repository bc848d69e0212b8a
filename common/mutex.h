// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with
// Clang's thread-safety annotations, so that -Wthread-safety
// (tools/thread_safety_check) checks what a lock guards:
//
//   class Table {
//    public:
//     void Add(int x) ABSL_LOCKS_EXCLUDED(mu_) {
//       MutexLock lock(&mu_);
//       AddLocked(x);
//       changed_.SignalAll();
//     }
//     void AwaitNonEmpty() ABSL_LOCKS_EXCLUDED(mu_) {
//       MutexLock lock(&mu_);
//       while (items_.empty()) changed_.Wait(&mu_);
//     }
//    private:
//     void AddLocked(int x) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { items_.push_back(x); }
//     Mutex mu_;
//     CondVar changed_;
//     std::vector<int> items_ ABSL_GUARDED_BY(mu_);
//   };
//
// The API is absl::Mutex's (Lock, Unlock, MutexLock, CondVar::Wait,
// WaitWithTimeout, WaitWithDeadline, Signal, SignalAll), but underneath
// are the standard types, unchanged: the system's abseil (Debian's
// libabsl 20220623) is built without NDEBUG and without ThreadSanitizer,
// so its absl::Mutex checks lock-order cycles on every acquisition (about
// 60 ns uncontended here against 6.5 ns, and it aborts the process on a
// cycle it has only seen) and is invisible to TSan, which then reports
// every access it guards as a race. This costs what std::mutex costs and
// TSan sees it.
//
// CondVar waits, like absl::CondVar's, may wake spuriously: wait in a loop
// on the condition. Timed waits use std::chrono::steady_clock.
//
// Thread safety: a Mutex, and a CondVar, may be used from any thread.
#ifndef MLFABRIC_COMMON_MUTEX_H_
#define MLFABRIC_COMMON_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace mlfabric {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope; Unlock and Lock release it for a stretch
// (e.g. a call that must not run under it) and take it back.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (held_) mu_->Unlock();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    held_ = false;
    mu_->Unlock();
  }
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_->Lock();
    held_ = true;
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
  bool held_ = true;
};

class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases `mu`, waits until signalled (or spuriously woken) and takes
  // `mu` again.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Adopted lock(mu);
    cv_.wait(lock.lock);
  }
  // As Wait, or until `timeout` has passed; true if it timed out.
  template <typename Rep, typename Period>
  bool WaitWithTimeout(Mutex* mu, std::chrono::duration<Rep, Period> timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Adopted lock(mu);
    return cv_.wait_for(lock.lock, timeout) == std::cv_status::timeout;
  }
  // As Wait, or until `deadline`; true if it passed.
  template <typename Duration>
  bool WaitWithDeadline(Mutex* mu,
                        std::chrono::time_point<std::chrono::steady_clock, Duration> deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Adopted lock(mu);
    return cv_.wait_until(lock.lock, deadline) == std::cv_status::timeout;
  }

  // The waits above until `ready()` is true (checked first, and after
  // every wake-up); the timed ones return whether it is. `ready` runs with
  // `mu` held; give a lambda ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) so that
  // clang checks its body as such:
  //   cv_.Await(&mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !items_.empty(); });
  template <typename Predicate>
  void Await(Mutex* mu, Predicate ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Adopted lock(mu);
    cv_.wait(lock.lock, std::move(ready));
  }
  template <typename Rep, typename Period, typename Predicate>
  bool AwaitWithTimeout(Mutex* mu, std::chrono::duration<Rep, Period> timeout, Predicate ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Adopted lock(mu);
    return cv_.wait_for(lock.lock, timeout, std::move(ready));
  }
  template <typename Duration, typename Predicate>
  bool AwaitWithDeadline(Mutex* mu,
                         std::chrono::time_point<std::chrono::steady_clock, Duration> deadline,
                         Predicate ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Adopted lock(mu);
    return cv_.wait_until(lock.lock, deadline, std::move(ready));
  }

  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  // The caller's hold on a Mutex as a std::unique_lock for the wait, given
  // back (still held) when the wait ends.
  struct Adopted {
    explicit Adopted(Mutex* mu) : lock(mu->mu_, std::adopt_lock) {}
    ~Adopted() { lock.release(); }
    std::unique_lock<std::mutex> lock;
  };

  std::condition_variable cv_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_COMMON_MUTEX_H_
