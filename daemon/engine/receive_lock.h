// ReceiveLock: the one lock of the daemon's receive side (docs/architecture.md §5).
//
// A data packet's arrival touches the transfers being received
// (IncomingTransfers), a synchronous round (RoundService), an in-network
// aggregate (NetworkAggregation) and the commit order of the server it is
// for (Deliveries) in one step: a transfer summed into a round must not be
// cancelled, recycled or delivered in between. So those parts keep their
// own tables but share this lock. The engine tables they use (RoundTable,
// AggregationTable, DeliverySequencer, ...) have leaf locks of their own,
// taken under this one, never the other way round. Nothing holds it across
// an RPC or a blocking socket write.
//
// Clang checks it (tools/thread_safety_check): the parts' shared state is
// ABSL_GUARDED_BY(receive_side) and their `...Locked` methods are
// ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side), where `receive_side` is the
// name the analysis knows every ReceiveLock by:
//
//   class Part {
//    public:
//     void Entry() ABSL_LOCKS_EXCLUDED(receive_side) {
//       ReceiveLock::Hold hold(lock_);
//       while (table_.empty()) lock_->Wait();
//       UseLocked();
//     }
//    private:
//     void UseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
//     ReceiveLock* const lock_;
//     std::map<uint64_t, Thing> table_ ABSL_GUARDED_BY(receive_side);
//   };
//
// Every part of a daemon is handed the same ReceiveLock, but each part
// stores its own pointer to it, and clang cannot tell that `a.lock_->mu`
// and `b.lock_->mu` are one mutex. So the analysis treats all ReceiveLocks
// as one capability, `receive_side`. That is sound as long as no thread
// ever holds two ReceiveLocks at once, which nothing does: a process runs
// one daemon's receive side per thread (tests that run several daemons in
// one process never nest their locks).
//
// The lock also carries one condition variable, signalled (NotifyAll)
// whenever what a waiter under the lock may wait for changes: a server
// application connecting or leaving, a round beginning or failing, a data
// session or a get ending, the daemon stopping. Waits may wake spuriously:
// wait in a loop on the condition.
//
// Thread safety: any method from any thread.
#ifndef MLFABRIC_DAEMON_RECEIVE_RECEIVE_LOCK_H_
#define MLFABRIC_DAEMON_RECEIVE_RECEIVE_LOCK_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace mlfabric::daemon {

// The capability every ReceiveLock is to clang's analysis (above). It
// holds nothing; it is never locked itself.
class ABSL_LOCKABLE ReceiveSide {};
inline ReceiveSide receive_side;

class ReceiveLock {
 public:
  ReceiveLock() = default;
  ReceiveLock(const ReceiveLock&) = delete;
  ReceiveLock& operator=(const ReceiveLock&) = delete;

  // (Not analysed inside: they take mu_, which the analysis knows as
  // receive_side.)
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION(receive_side) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    mu_.lock();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION(receive_side) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    mu_.unlock();
  }

  // Releases the lock, waits for NotifyAll (or a spurious wake-up) and
  // takes it again.
  void Wait() ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side) {
    Adopted lock(&mu_);
    cv_.wait(lock.lock);
  }
  // As Wait, or until `deadline`; true if the deadline has passed.
  template <typename Clock, typename Duration>
  bool WaitUntil(std::chrono::time_point<Clock, Duration> deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side) {
    Adopted lock(&mu_);
    return cv_.wait_until(lock.lock, deadline) == std::cv_status::timeout;
  }
  void NotifyAll() { cv_.notify_all(); }

  // Holds a ReceiveLock for its scope; Unlock/Lock release it for a
  // stretch (e.g. a socket write) and take it back.
  class ABSL_SCOPED_LOCKABLE Hold {
   public:
    explicit Hold(ReceiveLock* lock) ABSL_EXCLUSIVE_LOCK_FUNCTION(receive_side) : lock_(lock) {
      lock_->Lock();
    }
    ~Hold() ABSL_UNLOCK_FUNCTION() {
      if (held_) lock_->Unlock();
    }
    void Unlock() ABSL_UNLOCK_FUNCTION() {
      held_ = false;
      lock_->Unlock();
    }
    void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
      lock_->Lock();
      held_ = true;
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    ReceiveLock* const lock_;
    bool held_ = true;
  };

 private:
  // The caller's hold as a std::unique_lock for the wait, given back
  // (still held) when the wait ends.
  struct Adopted {
    explicit Adopted(std::mutex* mu) : lock(*mu, std::adopt_lock) {}
    ~Adopted() { lock.release(); }
    std::unique_lock<std::mutex> lock;
  };

  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_RECEIVE_RECEIVE_LOCK_H_
