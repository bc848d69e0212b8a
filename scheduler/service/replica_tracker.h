// The hot-standby replica's side of a batch (§5.3): what the planner needs
// to keep the replica within its divergence bound — the bound, momentum,
// the norms of copies still in flight (the lead) and the copies punted from
// earlier batches whose sources still hold their bytes. The copies
// themselves are dispatched by PlanDispatcher; failures are handled by
// ClusterState (CancelReplicaCopy, DropReplicaPending).
//
//   if (auto spec = ReplicaSpecFor(&state, job, name, server)) inputs.replica = *spec;
//
// Thread safety: none; called under the scheduler service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_REPLICA_TRACKER_H_
#define MLFABRIC_SCHEDULER_SERVICE_REPLICA_TRACKER_H_

#include <optional>
#include <string>
#include <vector>

#include "scheduler/core/types.h"
#include "scheduler/service/cluster_state.h"

namespace mlfabric {

// The sum of the norms of `job`'s updates to `server` that one of the two
// models may hold without the other for the whole of the next batch, since
// no copy of theirs can be in its replica stream: copies punted while the
// server's outcome has not come (the server may apply the update at any
// moment; the replica gets it only once it is applied, in a later batch),
// and copies the replica applied before the server did.
double OutstandingNorm(const ClusterState& state, const std::string& job,
                       const std::string& server);

// The scheduler's estimate of ‖w_s − w_r‖ for `server` and its replica:
// the norms of every update one of the two models may hold without the
// other (copies in flight or punted, OutstandingNorm's), weighted by
// 1 / (1 - momentum) (with momentum an update's effect on the model grows
// up to that). Exported as divergence_estimate; what the strict bound
// counts.
double DivergenceEstimate(const ClusterState& state, const JobState& job,
                          const std::string& server_name, const ServerState& server);

// replica_bound "strict" (scheduler_config.h): how many of `server`'s
// pending pushes, a prefix in arrival order, may be planned now so that
// DivergenceEstimate plus the admitted pushes' norms (weighted alike)
// stays within the divergence bound whatever the links deliver: a copy
// stops counting only when the replica reported it applied. At least one when
// nothing is outstanding (a push larger than the bound alone still moves).
// All of them when the server has no bound or no live replica on another
// host. The pushes not admitted wait for a later batch (their delay bound
// still applies).
size_t StrictReplicaAdmits(const ClusterState& state, const JobState& job,
                           const std::string& server_name, const ServerState& server);

// The replica spec for `server`'s next batch, or nullopt when it has no
// replica (or the replica is on the server's own host). Punted copies whose
// source is gone are forgotten; when the replica's host is down they are all
// released (their sources free the bytes). The batch is planned within what
// the divergence bound leaves after OutstandingNorm (|a + b| <= |a| + |b|;
// with momentum gamma an update weighs up to 1 / (1 - gamma)), so the bound
// holds for the models, not only for the batch.
std::optional<core::ReplicaSpec> ReplicaSpecFor(ClusterState* state, const JobState& job,
                                                const std::string& server_name,
                                                ServerState* server);

// §5.3 with the replica's own aggregators: lets the copies of `spec` be
// summed at `aggregators` on their way, when they can be summed (one size,
// one floating-point type, as the aggregators' kernels need): the punted
// ones (`server`'s replica.pending) and, unless `pending_only`, those of
// this batch's pushes (`server`'s pending; ReplicaSpec::
// aggregate_pending_only).
void AllowReplicaAggregation(const ClusterState& state, const ServerState& server,
                             const std::vector<std::string>& aggregators, bool pending_only,
                             core::ReplicaSpec* spec);

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_REPLICA_TRACKER_H_
