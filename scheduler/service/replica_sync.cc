#include "scheduler/service/replica_sync.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "scheduler/service/commands.h"

namespace mlfabric {

bool WantReplicaSnapshot(ClusterState* state, JobState* job, const std::string& server_name,
                         bool replica_registered) {
  auto server = job->servers.find(server_name);
  if (server == job->servers.end() || !server->second.shards.empty()) return false;
  if (!job->replica_hosts.count(server_name)) return false;
  ReplicaTrack& replica = server->second.replica;
  if (replica_registered) {
    ForgetReplicaSnapshot(state, &server->second);
  } else if (replica.snapshot_id != 0 || replica.snapshot_wanted) {
    return false;
  }
  if (!job->snapshot_replicas.count(server_name)) return false;
  replica.snapshot_wanted = true;
  replica.synced = false;
  return true;
}

namespace {

// SendReplicaSnapshots for one server: its replica's snapshot, if one is
// wanted and both hosts are up.
void SendReplicaSnapshot(ClusterState* state, const std::string& job_name, const JobState& job,
                         const std::string& server_name, ServerState& server) {
  ReplicaTrack& replica = server.replica;
  if (!replica.snapshot_wanted) return;
  auto replica_host = job.replica_hosts.find(server_name);
  if (replica_host == job.replica_hosts.end()) {
    replica.snapshot_wanted = false;  // it left
    return;
  }
  const HostState* to = state->AliveHost(replica_host->second);
  if (to == nullptr || state->AliveHost(server.host) == nullptr) return;  // later
  const uint64_t id = state->NewTransferId();
  const uint64_t cut = server.next_sequence - 1;
  // Every update up to the cut is in the snapshot, so no copy of one
  // may follow it: punted copies are dropped (their sources free the
  // bytes), pushes still in flight with a punted copy will not keep
  // theirs, and copies held at sources across a scheduler restart are
  // released. (A copy of such an update sent after the snapshot would
  // be applied twice: found by the fault driver's second failover, a
  // push punted for the old replica that applied after the promotion.)
  const std::string why = "in the snapshot the new replica starts from";
  state->DropReplicaPending(&server, why);
  state->ForEachPush([&](UpdateRecord& record) {
    if (record.job == job_name && record.server == server_name) record.replica_punted = false;
  });
  state->restart().EraseHeldAtSourceIf([&](uint64_t push, const HeldAtSource& held) {
    if (held.job != job_name || held.server != server_name) return false;
    state->Enqueue(held.copy.src_host, commands::ReleaseHold(push, why));
    return true;
  });
  v1::DaemonCommand take;
  v1::SnapshotToReplica* snapshot = take.mutable_snapshot();
  snapshot->set_transfer_id(id);
  snapshot->set_job_id(job.id);
  snapshot->set_server(server_name);
  snapshot->set_after_sequence(cut);
  snapshot->set_dst_host(replica_host->second);
  snapshot->set_dst_address(to->data_address);
  v1::DaemonCommand expect;
  v1::ExpectDelivery* delivery = expect.mutable_expect();
  delivery->set_transfer_id(id);
  delivery->set_job_id(job.id);
  delivery->set_server("replica:" + server_name);
  replica.snapshot_sequence = replica.next_sequence++;
  delivery->set_sequence(replica.snapshot_sequence);
  delivery->set_src_host(server.host);
  delivery->set_worker("snapshot of " + server_name);
  delivery->set_snapshot(true);
  state->Enqueue(replica_host->second, std::move(expect));
  state->Enqueue(server.host, std::move(take));
  state->replicas().AddSnapshot(id, {job_name, server_name});
  replica.snapshot_wanted = false;
  replica.snapshot_id = id;
  MLF_LOG(INFO) << "job " << job_name << ": snapshot " << id << " of server " << server_name
                << " on " << server.host << " (after position " << cut
                << ") for its new replica on " << replica_host->second;
}

}  // namespace

void SendReplicaSnapshots(ClusterState* state) {
  state->ForEachServer([state](const std::string& job_name, JobState& job,
                               const std::string& server_name, ServerState& server) {
    SendReplicaSnapshot(state, job_name, job, server_name, server);
  });
}

bool ReplicaSnapshotEnded(ClusterState* state, uint64_t transfer_id, bool applied,
                          int64_t model_version, const std::string& error) {
  std::optional<ReplicaSnapshot> snapshot = state->replicas().TakeSnapshot(transfer_id);
  if (!snapshot) return false;
  const auto [job_name, server_name] = *snapshot;
  JobState* job = state->FindJob(job_name);
  if (job == nullptr) return true;
  auto server = job->servers.find(server_name);
  if (server == job->servers.end() || server->second.replica.snapshot_id != transfer_id) {
    return true;  // the replica left or was promoted meanwhile
  }
  ReplicaTrack& replica = server->second.replica;
  replica.snapshot_id = 0;
  if (applied) {
    replica.synced = true;
    MLF_LOG(INFO) << "job " << job_name << ": the replica of server " << server_name
                  << " installed its snapshot (version " << model_version << "): in sync";
    return true;
  }
  // Sent again at a new cut; the copies before it are overwritten then.
  replica.snapshot_wanted = true;
  MLF_LOG(WARNING) << "job " << job_name << ": the snapshot of server " << server_name
                   << " for its replica failed (" << error << "); taking another";
  if (auto host = job->replica_hosts.find(server_name); host != job->replica_hosts.end()) {
    // Its position at the replica is skipped, so the copies behind it go on.
    state->Enqueue(host->second,
                   commands::CancelDelivery(transfer_id, "replica:" + server_name,
                                            replica.snapshot_sequence,
                                            "its snapshot failed: " + error));
  }
  return true;
}

void ForgetReplicaSnapshot(ClusterState* state, ServerState* server) {
  if (server->replica.snapshot_id != 0) {
    state->replicas().TakeSnapshot(server->replica.snapshot_id);  // no longer awaited
  }
  server->replica.snapshot_id = 0;
  server->replica.snapshot_wanted = false;
  server->replica.synced = true;
}

}  // namespace mlfabric
