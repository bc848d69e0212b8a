#include "scheduler/service/in_doubt.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "scheduler/service/commands.h"
#include "scheduler/service/restart_ledger.h"

namespace mlfabric {
namespace {

// Entries of the servers' applied logs are kept this long (at least) for
// sources that register after their server's host.
constexpr double kAppliedKeepS = 120;

void Tell(ClusterState* state, const InDoubtPush& push, v1::Outcome outcome,
          const std::string& reason, int64_t applied_version, bool hold_for_replica = false) {
  v1::DaemonCommand command =
      commands::PushOutcome(push.transfer_id, push.local_id, outcome, reason);
  if (outcome == v1::OUTCOME_APPLIED) command.mutable_outcome()->set_applied_version(applied_version);
  if (hold_for_replica) command.mutable_outcome()->set_hold_for_replica(true);
  state->outcomes().Remember(push.transfer_id, {outcome, reason, applied_version, 0, hold_for_replica});
  state->Enqueue(push.src_host, std::move(command));
  if (outcome == v1::OUTCOME_APPLIED) {
    ++state->stats.in_doubt_applied;
  } else {
    ++state->stats.in_doubt_failed;
  }
  MLF_LOG(INFO) << "push " << push.transfer_id << " from " << push.src_host
                << " (in doubt since the stream broke): "
                << (outcome == v1::OUTCOME_APPLIED ? absl::StrCat("applied as version ",
                                                                  applied_version)
                                                   : absl::StrCat("failed: ", reason));
}

void Applied(ClusterState* state, const std::string& host, uint64_t push, int64_t version) {
  state->restart().MarkAppliedElsewhere(push, version, state->NowSeconds());
  // A push this scheduler already ended as not applied: a promise broken.
  if (const RecentOutcome* known = state->outcomes().Find(push);
      known != nullptr && known->outcome != v1::OUTCOME_APPLIED) {
    ++state->stats.outcome_contradicted;
    MLF_LOG(ERROR) << "push " << push << " was reported " << v1::Outcome_Name(known->outcome)
                   << " (" << known->reason << ") but host " << host
                   << "'s server applied it as version " << version;
  }
}

// Whether every host that would have applied a push to `server` has
// registered with this scheduler (so its applied log is in): the server's
// own, or, for a server group, every shard's: a push to a group may have
// been released, and applied, at some shards only.
bool AllHostsBack(const ClusterState& state, const JobState& job, const ServerState& server) {
  if (server.shards.empty()) return state.AliveHost(server.host) != nullptr;
  for (const ShardSlot& slot : server.shards) {
    if (slot.server.empty()) return false;
    auto shard = job.servers.find(slot.server);
    if (shard == job.servers.end() || state.AliveHost(shard->second.host) == nullptr) return false;
  }
  return true;
}

// What is known of push `push` (of `job`'s `server`) here: applied (with
// its version), not applied (with why), or nothing yet (nullopt).
struct Known {
  bool applied = false;
  int64_t version = 0;
  std::string why;
};
std::optional<Known> KnownOutcome(const ClusterState& state, uint64_t push, const std::string& job,
                                  const std::string& server, double waited_s, double wait_s) {
  if (state.pushes().count(push) || state.restart().IsDelivering(push) ||
      state.restart().IsInDoubt(push)) {
    return std::nullopt;  // still being decided
  }
  if (const RecentOutcome* told = state.outcomes().Find(push)) {
    return Known{told->outcome == v1::OUTCOME_APPLIED, told->applied_version, told->reason};
  }
  if (const std::optional<int64_t> version = state.restart().AppliedVersion(push)) {
    return Known{true, *version, ""};
  }
  if ((push >> kEpochShift) == state.epoch()) {
    return Known{false, 0, "this scheduler has no record of its push"};
  }
  if (const JobState* job_state = state.FindJob(job)) {
    auto found = job_state->servers.find(server);
    if (found != job_state->servers.end() && AllHostsBack(state, *job_state, found->second)) {
      return Known{false, 0,
                   absl::StrCat("the daemon of server '", server, "' on ", found->second.host,
                                " did not apply its push")};
    }
  }
  if (waited_s >= wait_s) {
    return Known{false, 0, "its push's server did not register with the new scheduler in time"};
  }
  return std::nullopt;
}

// What is known of the pushes a kept copy carries (one, or an aggregate's):
// not applied as soon as one is known not applied, applied once all are;
// `applied` counts those known applied, with their norms summed (an
// aggregate's norm is spread evenly: only the sum is kept).
std::optional<Known> KnownOutcomeOfCopy(const ClusterState& state, const v1::ExpectDelivery& copy,
                                        const std::string& job, const std::string& server,
                                        double waited_s, double wait_s, int64_t* applied) {
  std::vector<uint64_t> pushes(copy.constituents().begin(), copy.constituents().end());
  if (copy.group_push() != 0 && pushes.empty()) pushes = {copy.group_push()};
  if (pushes.empty()) pushes.push_back(copy.source_transfer_id());
  *applied = 0;
  std::optional<Known> failed;
  bool all_known = true;
  for (uint64_t push : pushes) {
    const std::optional<Known> known = KnownOutcome(state, push, job, server, waited_s, wait_s);
    if (!known.has_value()) {
      all_known = false;
    } else if (known->applied) {
      ++*applied;
    } else if (!failed.has_value()) {
      failed = known;
    }
  }
  if (failed.has_value()) return failed;
  if (!all_known) return std::nullopt;
  return Known{true, 0, ""};
}

// Announces the kept copy `held` at its replica's next position (or the
// promoted replica's, as the server), as one of the replica's copies in
// flight. False when the replica is not (yet) registered on that host.
bool Redeliver(ClusterState* state, uint64_t copy_id, const HeldAtReplica& held,
               const std::string& server_name) {
  JobState* job = state->FindJob(held.job);
  if (job == nullptr || state->AliveHost(held.replica_host) == nullptr) return false;
  auto server = job->servers.find(server_name);
  if (server == job->servers.end()) return false;
  const bool promoted = server->second.host == held.replica_host;
  auto replica = job->replica_hosts.find(server_name);
  if (!promoted && (replica == job->replica_hosts.end() || replica->second != held.replica_host)) {
    return false;
  }
  uint64_t& next = promoted ? server->second.next_sequence : server->second.replica.next_sequence;
  ReplicaCopy record{held.job, server_name, held.copy.source_transfer_id(),
                     held.copy.src_host(), held.replica_host, next++};
  record.to_promoted = promoted;
  record.constituents.assign(held.copy.constituents().begin(), held.copy.constituents().end());
  state->replicas().AddCopy(copy_id, record);
  server->second.replica.in_flight[copy_id] = held.copy.norm();
  v1::DaemonCommand command;
  v1::ExpectDelivery* expect = command.mutable_expect();
  *expect = held.copy;
  expect->set_job_id(job->id);
  expect->set_server(promoted ? server_name : "replica:" + server_name);
  expect->set_sequence(record.sequence);
  expect->set_held(false);
  state->Enqueue(held.replica_host, std::move(command));
  return true;
}

}  // namespace

void SkipGroupPosition(ClusterState* state, const JobState& job, const std::string& host,
                       const std::string& shard, uint64_t position, const std::string& reason) {
  // Announced as a placeholder, then cancelled: the daemon's sequencer
  // passes a cancelled position like any other (delivery_sequencer.h).
  const uint64_t gap = state->NewTransferId();
  v1::DaemonCommand placeholder;
  v1::ExpectDelivery* e = placeholder.mutable_expect();
  e->set_transfer_id(gap);
  e->set_job_id(job.id);
  e->set_server(shard);
  e->set_sequence(position);
  e->set_held(true);
  state->Enqueue(host, std::move(placeholder));
  state->Enqueue(host, commands::CancelDelivery(gap, shard, position, reason));
}

namespace {

// A group push's part that a shard's daemon kept across the restart
// (`held`): delivered at that shard, at the group's next position (which
// every other shard skips), if any shard applied the push; dropped there if
// none did. False while that is not known yet.
bool SettleKeptPart(ClusterState* state, uint64_t part_id, const HeldAtReplica& held,
                    double waited_s, double wait_s) {
  JobState* job = state->FindJob(held.job);
  const std::string& shard = held.copy.server();
  ServerState* shard_state = nullptr;
  ServerState* group = nullptr;
  if (job != nullptr) {
    if (auto found = job->servers.find(shard); found != job->servers.end()) {
      shard_state = &found->second;
      if (auto g = job->servers.find(found->second.group); g != job->servers.end()) {
        group = &g->second;
      }
    }
  }
  const uint64_t push = held.copy.group_push();
  // A group aggregate's part: applied at some shard if any of its pushes
  // is known applied (a shard applies the sum whole), not if any is known
  // not applied.
  std::vector<uint64_t> pushes(held.copy.constituents().begin(), held.copy.constituents().end());
  if (pushes.empty()) pushes = {push};
  std::optional<Known> known;
  for (uint64_t p : pushes) {
    known = KnownOutcome(*state, p, held.job, shard_state != nullptr ? shard_state->group : "",
                         waited_s, wait_s);
    if (known.has_value()) break;
  }
  if (!known.has_value()) return false;
  const bool here = group != nullptr && shard_state->host == held.replica_host &&
                    state->AliveHost(held.replica_host) != nullptr;
  if (known->applied && !here && waited_s < wait_s) return false;  // its shard not back yet
  if (!known->applied || !here) {
    if (known->applied) {
      MLF_LOG(ERROR) << "group push " << push << " applied at other shards, but shard '" << shard
                     << "' did not register again on " << held.replica_host << " within "
                     << wait_s << " s: its part is dropped, and the shards now differ by it";
    }
    state->Enqueue(held.replica_host,
                   commands::CancelDelivery(part_id, shard, 0,
                                            known->applied ? "its shard is gone" : known->why));
    return true;
  }
  const uint64_t position = group->next_sequence++;
  v1::DaemonCommand command;
  v1::ExpectDelivery* expect = command.mutable_expect();
  *expect = held.copy;
  expect->set_job_id(job->id);
  expect->set_sequence(position);
  expect->set_held(false);
  state->Enqueue(held.replica_host, std::move(command));
  // The other shards applied the push before the restart: they skip this
  // position. One not registered with this scheduler yet (or whose host is
  // down) is told when it registers (RegisterShard): its daemon numbers
  // from 1 again too, and a position it never hears of would hold back
  // every later push to the group at that shard.
  const std::string reason =
      "shard '" + shard + "' catches up on group push " + std::to_string(push);
  for (ShardSlot& slot : group->shards) {
    if (slot.server == shard) continue;
    auto other = slot.server.empty() ? job->servers.end() : job->servers.find(slot.server);
    if (other == job->servers.end() || state->AliveHost(other->second.host) == nullptr) {
      slot.owed_skips.emplace_back(position, reason);
      continue;
    }
    SkipGroupPosition(state, *job, other->second.host, slot.server, position, reason);
  }
  MLF_LOG(INFO) << "part " << part_id << " of group push " << push << ", kept at shard '" << shard
                << "' on " << held.replica_host
                << " across the restart: delivered (other shards applied it)";
  return true;
}

// Counts what the replica lacks for good when a kept copy or aggregate is
// not applied there: its pushes the server applied (`*applied` of them, as
// far as known now), less those copied again from their sources
// (SettleHeldSources), which are not lacking. Leaves in `*applied` how
// many it counted.
void CountMissed(ClusterState* state, const HeldAtReplica& held, const std::string& server,
                 int64_t* applied) {
  const int64_t carried = std::max(1, held.copy.constituents_size());
  std::vector<uint64_t> pushes(held.copy.constituents().begin(),
                               held.copy.constituents().end());
  if (pushes.empty()) pushes.push_back(held.copy.source_transfer_id());
  for (uint64_t push : pushes) {
    if (state->restart().WasRecopiedFromSource(push)) --*applied;
  }
  if (*applied <= 0) return;
  if (JobState* job = state->FindJob(held.job); job != nullptr && job->servers.count(server)) {
    ReplicaTrack& replica = job->servers[server].replica;
    replica.missed += *applied;
    replica.missed_norm += held.copy.norm() * static_cast<double>(*applied) / carried;
  }
}

// Decides kept replica copy `copy_id` (not a group part) once its pushes'
// outcomes are known: delivered, dropped or cancelled. False: not yet.
bool SettleKeptCopy(ClusterState* state, uint64_t copy_id, const HeldAtReplica& held,
                    double waited_s, double wait_s) {
  std::string server = held.copy.server();
  if (absl::StartsWith(server, "replica:")) server = server.substr(8);
  int64_t applied = 0;
  const std::optional<Known> known =
      KnownOutcomeOfCopy(*state, held.copy, held.job, server, waited_s, wait_s, &applied);
  if (!known.has_value()) return false;
  if (!known->applied) CountMissed(state, held, server, &applied);
  if (held.incomplete) {
    // Dropped at the replica's daemon: if its pushes applied, the replica
    // lacks them, unless their sources send them again (they hold them
    // until SettleHeldSources decides).
    const bool deciding = std::any_of(
        held.copy.constituents().begin(), held.copy.constituents().end(),
        [&](uint64_t push) { return state->restart().IsHeldAtSource(push); }) ||
        state->restart().IsHeldAtSource(held.copy.source_transfer_id());
    if (deciding) return false;
    if (known->applied) {
      CountMissed(state, held, server, &applied);
      if (applied > 0) {
        MLF_LOG(WARNING) << "the replica of '" << server << "' on " << held.replica_host
                         << " lacks push " << held.copy.source_transfer_id()
                         << ": its copy was still arriving when the scheduler went";
      }
    }
    return true;
  }
  if (known->applied) {
    if (Redeliver(state, copy_id, held, server)) {
      MLF_LOG(INFO) << "replica copy " << copy_id << " of push " << held.copy.source_transfer_id()
                    << ", kept at " << held.replica_host << " across the restart: delivered";
      return true;
    }
    if (waited_s < wait_s) return false;  // its replica has not registered again yet
    MLF_LOG(WARNING) << "replica copy " << copy_id << " of applied push "
                     << held.copy.source_transfer_id() << " kept at " << held.replica_host
                     << ": the replica did not register again within " << wait_s
                     << " s; dropped, the replica lacks this update";
  }
  state->Enqueue(held.replica_host,
                 commands::CancelDelivery(copy_id, held.copy.server(), 0,
                                          known->applied ? "its replica is gone" : known->why));
  return true;
}

// Decides the kept replica copies and group parts whose pushes' outcomes
// are known.
void SettleKeptCopies(ClusterState* state, double wait_s) {
  const double now_s = state->NowSeconds();
  state->restart().EraseHeldAtReplicaIf([&](uint64_t copy_id, const HeldAtReplica& held) {
    return held.copy.group_push() != 0
               ? SettleKeptPart(state, copy_id, held, now_s - held.since_s, wait_s)
               : SettleKeptCopy(state, copy_id, held, now_s - held.since_s, wait_s);
  });
}

// A push held at its source whose server's replica is registered: the
// source lets it go if the replica has its copy (applied, or kept there
// whole) or the copy is on its way; otherwise the copy joins the server's
// pending copies for the next batch to send. The caller forgets the hold.
void SettleWithReplica(ClusterState* state, uint64_t push, const HeldAtSource& held,
                       ServerState* server, const std::string& replica_host) {
  ReplicaTrack& track = server->replica;
  if (held.from_doubt) {
    // The replica's daemon has registered (its application has): what
    // it applied and what it kept are known here now.
    const RestartLedger::KeptCopies kept = state->restart().KeptCopiesOf(push);
    if (state->restart().IsAtReplica(push) || (kept.whole && !kept.incomplete)) {
      // The replica has it, or its kept copy is delivered once the push
      // is known applied (SettleKeptCopies): the source may let go.
      state->Enqueue(held.copy.src_host,
                     commands::ReleaseHold(push, "the replica has its copy"));
      return;
    }
    // Its copy was still arriving at the replica (counted missed
    // otherwise), or never left: sent again from the source.
    if (kept.incomplete) state->restart().MarkRecopiedFromSource(push);
  }
  const bool known =
      std::any_of(track.pending.begin(), track.pending.end(),
                  [&](const PendingReplica& p) { return p.id == push; }) ||
      state->replicas().CarriesPush(push);
  if (known && held.from_doubt) {
    state->Enqueue(held.copy.src_host,
                   commands::ReleaseHold(push, "its replica copy is on its way"));
  } else if (!known) {  // a stream that broke while this scheduler lived knows it
    track.pending.push_back(held.copy);
    ++state->stats.held_sources_recopied;
    MLF_LOG(INFO) << "replica copy of push " << push << ", held at " << held.copy.src_host
                  << " across the restart: planned again for the replica of '"
                  << held.server << "' on " << replica_host;
  }
}

// Plans again the replica copy a source holds across a restart: the
// punted copy of a push applied before it, or of a push in doubt that
// turned out applied (whose copy may have been punted, or lost on its
// way). It joins its server's pending copies (the next batch's §5.3 plan
// sends it) once the server's replica is registered, unless the replica
// has the copy already (applied, or kept there): then the source lets go.
// After wait_s without a replica, the source frees the bytes. False: not
// decided yet.
bool SettleHeldSource(ClusterState* state, uint64_t push, const HeldAtSource& held, double now_s,
                      double wait_s) {
  JobState* job = state->FindJob(held.job);
  ServerState* server = nullptr;
  if (job != nullptr) {
    if (auto found = job->servers.find(held.server); found != job->servers.end()) {
      server = &found->second;
    }
  }
  const auto replica = job != nullptr ? job->replica_hosts.find(held.server)
                                      : std::map<std::string, std::string>::iterator();
  const bool has_replica = server != nullptr && replica != job->replica_hosts.end() &&
                           state->AliveHost(replica->second) != nullptr &&
                           replica->second != server->host;
  if (has_replica) {
    SettleWithReplica(state, push, held, server, replica->second);
    return true;
  }
  if (now_s - held.since_s < wait_s) return false;  // its replica is not registered (again) yet
  const std::string why =
      absl::StrCat("server '", held.server, "' has no registered replica ", wait_s,
                   " s after its source registered again (in_doubt_wait_s)");
  state->Enqueue(held.copy.src_host, commands::ReleaseHold(push, why));
  // A punted copy had a replica to go to; a push in doubt may never have.
  if (server != nullptr && !held.from_doubt) {
    ++server->replica.missed;
    server->replica.missed_norm += held.copy.norm;
  }
  MLF_LOG(WARNING) << "replica copy of push " << push << ", held at " << held.copy.src_host
                   << " across the restart: released, " << why;
  return true;
}

// Decides every copy held at its source that can be decided now
// (SettleHeldSource), and forgets it.
void SettleHeldSources(ClusterState* state, double wait_s) {
  const double now_s = state->NowSeconds();
  state->restart().EraseHeldAtSourceIf([&](uint64_t push, const HeldAtSource& held) {
    return SettleHeldSource(state, push, held, now_s, wait_s);
  });
}

}  // namespace

void AcceptHostReport(ClusterState* state, const v1::RegisterHostRequest& request) {
  for (const v1::AppliedPush& entry : request.applied()) {
    if (entry.acknowledged()) {
      Applied(state, request.host(), entry.transfer_id(), entry.model_version());
    } else {
      state->restart().MarkDelivering(entry.transfer_id());
    }
  }
  const double now_s = state->NowSeconds();
  for (const v1::InDoubtPush& push : request.in_doubt()) {
    InDoubtPush doubt;
    doubt.transfer_id = push.transfer_id();
    doubt.local_id = push.local_id();
    doubt.src_host = request.host();
    doubt.job = push.job();
    doubt.server = push.server();
    doubt.since_s = now_s;
    doubt.copy = {push.transfer_id(), request.host(), push.worker(), push.bytes(),
                  push.version(),     push.norm(),    push.dtype()};
    state->restart().AddInDoubt(std::move(doubt));
    state->outcomes().RememberUid(push.push_uid(), push.transfer_id(), push.job(), push.worker());
  }
  for (const v1::AppliedPush& copied : request.replica_applied()) {
    state->restart().MarkAtReplica(copied.transfer_id(), now_s);
  }
  for (const v1::HeldCopy& held : request.held_copies()) {
    HeldAtReplica kept;
    kept.job = held.job();
    kept.replica_host = request.host();
    kept.copy = held.copy();
    kept.incomplete = held.incomplete();
    kept.since_s = now_s;
    state->restart().KeepAtReplica(held.copy().transfer_id(), std::move(kept));
  }
  for (const v1::HeldSource& source : request.held_sources()) {
    HeldAtSource held;
    held.job = source.job();
    held.server = source.server();
    held.copy = {source.transfer_id(), request.host(), source.worker(), source.bytes(),
                 source.version(),     source.norm(),  source.dtype()};
    held.since_s = now_s;
    state->restart().HoldAtSource(source.transfer_id(), std::move(held));
  }
  if (request.held_sources_size() > 0) {
    MLF_LOG(WARNING) << "host " << request.host() << " registered holding "
                     << request.held_sources_size()
                     << " applied push(es) for their punted replica copies; planned again";
  }
  if (request.held_copies_size() > 0) {
    MLF_LOG(WARNING) << "host " << request.host() << " registered with "
                     << request.held_copies_size()
                     << " held replica copy(ies); their pushes' outcomes decide them";
  }
  if (request.in_doubt_size() > 0) {
    MLF_LOG(WARNING) << "host " << request.host() << " registered with " << request.in_doubt_size()
                     << " push(es) in doubt; the servers' daemons decide them";
  }
}

bool AcceptLateCompletion(ClusterState* state, const v1::CompletionReport& report) {
  std::vector<uint64_t> pushes(report.pushes().begin(), report.pushes().end());
  if (pushes.empty()) pushes.push_back(report.transfer_id());
  bool known = false;
  for (uint64_t push : pushes) {
    known = known || state->restart().IsInDoubt(push) || state->restart().IsDelivering(push);
  }
  if (!known) return false;
  const int64_t n = static_cast<int64_t>(pushes.size());
  for (int64_t i = 0; i < n; ++i) {
    if (report.applied()) {
      Applied(state, report.host(), pushes[i], report.model_version() - (n - 1 - i));
    } else {
      state->restart().EndDelivering(pushes[i]);
    }
  }
  return true;
}

namespace {

// Ends push in doubt `push` if its outcome is known now (see in_doubt.h's
// banner), telling its source. False: not yet.
bool EndInDoubt(ClusterState* state, const InDoubtPush& push, double now_s, double wait_s) {
  if (state->pushes().count(push.transfer_id)) return true;  // still live here: ends as usual
  if (const RecentOutcome* told = state->outcomes().Find(push.transfer_id)) {
    // This scheduler ended it; its source did not hear.
    v1::DaemonCommand command =
        commands::PushOutcome(push.transfer_id, push.local_id, told->outcome, told->reason);
    command.mutable_outcome()->set_applied_version(told->applied_version);
    command.mutable_outcome()->set_delay(told->delay);
    command.mutable_outcome()->set_hold_for_replica(told->hold_for_replica);
    state->Enqueue(push.src_host, std::move(command));
    return true;
  }
  if (const std::optional<int64_t> version = state->restart().AppliedVersion(push.transfer_id)) {
    // Its replica copy may have been punted, or lost with the stream:
    // the source keeps the bytes until the replica is known to have it
    // or gets a copy of it (SettleHeldSources).
    Tell(state, push, v1::OUTCOME_APPLIED, "", *version, /*hold_for_replica=*/true);
    state->restart().HoldAtSource(push.transfer_id, {push.job, push.server, push.copy, now_s,
                                                     /*from_doubt=*/true});
    return true;
  }
  if (state->restart().IsDelivering(push.transfer_id)) {  // its application's ack decides
    return false;
  }
  std::string why;
  const JobState* job = state->FindJob(push.job);
  const ServerState* server = nullptr;
  if (job != nullptr) {
    if (auto found = job->servers.find(push.server); found != job->servers.end()) {
      server = &found->second;
    }
  }
  if ((push.transfer_id >> kEpochShift) == state->epoch()) {
    why = "this scheduler has no record of it";
  } else if (server != nullptr && AllHostsBack(*state, *job, *server)) {
    why = absl::StrCat("the scheduler restarted while it was in flight, and the daemon of "
                       "server '", push.server, "' on ", server->host,
                       " did not apply it (it cancelled the lost schedule's deliveries); "
                       "push it again");
  } else if (now_s - push.since_s >= wait_s) {
    why = absl::StrCat("the scheduler restarted while it was in flight, and the host of "
                       "server '", push.server, "' did not register with the new scheduler within ",
                       wait_s, " s (in_doubt_wait_s): not applied at any live server");
  } else {
    return false;
  }
  Tell(state, push, v1::OUTCOME_FAILED, why, 0);
  return true;
}

}  // namespace

void ResolveInDoubt(ClusterState* state, double wait_s) {
  const double now_s = state->NowSeconds();
  state->restart().EraseInDoubtIf(
      [&](const InDoubtPush& push) { return EndInDoubt(state, push, now_s, wait_s); });
  SettleHeldSources(state, wait_s);
  SettleKeptCopies(state, wait_s);
  state->restart().Prune(now_s, std::max(kAppliedKeepS, 2 * wait_s));
}

}  // namespace mlfabric
