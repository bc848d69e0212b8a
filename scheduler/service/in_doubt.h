// Pushes in flight when a scheduler died: a restarted
// scheduler ends each exactly once, from what the daemons tell it as they
// register again.
//
//   AcceptHostReport(&state, register_host_request);   // RegisterHost
//   AcceptLateCompletion(&state, completion_report);   // a push it never planned
//   ResolveInDoubt(&state, config.in_doubt_wait_s);    // each batch cycle
//
// When its schedule stream breaks, a daemon keeps the pushes it submitted
// and has no outcome for ("in doubt"), and, as a server's host, cancels
// every delivery it has not handed to an application yet: nothing of the
// lost scheduler's plans is applied from then on, except what an
// application already holds. When it registers again it reports both: its
// pushes in doubt, and the pushes its servers applied lately (or were
// handed and have not acknowledged; daemon/engine/applied_log.h). A push
// in doubt then ends:
//
// - applied (with the version it got), if a server's daemon logged it
//   applied, now or in a later completion report;
// - failed, when its server's host has registered with this scheduler and
//   neither applied it nor holds it: the server's daemon had cancelled its
//   delivery, so it can never be applied;
// - failed, after wait_s, when its server's host does not come back (its
//   model is gone with it, or it is cut off; a host that returns later and
//   names the push applied is logged as a broken promise);
// - as before, when this scheduler is the one that ended it (its stream
//   broke, the scheduler lived: the outcome it sent was lost with the
//   stream; RecentOutcome).
//
// A replica's daemon also keeps the replica copies it held for their
// pushes' outcomes (their bytes all in) and names them when it registers:
// each is announced again at the replica's next position once its push is
// known applied (by the same rules), and dropped there once it is known
// not applied, so the replica holds exactly what its server applied.
//
// Sources hold the bytes of pushes whose replica copies were punted to a
// later batch (§5.3) and name them when they register; a push in doubt
// that turns out applied is held the same way (its copy may have been
// punted too, or lost on its way). Each is copied to the replica again
// once the replica is registered, unless the replica's daemon reported it
// applied (RegisterHostRequest.replica_applied) or kept its copy; then the
// source lets it go. A copy that was still arriving at the replica is sent
// again from its source instead of being counted missed.
//
// Thread safety: none; called under the scheduler service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_IN_DOUBT_H_
#define MLFABRIC_SCHEDULER_SERVICE_IN_DOUBT_H_

#include <cstdint>
#include <string>

#include "proto/scheduler.pb.h"
#include "scheduler/service/cluster_state.h"

namespace mlfabric {

// A registering host's pushes in doubt and its servers' applied log.
void AcceptHostReport(ClusterState* state, const v1::RegisterHostRequest& request);
// A completion report for a delivery this scheduler did not plan: its
// pushes (report.pushes(), else the transfer id) are recorded as applied
// or not. False if none of them is in doubt or being delivered.
bool AcceptLateCompletion(ClusterState* state, const v1::CompletionReport& report);
// Ends every push in doubt that can be ended now (see the banner).
void ResolveInDoubt(ClusterState* state, double wait_s);
// Tells shard `shard` of `job` on `host` to pass group position
// `position` (a placeholder announced, then cancelled with `reason`): a
// group part kept across the restart took that position at another shard.
void SkipGroupPosition(ClusterState* state, const JobState& job, const std::string& host,
                       const std::string& shard, uint64_t position, const std::string& reason);

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_IN_DOUBT_H_
