// A hot-standby replica that registers while its server already holds a
// model (mid-training, or after a failover) starts from that model: the
// scheduler has the server's daemon take a snapshot of it at a cut in the
// server's commit order and send it to the replica, ahead of the copies
// of every update after the cut (mlfabric.md §5.3).
//
//   RegisterEntity(ROLE_REPLICA, installs_snapshots) -> WantReplicaSnapshot
//   RegisterEntity(ROLE_SERVER) -> WantReplicaSnapshot   // a replica there first
//   SendReplicaSnapshots(&state);        // each batch cycle, before any cut
//   ReplicaSnapshotEnded(&state, id, applied, version, error);   // its report
//
// The cut is the last position assigned to the server so far: every batch
// cut from now on plans replica copies, and no batch is being planned
// while the cycle starts, so positions up to the cut carry no copy and
// every later one does. Copies of updates up to the cut that were punted
// for an earlier replica (and would otherwise follow now) are dropped. The server's daemon asks its application for the
// snapshot once it handed every position up to the cut over, before the
// next one (SnapshotToReplica); the replica's daemon hands the snapshot
// over at the replica's next position, before the copies. A replica is
// not promoted (failover.h) until it reported the snapshot installed; a
// snapshot that fails is sent again, at a new cut.
//
// Thread safety: none; called under the scheduler service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_REPLICA_SYNC_H_
#define MLFABRIC_SCHEDULER_SERVICE_REPLICA_SYNC_H_

#include <cstdint>
#include <string>

#include "scheduler/service/cluster_state.h"

namespace mlfabric {

// The replica of `server_name` registered (`replica_registered`), or the
// server did while a replica that installs snapshots was there already (a
// standby started before its server, or either of them registering again
// with a restarted scheduler): a snapshot is wanted, unless one is on its
// way already (the server registering again). A replica registering
// forgets the snapshot of the one before it. True if one is wanted.
bool WantReplicaSnapshot(ClusterState* state, JobState* job, const std::string& server_name,
                         bool replica_registered);

// Sends the snapshots wanted, where server and replica hosts are up.
void SendReplicaSnapshots(ClusterState* state);

// A report for transfer `transfer_id`: true if it was a replica snapshot
// (then handled: the replica synced, or the snapshot is wanted again).
bool ReplicaSnapshotEnded(ClusterState* state, uint64_t transfer_id, bool applied,
                          int64_t model_version, const std::string& error);

// The replica of `server` left, or was promoted: forgets its snapshot.
void ForgetReplicaSnapshot(ClusterState* state, ServerState* server);

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_REPLICA_SYNC_H_
