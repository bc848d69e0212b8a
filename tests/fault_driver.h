// The fault-injection driver: trains a job across real
// processes while a scripted sequence of faults hits it, and accounts for
// every push.
//
// The cluster: hosts in network namespaces (launch/cluster.h, kNetns):
// ps0 on s1 with its hot-standby replica on r1, ps1 on s2 with its replica
// on r2, an aggregator host a1, and three workers w1..w3 whose daemons also
// forward the model to each other (distribution trees). The servers and
// replicas are applications in this process; the workers are threads here
// that get and push integer-valued updates to ps0 and ps1 in turn.
//
// The faults, in script order (cycles of the repeatable ones, then the two
// that cannot be undone, then the last cycle's scheduler restart):
//   aggregator    a1's daemon killed (SIGKILL), started again 1 s later
//   worker        w1's daemon killed while w1 pushes and gets (it forwards
//                 to others), started again; w1 connects again, learns how
//                 its push in flight ended, and goes on
//   link          w3's link cut in its namespace until the scheduler marks
//                 w3 down, then restored
//   scheduler     the scheduler killed and started again on its port
//   replica       r2's daemon killed (ps1 trains on without a standby)
//   server        s1's daemon killed: r1 becomes ps0 (failover)
//   server        s1's daemon started again with a new standby of ps0 that
//                 starts from a snapshot of r1's model; once in sync, r1's
//                 daemon killed: the standby becomes ps0 (a second failover)
//   scheduler     (the last cycle's restart)
//
// After each fault: training resumes (the recovery time is the fault, or
// a cut link's restoring, to the first push submitted after it that
// applies, at each server concerned), then every worker pauses and each
// server's model is compared with what the workers were told: exactly the
// initial model (0) plus the sum of the pushes reported applied. Every update has a one-hot
// part (coordinate id mod kSlots), so a mismatch is counted as lost
// (reported applied, not in the model) or extra (in the model more often
// than reported applied: applied twice, or after being reported failed).
//
// Known gaps, hence the order and the divergence bound: across a scheduler
// restart the replica's daemon keeps the copies it holds whole (a copy
// waits there for its push's outcome) and the new scheduler has them
// delivered or dropped (scheduler/service/in_doubt.h), but a copy still
// arriving at that moment is lost (counted against the replica, and by a
// later failover as lost), and copies punted to a later batch are not sent
// again (the job's divergence_max of 2, each push's norm being 1, keeps
// the planner from punting). The test restarts the scheduler after the
// failover; the benchmark's earlier cycles restart it before and would
// show such a loss.
//
// w1's daemon dies while w1 pushes: the push in flight then ends with the
// outcome the scheduler decided (applied if its bytes had reached the
// server, failed if the daemon died before sending them), which w1's
// Worker asks for through the daemon that replaces the dead one
// (ClientOptions::reconnect_s, LocalOutcomeQuery). Before, w1's pushes
// were paused for this fault: the application reported the push failed
// although the server might have applied it.
#ifndef MLFABRIC_TESTS_FAULT_DRIVER_H_
#define MLFABRIC_TESTS_FAULT_DRIVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mlfabric::testing {

struct FaultRunOptions {
  // Cycles of the repeatable faults (aggregator, worker, link, scheduler);
  // the replica and the server are killed before the last cycle's
  // scheduler restart, and the second failover (to a standby started from
  // a snapshot): 4 * cycles + 3 faults.
  int cycles = 1;
  // One line per fault on stdout as the run goes.
  bool progress = true;
};

struct FaultRecord {
  std::string kind;         // "aggregator", "worker", "link", ...
  std::string description;  // what was done
  bool recovered = false;   // training resumed within 60 s
  // The fault (a kill; for a cut link, its restoring) to the first push
  // submitted after the fault began that applied, at each server concerned.
  double recovery_s = 0;
  // The same to every worker's first push after the fault applied.
  double all_back_s = 0;
  // "link" only: the cut to the scheduler's "host w3 is down" (-1: not seen).
  double detected_s = -1;
  // The model check that followed: both models exact.
  bool exact = false;
  int64_t lost = 0;
  int64_t extra = 0;
  std::string culprits;  // the disagreeing pushes, if any: what their workers were told
};

struct FaultReport {
  std::vector<FaultRecord> faults;
  int64_t pushes = 0;  // submitted
  int64_t outcomes = 0;  // results returned (each push exactly one)
  int64_t applied = 0, dropped = 0, failed = 0;
  int64_t failed_without_reason = 0;
  int64_t gets = 0, get_errors = 0;
  int64_t lost = 0, extra = 0;  // at the final check
  std::string culprits;  // the final check's disagreeing pushes, if any
  bool final_exact = false;
  // Every worker had pushes applied after the last fault.
  bool finished = false;
  double seconds = 0;
  std::vector<std::string> reasons;  // distinct reasons pushes did not apply, with counts
};

// Runs the script. Errors: the cluster could not be built or started
// (kFailedPrecondition when namespaces cannot be used here: the caller
// skips), an application could not register.
absl::StatusOr<FaultReport> RunFaultScript(const FaultRunOptions& options);

}  // namespace mlfabric::testing

#endif  // MLFABRIC_TESTS_FAULT_DRIVER_H_
