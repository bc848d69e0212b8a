#include "scheduler/service/failover.h"

#include "scheduler/service/replica_sync.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "scheduler/service/commands.h"

namespace mlfabric {
namespace {

bool OfServer(const UpdateRecord& record, const std::string& job, const std::string& server) {
  return record.job == job && record.server == server;
}

// Sends a copy of `pending` (applied at the old server, held by its source)
// to the promoted replica as its next delivery, at the source's uplink or
// the replica's downlink rate, whichever is lower, from now on. False when
// the source is gone: the update is lost.
bool SendCatchUpCopy(ClusterState* state, const JobState& job, const std::string& server_name,
                     ServerState* server, const PendingReplica& pending) {
  const HostState* src = state->AliveHost(pending.src_host);
  const HostState* dst = state->AliveHost(server->host);
  if (src == nullptr || dst == nullptr) return false;
  const uint64_t copy = state->NewTransferId();
  ReplicaCopy record{job.config.name, server_name, pending.id, pending.src_host, server->host,
                     server->next_sequence++};
  record.failover = true;
  record.to_promoted = true;
  ReplicaCopy& recorded = state->replicas().AddCopy(copy, record);
  server->replica.in_flight[copy] = pending.norm;

  commands::Expect expect;
  expect.transfer_id = copy;
  expect.job_id = job.id;
  expect.server = server_name;
  expect.sequence = record.sequence;
  expect.bytes = pending.bytes;
  expect.src_host = pending.src_host;
  expect.worker = pending.worker;
  expect.version = pending.version;
  expect.norm = pending.norm;
  state->Enqueue(server->host, commands::ExpectDelivery(expect));
  const double now_s = state->NowSeconds();
  const double rate_bps = std::max(1.0, std::min(src->uplink_bps, dst->downlink_bps));
  const double end_s = now_s + static_cast<double>(pending.bytes) * 8.0 / rate_bps;
  recorded.legs = {{pending.src_host, server->host, {{now_s, end_s, rate_bps}}}};
  commands::Send send{copy, job.id, server->host, dst->data_address, now_s, pending.bytes};
  send.source_transfer_id = pending.id;
  state->Enqueue(pending.src_host, commands::SendTransfer(send, {{now_s, end_s, rate_bps}}));
  return true;
}

// PromoteReplica step 1: pushes in flight to the old server. Those the
// replica holds are applied; those whose copy (or aggregate) is still
// moving wait for it (ReplicaLedger::AddDecidedByCopy).
void SettleInFlightByReplica(ClusterState* state, const std::string& job_name,
                             const std::string& server_name, const ServerState& server,
                             FailoverView* view) {
  std::map<uint64_t, uint64_t> copy_of;  // push -> its copy (or aggregate) still moving
  state->replicas().ForEachCopy([&](uint64_t copy_id, const ReplicaCopy& copy) {
    if (copy.job != job_name || copy.server != server_name) return;
    if (copy.constituents.empty()) copy_of[copy.source] = copy_id;
    for (uint64_t member : copy.unsettled) copy_of[member] = copy_id;
  });
  std::vector<uint64_t> held, decided;
  for (const auto& [id, record] : state->pushes()) {
    if (!OfServer(record, job_name, server_name) || record.state != UpdateState::kInFlight) {
      continue;
    }
    if (record.replica_ahead) {
      held.push_back(id);
    } else if (copy_of.count(id)) {
      decided.push_back(id);
    }
  }
  for (uint64_t id : held) {
    // In the replica's model: applied, as of the last version known.
    state->Complete(id, v1::OUTCOME_APPLIED, "", server.model_version);
    ++view->in_flight_applied;
  }
  for (uint64_t id : decided) {
    UpdateRecord record = *state->TakePush(id);
    // Nothing at either daemon waits for it as the server's delivery now.
    record.sequence = 0;
    record.aggregate_id = 0;
    record.round_member = false;
    record.replica_punted = false;
    record.failure_pending.clear();
    state->replicas().AddDecidedByCopy(copy_of[id], std::move(record));
    ++view->in_flight_awaiting;
  }
}

// PromoteReplica step 2: partial sums at the old server's daemon are gone
// with it (its open rounds and aggregates fail).
void FailPartialSums(ClusterState* state, const std::string& job_name,
                     const std::string& server_name, const ServerState& server,
                     const std::string& why) {
  std::vector<int64_t> rounds;
  for (const auto& [round, round_state] : server.rounds) {
    if (round_state.failed.empty()) rounds.push_back(round);
  }
  for (int64_t round : rounds) state->FailRound(job_name, server_name, round, why);
  const std::vector<uint64_t> aggregates =
      state->aggregates().Select([&](const AggregateRecord& aggregate) {
        return aggregate.job == job_name && aggregate.server == server_name;
      });
  for (uint64_t id : aggregates) state->FailAggregate(id, why);
}

// PromoteReplica step 3: the rest of the in-flight pushes are not in the
// model served from now on.
void FailLostInFlight(ClusterState* state, const std::string& job_name,
                      const std::string& server_name, const std::string& why,
                      FailoverView* view) {
  std::vector<uint64_t> lost_in_flight;
  for (const auto& [id, record] : state->pushes()) {
    if (OfServer(record, job_name, server_name) && record.state == UpdateState::kInFlight) {
      lost_in_flight.push_back(id);
    }
  }
  view->in_flight_failed = static_cast<int64_t>(lost_in_flight.size());
  for (uint64_t id : lost_in_flight) {
    state->Complete(id, v1::OUTCOME_FAILED,
                    absl::StrCat(why, ": the push was in flight to ", view->from_host,
                                 ", which may have applied it before it went, and ", view->to_host,
                                 " never received it, so it is not in the model served from now "
                                 "on; push it again"),
                    0);
  }
}

// PromoteReplica step 4: the replica is the server. Its daemon's commit
// positions continue where the replica's stream left them.
void MakeReplicaTheServer(ClusterState* state, JobState* job, const std::string& job_name,
                          const std::string& server_name, ServerState* server,
                          const std::string& from, const std::string& to, const std::string& why) {
  server->host = to;
  server->next_sequence = server->replica.next_sequence;
  // A replica that registers for the promoted server later is a new
  // stream: its daemon numbers from 1. (Copies still moving stay tracked
  // by id in replica.in_flight until they end.)
  server->replica.next_sequence = 1;
  ForgetReplicaSnapshot(state, server);
  server->replica.applied = 0;
  server->replica.missed = 0;
  server->replica.missed_norm = 0;
  job->replica_hosts.erase(server_name);
  state->replicas().ForEachCopy([&](uint64_t /*copy_id*/, ReplicaCopy& copy) {
    if (copy.job == job_name && copy.server == server_name) copy.failover = true;
  });
  state->Enqueue(to, commands::PromoteReplica(job->id, server_name, from, why,
                                              server->model_version));
  // The copies held at the replica for pushes still undecided (step 1) may
  // be applied now: they decide their pushes. Those of failed pushes were
  // cancelled there above, before this.
  state->replicas().ForEachCopy([&](uint64_t copy_id, ReplicaCopy& copy) {
    if (copy.job != job_name || copy.server != server_name || !copy.held) return;
    copy.held = false;
    state->Enqueue(to, commands::ReleaseDelivery(copy_id, copy.sequence));
  });
}

// PromoteReplica step 5: applied at the old server, punted from the
// replica's stream: their sources still hold the bytes, so the new server
// gets them now.
void SendCatchUpCopies(ClusterState* state, const JobState& job, const std::string& server_name,
                       ServerState* server, FailoverView* view) {
  std::vector<PendingReplica> punted;
  punted.swap(server->replica.pending);
  for (const PendingReplica& pending : punted) {
    if (SendCatchUpCopy(state, job, server_name, server, pending)) {
      ++view->catch_up_copies;
    } else {
      ++view->lost_updates;
      view->lost_norm += pending.norm;
    }
  }
}

}  // namespace

bool PromoteReplica(ClusterState* state, const std::string& job_name,
                    const std::string& server_name, const std::string& reason) {
  JobState* job = state->FindJob(job_name);
  if (job == nullptr) return false;
  auto server_it = job->servers.find(server_name);
  auto replica_it = job->replica_hosts.find(server_name);
  if (server_it == job->servers.end() || replica_it == job->replica_hosts.end()) return false;
  ServerState& server = server_it->second;
  const std::string to = replica_it->second;
  const std::string from = server.host;
  if (to == from || state->AliveHost(to) == nullptr) return false;
  // A replica still waiting for its snapshot holds only part of the model.
  if (!server_it->second.replica.synced) {
    MLF_LOG(WARNING) << "job " << job_name << ": the replica of server " << server_name << " on "
                     << to << " has not installed its snapshot yet: not promoted";
    return false;
  }

  FailoverView view;
  view.server = server_name;
  view.from_host = from;
  view.to_host = to;
  view.reason = reason;
  view.at_s = state->NowSeconds();
  view.model_version = server.model_version;
  // Updates the replica was known to lack already (in_doubt.h).
  view.lost_updates = server.replica.missed;
  view.lost_norm = server.replica.missed_norm;
  const std::string why = absl::StrCat("server '", server_name, "' failed over from ", from,
                                       " to its replica on ", to, " (", reason, ")");
  SettleInFlightByReplica(state, job_name, server_name, server, &view);
  FailPartialSums(state, job_name, server_name, server, why);
  FailLostInFlight(state, job_name, server_name, why, &view);
  MakeReplicaTheServer(state, job, job_name, server_name, &server, from, to, why);
  SendCatchUpCopies(state, *job, server_name, &server, &view);
  MLF_LOG(WARNING) << "job " << job_name << ": " << why << " at model version "
                   << view.model_version << "; in flight: " << view.in_flight_applied
                   << " held by the replica (applied), " << view.in_flight_awaiting
                   << " decided by their copies, " << view.in_flight_failed
                   << " failed; catch-up copies sent: " << view.catch_up_copies
                   << "; lost so far: " << view.lost_updates << " (norm <= " << view.lost_norm
                   << ")";
  job->failovers.push_back(std::move(view));
  return true;
}

int FailOverServersOn(ClusterState* state, const std::string& host, const std::string& reason) {
  std::vector<std::pair<std::string, std::string>> servers;
  for (const auto& [job_name, job] : state->jobs()) {
    for (const auto& [server_name, server] : job.servers) {
      if (server.host == host && job.replica_hosts.count(server_name)) {
        servers.emplace_back(job_name, server_name);
      }
    }
  }
  int promoted = 0;
  for (const auto& [job, server] : servers) {
    promoted += PromoteReplica(state, job, server, absl::StrCat("host ", host, " is down: ", reason))
                    ? 1
                    : 0;
  }
  return promoted;
}

}  // namespace mlfabric
