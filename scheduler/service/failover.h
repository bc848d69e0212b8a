// Server failover (mlfabric.md §3.3, §5.3): when a server's host goes down
// or its application leaves, its hot-standby replica becomes the server.
//
//   FailOverServersOn(&state, "s1", "daemon disconnected");  // before MarkHostDown
//   PromoteReplica(&state, "job", "ps", "server application left");
//
// What happens to the updates of the moment, each ending exactly once:
// - Pushes waiting for a batch stay; the next batch plans them to the new
//   host.
// - Pushes in flight to the old server end by what the replica holds,
//   since the replica's model is the one served from now on: applied if
//   the replica applied their copy (copies may overtake the server's
//   transfer), decided by their copy if one is still moving
//   (ReplicaLedger::AddDecidedByCopy), failed otherwise. They are not
//   re-sent to the new server: the old one may have applied them before it
//   went, and its report may be lost, so a re-sent copy could be applied
//   twice in the workers' accounting; failing them is exact.
// - Updates the old server applied whose copies had not reached the
//   replica: copies still moving arrive at the promoted endpoint (the
//   daemon moves the replica's commit positions), and punted ones are sent
//   to it now from their sources, which still hold the bytes. Only those
//   whose source is gone too are lost; FailoverView counts them and bounds
//   their norm.
// - Synchronous rounds and in-network aggregates bound for the old server
//   fail (their partial sums were there).
//
// The model version continues from the old server's (PromoteReplica
// command), so workers never see it go back.
//
// Thread safety: none; called under the scheduler service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_FAILOVER_H_
#define MLFABRIC_SCHEDULER_SERVICE_FAILOVER_H_

#include <string>

#include "scheduler/service/cluster_state.h"

namespace mlfabric {

// Promotes `server`'s replica if it has one on a live host (other than the
// server's): false, changing nothing, otherwise. `reason` says why the
// server is gone; it is in every outcome and log line the failover makes.
bool PromoteReplica(ClusterState* state, const std::string& job, const std::string& server,
                    const std::string& reason);

// Promotes the replica of every server on `host` (going down); returns how
// many. Call it before ClusterState::MarkHostDown(host), which then fails
// only what no replica can take over.
int FailOverServersOn(ClusterState* state, const std::string& host, const std::string& reason);

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_FAILOVER_H_
