// CommandOutbox: the scheduler's per-host queues of DaemonCommands, drained
// by each daemon's StreamSchedules call (docs/architecture.md §3 step 3).
//
// A host's queue exists from its registration (Open, with the incarnation
// the scheduler handed out) until it is marked down (Close) or registers
// again (Open with a new incarnation, which drops what the old one had not
// read). Commands pushed to a host without an open queue are discarded: a
// host that is down has nothing to carry out, and everything it was part of
// is failed by the cluster state instead.
//
//   outbox.Open("w1", 7);
//   outbox.Push("w1", command);
//   v1::DaemonCommand next;
//   switch (outbox.Pop("w1", 7, std::chrono::milliseconds(100), &next)) { ... }
//
// The scheduler's streams do not wait in Pop: each is a gRPC callback
// (grpc_service.cc) that Watches its host and, when woken, writes what
// TryPop gives it, one write at a time.
//
// Thread safety: every method may be called concurrently. The outbox has its
// own lock, so a stream waiting for commands never holds the service's lock;
// callers may push while holding their own lock (the service's lock is
// always taken first).
#ifndef MLFABRIC_SCHEDULER_SERVICE_COMMAND_OUTBOX_H_
#define MLFABRIC_SCHEDULER_SERVICE_COMMAND_OUTBOX_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "proto/scheduler.pb.h"

namespace mlfabric {

class CommandOutbox {
 public:
  enum class PopResult {
    kCommand,     // *out holds the next command
    kTimeout,     // nothing arrived within the wait; call again
    kSuperseded,  // the host registered again or was closed: end this stream quietly
    kStopped,     // the scheduler is stopping
  };

  // Starts the queue of `host`'s incarnation `incarnation`, discarding
  // anything queued for an earlier one.
  void Open(const std::string& host, uint64_t incarnation);
  // Discards `host`'s queue; its stream ends with kSuperseded.
  void Close(const std::string& host);
  // Appends to `host`'s queue if it is open; otherwise drops the command.
  // The first command of a job for a queue is preceded by a JobKey command
  // with the job's data key, when SetJobKeys knows one.
  void Push(const std::string& host, v1::DaemonCommand command);
  // The data keys by job id (control_auth.h); none by default.
  void SetJobKeys(std::map<uint32_t, std::string> keys);
  // Queues the JobKey of `job` for `host` now, unless it was queued for
  // this incarnation already.
  void EnsureJobKey(const std::string& host, uint32_t job);
  // The priority class of `job`, named `name` (0..7, 0 = most urgent;
  // TensorLights job priority): every open queue gets a JobPriority
  // command when it changes, and a queue opened later gets one for each
  // job first, class 0 too (a daemon registering again with a restarted
  // scheduler may hold a class that scheduler no longer gives). Every host, not only those that carry
  // the job's pushes: a daemon ranks the job's NIC traffic that does not
  // pass through it too (daemon/nicprio/nic_classes.h).
  void SetJobClass(uint32_t job, const std::string& name, int32_t priority_class);
  // Waits up to `wait` for the next command of `host`'s `incarnation`.
  PopResult Pop(const std::string& host, uint64_t incarnation, std::chrono::milliseconds wait,
                v1::DaemonCommand* out);
  // Pop without waiting (kTimeout: nothing is queued now).
  PopResult TryPop(const std::string& host, uint64_t incarnation, v1::DaemonCommand* out);

  // For a stream that does not wait in Pop (the scheduler's streams are
  // gRPC callbacks, not a thread each): `wake` is called whenever Pop would
  // be woken for `host` (a command queued, at the release of a hold; the
  // queue opened again or closed; Stop), always after the outbox's lock is
  // released, so it may call TryPop. Returns a token for Unwatch; after
  // Unwatch returns, `wake` is not called again, though a call already
  // begun may still be running.
  uint64_t Watch(const std::string& host, std::function<void()> wake);
  void Unwatch(const std::string& host, uint64_t token);
  // Calls every watcher once (unless a hold is on: its release wakes what
  // it held). The batch loop does this each cycle, so a stream that missed
  // a wake-up is at most one batch interval late instead of stuck; a
  // watcher with nothing to do returns at once (the thread-per-stream
  // design before it recovered the same way, by waking every 100 ms).
  void WakeWatchers();
  // Ends every Pop with kStopped, now and later.
  void Stop();

  // While a hold is on (HoldWakeups until the matching ReleaseWakeups;
  // holds nest), Push and EnsureJobKey queue without waking the streams,
  // and the release wakes each host that got a command meanwhile. The
  // batch loop holds while it queues a batch's commands: each stream it
  // woke wrote at once, and on a busy machine took the core the rest of
  // the batch was being queued from, so one host's command of a
  // synchronous round went out a millisecond or more after another's.
  void HoldWakeups();
  void ReleaseWakeups();
  class WakeupHold {
   public:
    explicit WakeupHold(CommandOutbox* outbox) : outbox_(outbox) { outbox_->HoldWakeups(); }
    ~WakeupHold() { outbox_->ReleaseWakeups(); }
    WakeupHold(const WakeupHold&) = delete;
    WakeupHold& operator=(const WakeupHold&) = delete;

   private:
    CommandOutbox* const outbox_;
  };

  // Commands waiting for `host` (0 when it has no open queue).
  size_t Queued(const std::string& host) const;

 private:
  struct Queue {
    uint64_t incarnation = 0;
    std::deque<v1::DaemonCommand> commands;
    // Jobs this incarnation was introduced to (sent their JobKey and
    // JobPriority, as far as there were any to send).
    std::set<uint32_t> keyed;
  };
  // Introduces `job` to `queue` (JobKey, JobPriority) unless it was already.
  void KeyLocked(Queue& queue, uint32_t job);
  static v1::DaemonCommand JobPriorityCommand(uint32_t job, const std::string& name,
                                              int32_t priority_class);
  // `host`'s wake-up: one per host name, kept after its queue closes, so a
  // push wakes only the stream it is for (a shared one woke every stream:
  // a thousand daemons' streams took more CPU than the planner,
  // testing/loadgen).
  std::condition_variable& WakeupLocked(const std::string& host);
  // Wakes `host`'s stream now, or at the release of the hold that is on;
  // its watchers' calls are added to *wake, for the caller to make once
  // the lock is released.
  void NotifyLocked(const std::string& host, std::vector<std::function<void()>>* wake);
  // Wakes `host`'s stream now (Pop and watchers alike).
  void WakeLocked(const std::string& host, std::vector<std::function<void()>>* wake);
  static void Call(const std::vector<std::function<void()>>& wake);

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<std::condition_variable>> wakeups_;
  std::map<std::string, Queue> queues_;
  std::map<uint32_t, std::string> job_keys_;
  struct JobClass {
    std::string name;
    int32_t priority_class = 0;
  };
  std::map<uint32_t, JobClass> job_classes_;  // every job SetJobClass named
  std::map<std::string, std::map<uint64_t, std::function<void()>>> watchers_;
  uint64_t next_watch_ = 1;
  bool stopped_ = false;
  int holds_ = 0;
  std::set<std::string> held_wakeups_;  // hosts to wake when the holds end
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_COMMAND_OUTBOX_H_
