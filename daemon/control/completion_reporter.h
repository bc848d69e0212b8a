// CompletionReporter: sends CompletionReports (failures, group parts ready,
// a server's applied updates) to the scheduler from one thread of its own,
// so that the daemon's parts can report while holding their locks and
// however many reports come at once (a failed round fails all its members;
// a shard of a server group reports a part ready and applied for every
// push to its group) — no RPC is ever made under a lock, no thread is
// spawned per report, and no report waits for the round trip of each one
// before it.
//
//   CompletionReporter reporter(&client, "w1");
//   reporter.ReportFailure(transfer_id, "connection reset");   // returns at once
//   reporter.Stop();   // sends what is queued, then ends
//
// Reports go out in the order they were queued, all those queued by the
// time the last call returned in one call (ReportCompletions). A NotFound
// answer (the transfer ended already) is expected and not logged.
// Thread safety: ReportFailure from any thread; Stop once, from the owner.
#ifndef MLFABRIC_DAEMON_CONTROL_COMPLETION_REPORTER_H_
#define MLFABRIC_DAEMON_CONTROL_COMPLETION_REPORTER_H_

#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "daemon/control/scheduler_client.h"

namespace mlfabric::daemon {

class CompletionReporter {
 public:
  CompletionReporter(SchedulerClient* client, std::string host);
  ~CompletionReporter();
  CompletionReporter(const CompletionReporter&) = delete;
  CompletionReporter& operator=(const CompletionReporter&) = delete;

  void ReportFailure(uint64_t transfer_id, const std::string& error);
  // The held part `transfer_id` of a group push has all its bytes here
  // (CompletionReport.part_ready), queued like a failure.
  void ReportPartReady(uint64_t transfer_id);
  // Queues `report` (its host is this reporter's): a server's applied
  // update, or its refusal.
  void Report(v1::CompletionReport report);
  // Sends a report now, on the caller's thread (rounds, whose next
  // submissions must not overtake it, and acknowledgements told again
  // after a registration).
  void ReportNow(const v1::CompletionReport& report);
  // No report is queued after this; those queued are sent (in one call:
  // a server's applied updates are not lost to a shutdown).
  void Stop();

 private:
  void Queue(v1::CompletionReport report);
  void Loop();

  SchedulerClient* const client_;
  const std::string host_;
  Mutex mu_;
  CondVar cv_;
  std::deque<v1::CompletionReport> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_CONTROL_COMPLETION_REPORTER_H_
