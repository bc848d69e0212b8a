#include "scheduler/service/cluster_state.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/secrets.h"
#include "scheduler/service/commands.h"

namespace mlfabric {
namespace {

// A short, stable label for a failure reason (metrics and dashboard).
std::string FailureCategory(const std::string& reason) {
  if (reason.rfind("timed out", 0) == 0) return "timed_out";
  if (reason.find(" is down") != std::string::npos) return "host_down";
  if (reason.rfind("scheduler could not plan", 0) == 0) return "plan_error";
  if (reason.find("aggregator") != std::string::npos) return "aggregation_unsupported";
  if (reason.find("ended mid-transfer") != std::string::npos ||
      reason.find("connection") != std::string::npos) {
    return "connection_lost";
  }
  return "transfer_failed";
}

void AppendSegments(const std::vector<core::RateSegment>& segments,
                    std::vector<core::RateSegment>* out) {
  out->insert(out->end(), segments.begin(), segments.end());
}

}  // namespace

int32_t RoundSize(const JobState& job, const ServerState& server) {
  if (server.round_size > 0) {
    return std::max(1, server.round_size - RanksLeft(job, server) - server.backup_workers);
  }
  if (MemberSizedRounds(job, server)) {
    const int64_t members = static_cast<int64_t>(job.membership.size());
    return static_cast<int32_t>(std::max<int64_t>(1, members - job.config.backup_workers));
  }
  return 0;
}

bool MemberSizedRounds(const JobState& job, const ServerState& server) {
  // Once a worker registered: a job whose members all left stays
  // synchronous (size 1) rather than turning asynchronous.
  return server.round_size == 0 && !server.plan_on_arrival && job.config.mode == JobMode::kSync &&
         !job.workers.empty();
}

bool ElasticRanks(const JobState& job, const ServerState& server) {
  return server.round_size > 0 && job.config.member_loss == MemberLoss::kShrink &&
         job.config.member_loss_explicit;
}

int32_t RanksLeft(const JobState& job, const ServerState& server) {
  if (!ElasticRanks(job, server)) return 0;
  int32_t left = 0;
  for (const std::string& rank : server.ranks) left += job.membership.Contains(rank) ? 0 : 1;
  return left;
}

int64_t DelayBound(const JobState& job) {
  // An ssp job's K bounds iterations (AwaitClock); versions stay bounded
  // by tau_max, as for async jobs. A worker that left bounds nothing.
  int64_t bound = job.config.tau_max;
  for (const std::string& name : job.membership.members()) {
    const WorkerInfo* worker = FindOrNull(job.workers, name);
    if (worker != nullptr && worker->delay_bound >= 0) bound = std::min(bound, worker->delay_bound);
  }
  return bound;
}

double DivergenceBound(const JobState& job) {
  double bound = job.config.divergence_max;
  for (const std::string& name : job.membership.members()) {
    const WorkerInfo* worker = FindOrNull(job.workers, name);
    if (worker != nullptr && worker->divergence_bound > 0) {
      bound = bound > 0 ? std::min(bound, worker->divergence_bound) : worker->divergence_bound;
    }
  }
  return bound;
}

uint64_t SchedulerEpoch(double wall_s) {
  constexpr double kEpochOrigin = 1704067200;  // 2024-01-01T00:00:00Z
  constexpr double kMaxEpoch = (uint64_t{1} << 28) - 1;
  return static_cast<uint64_t>(std::clamp(wall_s - kEpochOrigin, 0.0, kMaxEpoch));
}

uint64_t ClusterState::NewIncarnation() {
  while (true) {
    uint32_t low = 0;
    const std::string random = RandomBytes(sizeof(low));
    std::memcpy(&low, random.data(), sizeof(low));
    const uint64_t incarnation = (epoch_ << kEpochShift) | low;
    if (low != 0 && incarnations_.insert(incarnation).second) return incarnation;
  }
}

ClusterState::ClusterState(const SchedulerConfig& config, const Clock* clock,
                           CommandOutbox* outbox, AdminHistory* history)
    : stragglers({config.straggler_factor, static_cast<int>(config.straggler_window)}),
      config_(config), clock_(clock), outbox_(outbox), history_(history) {
  epoch_ = SchedulerEpoch(clock_->WallSeconds());
  next_transfer_id_ = (epoch_ << kEpochShift) | 1;
  uint32_t next_job_id = 1;
  for (const JobConfig& job : config_.jobs) {
    JobState state;
    state.id = next_job_id++;
    state.config = job;
    jobs_[job.name] = std::move(state);
  }
}

void ClusterState::ForEachServer(
    absl::FunctionRef<void(const std::string& job_name, JobState& job,
                           const std::string& server_name, ServerState& server)>
        visit) {
  for (auto& [job_name, job] : jobs_) {
    for (auto& [server_name, server] : job.servers) visit(job_name, job, server_name, server);
  }
}

UpdateRecord& ClusterState::AddPush(UpdateRecord record) {
  const uint64_t id = record.transfer_id;
  return updates_[id] = std::move(record);
}

void ClusterState::ForEachPush(absl::FunctionRef<void(UpdateRecord& record)> visit) {
  for (auto& [id, record] : updates_) visit(record);
}

std::optional<UpdateRecord> ClusterState::TakePush(uint64_t transfer_id) {
  auto it = updates_.find(transfer_id);
  if (it == updates_.end()) return std::nullopt;
  UpdateRecord record = std::move(it->second);
  updates_.erase(it);
  return record;
}

void ClusterState::Enqueue(const std::string& host, v1::DaemonCommand command) {
  if (AliveHost(host) == nullptr) return;
  outbox_->Push(host, std::move(command));
}

void ClusterState::Complete(uint64_t transfer_id, v1::Outcome outcome, const std::string& reason,
                            int64_t applied_version) {
  auto it = updates_.find(transfer_id);
  if (it == updates_.end()) return;
  const UpdateRecord& record = it->second;
  JobState* job = FindJob(record.job);
  stragglers.OnOutcome(record.job, record.worker, record.submitted_s, clock_->NowSeconds());
  LeaveServer(transfer_id, record, job, outcome, reason);
  // A group push's parts not yet released are skipped at every shard.
  EndGroupPush(transfer_id, record.state == UpdateState::kInFlight ? record.sequence : 0, reason);
  SettleHeldCopies(transfer_id, outcome == v1::OUTCOME_APPLIED, reason);
  v1::DaemonCommand command =
      OutcomeCommand(transfer_id, record, job, outcome, reason, applied_version);
  const v1::PushOutcome& result = command.outcome();
  const int64_t delay = result.delay();
  outcomes_.Remember(transfer_id,
                     {outcome, reason, applied_version, delay, result.hold_for_replica()});
  Enqueue(record.src_host, std::move(command));
  if (outcome == v1::OUTCOME_APPLIED) {
    if (job) ++job->applied;
    RecordAppliedDelay(transfer_id, record, delay);
  } else {
    if (job) ++(outcome == v1::OUTCOME_DROPPED ? job->dropped : job->failed);
    RecordDrop(record, outcome,
               outcome == v1::OUTCOME_DROPPED ? reason.substr(0, reason.find(':'))
                                              : FailureCategory(reason),
               reason);
  }
  const uint64_t aggregate_id = outcome == v1::OUTCOME_APPLIED ? 0 : record.aggregate_id;
  const bool fails_round = outcome != v1::OUTCOME_APPLIED && record.round_member;
  const std::string round_job = record.job, round_server = record.server;
  const std::string src_host = record.src_host;
  const int64_t round = record.version;
  updates_.erase(it);
  // Without this member the synchronous round can never be complete.
  if (fails_round) {
    FailRound(round_job, round_server, round,
              absl::StrCat("push ", transfer_id, " of the round failed: ", reason));
  }
  // Without this constituent the aggregate can never be complete.
  if (aggregate_id != 0) {
    // Named by the host that sent it: a data session's end knows only an address.
    FailAggregate(aggregate_id, absl::StrCat("constituent ", transfer_id, " from ", src_host,
                                             " failed: ", reason));
  }
}

void ClusterState::LeaveServer(uint64_t transfer_id, const UpdateRecord& record, JobState* job,
                               v1::Outcome outcome, const std::string& reason) {
  if (record.state != UpdateState::kInFlight || job == nullptr) return;
  auto server = job->servers.find(record.server);
  if (server == job->servers.end()) return;
  --server->second.in_flight;
  if (outcome != v1::OUTCOME_APPLIED && record.aggregate_id == 0 && record.sequence != 0 &&
      !groups_.Contains(transfer_id)) {
    // The server's daemon waits for this sequence number: tell it to
    // skip, so later updates are not held back behind it.
    Enqueue(server->second.host,
            commands::CancelDelivery(transfer_id, record.server, record.sequence, reason));
  }
}

v1::DaemonCommand ClusterState::OutcomeCommand(uint64_t transfer_id, const UpdateRecord& record,
                                               JobState* job, v1::Outcome outcome,
                                               const std::string& reason,
                                               int64_t applied_version) {
  v1::DaemonCommand command = commands::PushOutcome(transfer_id, record.local_id, outcome, reason);
  v1::PushOutcome* result = command.mutable_outcome();
  if (outcome == v1::OUTCOME_APPLIED) {
    result->set_applied_version(applied_version);
    // Its replica copy was punted (§5.3): the source keeps the bytes until
    // a later batch sends them to the replica.
    if (record.replica_punted && job != nullptr) {
      job->servers[record.server].replica.pending.push_back(
          {transfer_id, record.src_host, record.worker, record.bytes, record.version,
           record.norm, record.dtype});
      result->set_hold_for_replica(true);
    }
    // The update was computed on v(g) and applied as version applied_version:
    // applied_version - 1 - v(g) other updates came in between (§3.1).
    result->set_delay(std::max<int64_t>(0, applied_version - 1 - record.version));
    ++stats.applied;
  } else if (outcome == v1::OUTCOME_DROPPED) {
    ++stats.dropped;
  } else {
    ++stats.failed;
    MLF_LOG(WARNING) << "push " << transfer_id << " from " << record.src_host
                     << " failed: " << reason;
  }
  return command;
}

void ClusterState::RecordAppliedDelay(uint64_t transfer_id, const UpdateRecord& record,
                                      int64_t delay) {
  DelayView view;
  view.transfer_id = transfer_id;
  view.job = record.job;
  view.server = record.server;
  view.src = record.src_host;
  view.delay = delay;
  view.at_s = clock_->NowSeconds();
  view.latency_s = view.at_s - record.submitted_s;
  // Its bytes reach the server at the end of its own transfer, or of the
  // aggregate that carried them there.
  const TransferView* to_server = &record.planned;
  if (const AggregateRecord* aggregate = aggregates_.Find(record.aggregate_id)) {
    to_server = &aggregate->planned;
  }
  if (to_server->planned_at_s > 0) {
    view.queued_s = to_server->planned_at_s - record.submitted_s;
    view.planned_s = to_server->end_s - to_server->planned_at_s;
    view.late_s = view.at_s - to_server->end_s;
  }
  history_->RecordDelay(view);
}

void ClusterState::SettleHeldCopies(uint64_t transfer_id, bool applied,
                                    const std::string& reason) {
  std::vector<uint64_t> cancelled;
  replicas_.ForEachCopy([&](uint64_t copy_id, ReplicaCopy& copy) {
    if (!copy.held) return;
    if (!copy.constituents.empty()) {  // an aggregate: all its pushes decide
      if (copy.unsettled.erase(transfer_id) == 0) return;
      if (!applied) {
        cancelled.push_back(copy_id);
        return;
      }
      for (size_t i = 0; i < copy.constituents.size(); ++i) {
        if (copy.constituents[i] == transfer_id) copy.applied_members[transfer_id] = copy.norms[i];
      }
      if (!copy.unsettled.empty()) return;
      copy.held = false;
      Enqueue(copy.replica_host, commands::ReleaseDelivery(copy_id, copy.sequence, copy.source_down));
      return;
    }
    if (copy.source != transfer_id) return;
    copy.held = false;
    if (applied) {
      Enqueue(copy.replica_host,
              commands::ReleaseDelivery(copy_id, copy.sequence, copy.source_down));
    } else {
      cancelled.push_back(copy_id);
    }
  });
  // The server did not apply it: neither may the replica (its model would
  // hold an update no worker was told was applied).
  for (uint64_t copy_id : cancelled) {
    EndReplicaCopy(copy_id, /*applied=*/false,
                   absl::StrCat("its push ", transfer_id, " did not apply: ", reason), 0);
  }
}

void ClusterState::FailAggregate(uint64_t aggregate_id, const std::string& reason) {
  if (IsGroupAggregate(aggregate_id)) {
    FailGroupAggregate(aggregate_id, reason);
    return;
  }
  // Taken out before failing constituents, which call back here.
  std::optional<AggregateRecord> taken = aggregates_.Take(aggregate_id);
  if (!taken.has_value()) return;
  const AggregateRecord& aggregate = *taken;
  const v1::DaemonCommand cancel =
      commands::CancelDelivery(aggregate_id, aggregate.server, aggregate.sequence, reason);
  Enqueue(aggregate.host, cancel);
  for (const AggregateRecord::Hop& hop : aggregate.hops) {
    Enqueue(hop.host, commands::CancelDelivery(hop.id, aggregate.server, 0, reason));
  }
  if (JobState* job = FindJob(aggregate.job)) {
    auto server = job->servers.find(aggregate.server);
    if (server != job->servers.end()) Enqueue(server->second.host, cancel);
  }
  for (uint64_t constituent : aggregate.constituents) {
    auto record = updates_.find(constituent);
    if (record == updates_.end()) continue;
    record->second.aggregate_id = 0;  // the aggregate is gone already
    record->second.sequence = 0;      // nothing at the server waits for it
    Complete(constituent, v1::OUTCOME_FAILED,
             absl::StrCat("its in-network aggregate failed: ", reason), 0);
  }
}

bool ClusterState::IsGroupAggregate(uint64_t id) const { return groups_.IsAggregate(id); }

void ClusterState::FailGroupAggregate(uint64_t id, const std::string& reason) {
  if (!groups_.IsAggregate(id)) return;
  const GroupPush group = *groups_.Take(id);
  for (const GroupPart& part : group.parts) {
    if (!group.released) {
      // Skipped at its shard (a held sum never released is never applied),
      // and no longer summed at the aggregator.
      Enqueue(part.host, commands::CancelDelivery(part.id, part.server, group.sequence, reason));
      Enqueue(group.aggregator, commands::CancelDelivery(part.id, part.server, 0, reason));
    }
  }
  const std::string why =
      group.released
          ? absl::StrCat(reason, " (after every shard had its part of the aggregate: shards "
                                 "that applied theirs keep it)")
          : absl::StrCat("its in-network aggregate failed: ", reason, "; no shard applied it");
  for (uint64_t member : group.constituents) {
    auto record = updates_.find(member);
    if (record == updates_.end()) continue;
    record->second.aggregate_id = 0;  // the aggregate is gone already
    record->second.sequence = 0;      // its shards skip the position (above)
    Complete(member, v1::OUTCOME_FAILED, why, 0);
  }
}

bool ClusterState::EndGroupPush(uint64_t push_id, uint64_t sequence, const std::string& reason) {
  std::optional<GroupPush> push = groups_.Take(push_id);
  if (!push) return false;
  for (const GroupPart& part : push->parts) {
    // A held part never released is never applied: skipping it keeps the
    // shard's later pushes moving.
    if (!push->released && sequence != 0) {
      Enqueue(part.host, commands::CancelDelivery(part.id, part.server, sequence, reason));
    }
  }
  return true;
}

void ClusterState::FailRound(const std::string& job_name, const std::string& server_name,
                             int64_t round, const std::string& reason) {
  JobState* job = FindJob(job_name);
  if (job == nullptr) return;
  auto server = job->servers.find(server_name);
  if (server == job->servers.end()) return;
  RoundState& state = server->second.rounds[round];
  if (!state.failed.empty()) return;  // already failing (re-entered from Complete)
  state.failed = reason;
  if (MemberSizedRounds(*job, server->second)) {
    // Which members the round was counted against.
    if (state.generation == 0) state.generation = job->membership.generation();
    state.failed = absl::StrCat(reason, " (round ", round, " opened at membership generation ",
                                state.generation, ")");
  }
  // A failed round still uses its number: the workers' next round is
  // round + 1, so one bad round does not wedge the collective.
  server->second.model_version = std::max(server->second.model_version, round + 1);
  MLF_LOG(WARNING) << "job " << job_name << ": round " << round << " of server " << server_name
                   << " failed: " << state.failed;
  Enqueue(server->second.host, commands::FailRound(server_name, round, job->id, state.failed));
  std::vector<uint64_t> members;
  for (const auto& [id, record] : updates_) {
    if (record.job == job_name && record.server == server_name && record.version == round &&
        (record.round_member || record.state == UpdateState::kPending)) {
      members.push_back(id);
    }
  }
  for (uint64_t id : members) {
    auto& pending = server->second.pending;
    pending.erase(std::remove(pending.begin(), pending.end(), id), pending.end());
    Complete(id, v1::OUTCOME_FAILED, absl::StrCat("round ", round, " failed: ", state.failed),
             0);
  }
}

void ClusterState::MarkHostDown(const std::string& host_name, const std::string& reason) {
  if (!hosts_.MarkDown(host_name)) return;
  outbox_->Close(host_name);
  MLF_LOG(WARNING) << "host " << host_name << " is down: " << reason;
  FailAggregatesOn(host_name, reason);
  const std::vector<uint64_t> to_fail = TakeUpdatesThrough(host_name);
  EndReplicaCopiesOn(host_name, reason);
  for (uint64_t id : to_fail) {
    auto record = updates_.find(id);
    if (record == updates_.end()) continue;  // ended already (its round or aggregate failed)
    if (record->second.src_host == host_name) {
      // Its bytes may be at its server's daemon already.
      FailWhenCancelled(id, absl::StrCat("source host ", host_name, " is down: ", reason));
    } else {
      Complete(id, v1::OUTCOME_FAILED,
               absl::StrCat("server host ", host_name, " is down: ", reason), 0);
    }
  }
}

void ClusterState::FailAggregatesOn(const std::string& host_name, const std::string& reason) {
  const std::vector<uint64_t> aggregates_there =
      aggregates_.Select([&](const AggregateRecord& aggregate) {
        bool there = aggregate.host == host_name;
        for (const AggregateRecord::Hop& hop : aggregate.hops) {
          there = there || hop.host == host_name;
        }
        return there;
      });
  for (uint64_t id : aggregates_there) {
    // It may have sent its whole sum to the server already.
    FailAggregateWhenCancelled(id,
                               absl::StrCat("aggregator host ", host_name, " is down: ", reason));
  }
  // Group aggregates whose sums are not all out.
  for (uint64_t id : groups_.AggregatesUnreleasedAt(host_name)) {
    FailGroupAggregate(id, absl::StrCat("aggregator host ", host_name, " is down: ", reason));
  }
}

std::vector<uint64_t> ClusterState::TakeUpdatesThrough(const std::string& host_name) {
  std::vector<uint64_t> to_fail;
  for (auto& [id, record] : updates_) {
    JobState* job = FindJob(record.job);
    if (job == nullptr) continue;
    ServerState& server = job->servers[record.server];
    bool source_down = record.src_host == host_name;
    bool server_down = server.host == host_name;
    for (const ShardSlot& shard : server.shards) {  // a server group's
      auto s = job->servers.find(shard.server);
      server_down = server_down || (s != job->servers.end() && s->second.host == host_name);
    }
    // Every part of this group push (or of its group aggregate) is at its
    // shard already.
    if (const GroupPush* group =
            groups_.Find(record.aggregate_id != 0 ? record.aggregate_id : id);
        group != nullptr && group->released) {
      source_down = false;
    }
    if (!source_down && !server_down) continue;
    if (record.state == UpdateState::kPending) {
      auto& pending = server.pending;
      pending.erase(std::remove(pending.begin(), pending.end(), id), pending.end());
    }
    to_fail.push_back(id);
  }
  return to_fail;
}

void ClusterState::EndReplicaCopiesOn(const std::string& host_name, const std::string& reason) {
  // Replica copies from or to the host are gone; a replica that is gone
  // takes its punted copies with it.
  std::vector<std::pair<uint64_t, const char*>> copies_there;  // with the host's role
  replicas_.ForEachCopy([&](uint64_t id, ReplicaCopy& copy) {
    // A held copy (or aggregate) from the host, or fed by it, may be whole
    // at the replica already: its pushes' outcomes decide it
    // (SettleHeldCopies), as long as the replica is there.
    const bool feeds_it =
        std::find(copy.feeders.begin(), copy.feeders.end(), host_name) != copy.feeders.end();
    if (copy.held && (copy.src_host == host_name || feeds_it) && copy.replica_host != host_name) {
      copy.source_down = true;
      return;
    }
    if (copy.src_host == host_name || copy.replica_host == host_name || feeds_it) {
      const char* role = copy.replica_host == host_name ? "replica"
                         : copy.src_host == host_name && !copy.constituents.empty()
                             ? "aggregator"
                             : "source";
      copies_there.emplace_back(id, role);
    }
  });
  for (const auto& [id, role] : copies_there) {
    EndReplicaCopy(id, /*applied=*/false,
                   absl::StrCat(role, " host ", host_name,
                                " is down: ", reason),
                   0);
  }
  for (auto& [job_name, job] : jobs_) {
    for (auto& [server_name, server] : job.servers) {
      auto replica = job.replica_hosts.find(server_name);
      if (replica != job.replica_hosts.end() && replica->second == host_name) {
        DropReplicaPending(&server, absl::StrCat("replica host ", host_name, " is down"));
        // What it lacked went with it; a replica registering later starts
        // from its own model.
        server.replica.missed = 0;
        server.replica.missed_norm = 0;
      }
    }
  }
}

void ClusterState::FailWhenCancelled(uint64_t transfer_id, const std::string& reason) {
  auto it = updates_.find(transfer_id);
  if (it == updates_.end()) return;
  UpdateRecord& record = it->second;
  if (!record.cancel_pending.empty()) return;  // asked already
  if (const GroupPush* group = groups_.Find(transfer_id)) {
    // Its parts are held at the shards until all are in: none was applied
    // unless they were released, and Complete cancels those that were not.
    Complete(transfer_id, v1::OUTCOME_FAILED,
             group->released
                 ? absl::StrCat(reason, " (after every shard had its part: shards that "
                                        "applied theirs keep it)")
                 : reason,
             0);
    return;
  }
  if (record.state == UpdateState::kInFlight && record.aggregate_id != 0) {
    FailAggregateWhenCancelled(record.aggregate_id,
                               absl::StrCat("constituent ", transfer_id, " from ", record.src_host,
                                            " failed: ", reason));
    return;
  }
  const HostState* server_host = nullptr;
  if (JobState* job = FindJob(record.job)) {
    if (auto server = job->servers.find(record.server); server != job->servers.end()) {
      server_host = AliveHost(server->second.host);
    }
  }
  if (record.state != UpdateState::kInFlight || record.sequence == 0 || record.aggregate_id != 0 ||
      record.round_member || server_host == nullptr) {
    Complete(transfer_id, v1::OUTCOME_FAILED, reason, 0);
    return;
  }
  record.cancel_pending = reason;
  record.cancel_deadline_s =
      clock_->NowSeconds() + 2 * config_.keepalive_s + config_.transfer_slack_s;
  const std::string server_host_name = FindJob(record.job)->servers[record.server].host;
  Enqueue(server_host_name, commands::CancelDelivery(transfer_id, record.server, record.sequence,
                                                     reason, /*confirm=*/true));
}

void ClusterState::FailAggregateWhenCancelled(uint64_t aggregate_id, const std::string& reason) {
  // A group aggregate's sums are held at the shards until all are in:
  // none was applied unless they were released (FailGroupAggregate says so).
  if (IsGroupAggregate(aggregate_id)) {
    FailGroupAggregate(aggregate_id, reason);
    return;
  }
  AggregateRecord* found = aggregates_.Find(aggregate_id);
  if (found == nullptr) return;
  AggregateRecord& aggregate = *found;
  if (!aggregate.cancel_pending.empty()) return;  // asked already
  const HostState* server_host = nullptr;
  if (JobState* job = FindJob(aggregate.job)) {
    if (auto server = job->servers.find(aggregate.server); server != job->servers.end()) {
      server_host = AliveHost(server->second.host);
    }
  }
  if (aggregate.sequence == 0 || server_host == nullptr) {
    FailAggregate(aggregate_id, reason);
    return;
  }
  aggregate.cancel_pending = reason;
  aggregate.cancel_deadline_s =
      clock_->NowSeconds() + 2 * config_.keepalive_s + config_.transfer_slack_s;
  Enqueue(FindJob(aggregate.job)->servers[aggregate.server].host,
          commands::CancelDelivery(aggregate_id, aggregate.server, aggregate.sequence, reason,
                                   /*confirm=*/true));
}

bool ClusterState::AwaitingCancel(const UpdateRecord& record) const {
  if (!record.cancel_pending.empty()) return true;
  if (record.aggregate_id == 0) return false;
  const AggregateRecord* aggregate = aggregates_.Find(record.aggregate_id);
  return aggregate != nullptr && !aggregate->cancel_pending.empty();
}

void ClusterState::FailTransfer(uint64_t transfer_id, const std::string& reason,
                                double grace_s) {
  auto it = updates_.find(transfer_id);
  if (it == updates_.end()) return;
  UpdateRecord& record = it->second;
  if (!record.cancel_pending.empty()) {
    // Its server's daemon skipped it, as asked: it fails for the first reason.
    const std::string why = record.cancel_pending;
    Complete(transfer_id, v1::OUTCOME_FAILED, why, 0);
    return;
  }
  const bool copy_moving = !replicas_.CopiesOf(transfer_id).empty();
  if ((record.replica_ahead || copy_moving) && grace_s > 0 && record.failure_pending.empty()) {
    record.failure_pending = reason;
    record.fail_at_s = clock_->NowSeconds() + grace_s;
    MLF_LOG(INFO) << "push " << transfer_id << " failed to reach its server (" << reason
                  << "), but its replica holds its copy: waiting " << grace_s
                  << " s for a failover before failing it";
    return;
  }
  Complete(transfer_id, v1::OUTCOME_FAILED, reason, 0);
}

void ClusterState::ExpireOverdue(double now_s) {
  std::vector<uint64_t> pending_failures;
  for (const auto& [id, record] : updates_) {
    if (!record.failure_pending.empty() && now_s >= record.fail_at_s) pending_failures.push_back(id);
  }
  for (uint64_t id : pending_failures) {
    auto it = updates_.find(id);
    if (it == updates_.end()) continue;
    const std::string reason = it->second.failure_pending;
    // No failover came: its copy must not make the replica hold what the
    // server never applied, if it can still be stopped.
    for (uint64_t copy : replicas_.CopiesOf(id)) {
      EndReplicaCopy(copy, /*applied=*/false, reason, 0);
    }
    Complete(id, v1::OUTCOME_FAILED, reason, 0);
  }
  // Cancellations their server's daemon never confirmed (it never answers:
  // a lost command); not waited for longer.
  std::vector<uint64_t> unconfirmed;
  for (const auto& [id, record] : updates_) {
    if (!record.cancel_pending.empty() && now_s > record.cancel_deadline_s) {
      unconfirmed.push_back(id);
    }
  }
  for (uint64_t id : unconfirmed) {
    auto it = updates_.find(id);
    if (it == updates_.end()) continue;
    const std::string reason = absl::StrCat(
        it->second.cancel_pending, " (its server's daemon did not confirm skipping it)");
    Complete(id, v1::OUTCOME_FAILED, reason, 0);
  }
  const std::vector<uint64_t> unconfirmed_aggregates =
      aggregates_.Select([now_s](const AggregateRecord& aggregate) {
        return !aggregate.cancel_pending.empty() && now_s > aggregate.cancel_deadline_s;
      });
  for (uint64_t id : unconfirmed_aggregates) {
    const AggregateRecord* aggregate = aggregates_.Find(id);
    if (aggregate == nullptr) continue;
    const std::string reason = absl::StrCat(
        aggregate->cancel_pending, " (its server's daemon did not confirm skipping it)");
    FailAggregate(id, reason);
  }
  std::vector<uint64_t> overdue;
  for (const auto& [id, record] : updates_) {
    if (record.state == UpdateState::kInFlight && now_s > record.planned.deadline_s &&
        !AwaitingCancel(record)) {
      overdue.push_back(id);
    }
  }
  for (uint64_t id : overdue) {
    auto it = updates_.find(id);
    if (it == updates_.end()) continue;  // ended with an earlier one's aggregate or round
    const UpdateRecord& record = it->second;
    const std::string reason = absl::StrCat(
        "timed out: transfer ", id, " from ", record.src_host, " to ", record.planned.dst,
        " was planned to end at ", record.planned.end_s, " s and was not completed within ",
        config_.transfer_slack_s, " s after that (slow or vanished daemon)");
    ++stats.timed_out;
    FailWhenCancelled(id, reason);
  }
}

void ClusterState::CancelReplicaCopy(uint64_t copy_id, const ReplicaCopy& copy,
                                     const std::string& reason) {
  // The replica's daemon delivers in sequence: tell it to skip this one.
  Enqueue(copy.replica_host,
          commands::CancelDelivery(copy_id, copy.to_promoted ? copy.server : "replica:" + copy.server,
                                   copy.sequence, reason));
}

void ClusterState::EndReplicaCopy(uint64_t copy_id, bool applied, const std::string& reason,
                                  int64_t model_version) {
  std::optional<ReplicaCopy> taken = replicas_.TakeCopy(copy_id);
  if (!taken) return;
  const ReplicaCopy copy = std::move(*taken);
  JobState* job = FindJob(copy.job);
  double norm = 0;
  if (job != nullptr) norm = EndReplicaCopyAtServer(copy_id, copy, job, applied, model_version);
  if (!applied) FailReplicaCopy(copy_id, copy, job, norm, reason);
  // Pushes in flight to a server that failed over end as their copy did.
  for (UpdateRecord& record : replicas_.TakeDecidedBy(copy_id)) {
    EndDecidedByCopy(std::move(record), applied, reason, model_version);
  }
}

double ClusterState::EndReplicaCopyAtServer(uint64_t copy_id, const ReplicaCopy& copy,
                                            JobState* job, bool applied, int64_t model_version) {
  double norm = 0;
  ServerState& server = job->servers[copy.server];
  if (auto in_flight = server.replica.in_flight.find(copy_id);
      in_flight != server.replica.in_flight.end()) {
    norm = in_flight->second;
    server.replica.in_flight.erase(in_flight);
  }
  if (applied) {
    server.replica.applied += copy.Updates();
    // After a failover the replica is the server: its version is the model's.
    if (copy.failover) server.model_version = std::max(server.model_version, model_version);
    if (auto source = updates_.find(copy.source); source != updates_.end()) {
      source->second.replica_ahead = true;
    }
    for (uint64_t member : copy.constituents) {
      if (auto source = updates_.find(member); source != updates_.end()) {
        source->second.replica_ahead = true;
      }
    }
  }
  return norm;
}

void ClusterState::FailReplicaCopy(uint64_t copy_id, const ReplicaCopy& copy, JobState* job,
                                   double norm, const std::string& reason) {
  if (copy.constituents.empty()) {
    MLF_LOG(WARNING) << "replica copy " << copy_id << " of push " << copy.source
                     << " failed: " << reason;
  } else {
    MLF_LOG(WARNING) << "replica aggregate " << copy_id << " of " << copy.constituents.size()
                     << " copies (pushes " << copy.constituents.front() << ".."
                     << copy.constituents.back() << ") failed: " << reason;
  }
  CancelReplicaCopy(copy_id, copy, reason);
  // Pushes in the server's model and now never in the replica's: the
  // copy's push if it applied, an aggregate's pushes that applied.
  int64_t missed = 0;
  double missed_norm = 0;
  if (copy.constituents.empty()) {
    if (const RecentOutcome* told = outcomes_.Find(copy.source);
        told != nullptr && told->outcome == v1::OUTCOME_APPLIED) {
      missed = 1;
      missed_norm = norm;
    }
  } else {
    for (const auto& [member, member_norm] : copy.applied_members) {
      ++missed;
      missed_norm += member_norm;
    }
    // Its pushes still in flight get a copy of their own once applied
    // (§5.3's punted copies: their sources keep the bytes).
    for (uint64_t member : copy.unsettled) {
      if (auto record = updates_.find(member); record != updates_.end()) {
        record->second.replica_punted = true;
      }
    }
  }
  if (!copy.failover && job != nullptr && missed > 0) {
    ReplicaTrack& replica = job->servers[copy.server].replica;
    replica.missed += missed;
    replica.missed_norm += missed_norm;
  }
  // Its update is in the old server's model and now in no model.
  if (copy.failover && job != nullptr) {
    for (auto failover = job->failovers.rbegin(); failover != job->failovers.rend();
         ++failover) {
      if (failover->server != copy.server) continue;
      failover->lost_updates += copy.Updates();
      failover->lost_norm += norm;
      break;
    }
  }
}

void ClusterState::EndDecidedByCopy(UpdateRecord record, bool applied, const std::string& reason,
                                    int64_t model_version) {
  const uint64_t id = record.transfer_id;
  updates_[id] = std::move(record);
  if (applied) {
    Complete(id, v1::OUTCOME_APPLIED, "", model_version);
  } else {
    Complete(id, v1::OUTCOME_FAILED,
             absl::StrCat("its server failed over while it was in flight, and its copy to the "
                          "promoted replica failed: ",
                          reason),
             0);
  }
}

void ClusterState::DropReplicaPending(ServerState* server, const std::string& reason) {
  for (const PendingReplica& pending : server->replica.pending) {
    Enqueue(pending.src_host, commands::ReleaseHold(pending.id, reason));
  }
  if (!server->replica.pending.empty()) {
    MLF_LOG(WARNING) << "dropping " << server->replica.pending.size()
                     << " punted replica copies: " << reason;
  }
  server->replica.pending.clear();
}

void ClusterState::ReserveDistribution(std::vector<DistributionLeg> legs) {
  const double now_s = clock_->NowSeconds();
  distribution_legs_.erase(
      std::remove_if(distribution_legs_.begin(), distribution_legs_.end(),
                     [now_s](const DistributionLeg& leg) { return leg.end_s <= now_s; }),
      distribution_legs_.end());
  for (DistributionLeg& leg : legs) distribution_legs_.push_back(std::move(leg));
}

void ClusterState::Reservations(std::map<std::string, std::vector<core::RateSegment>>* up,
                                std::map<std::string, std::vector<core::RateSegment>>* down,
                                const absl::flat_hash_set<std::string>* hosts) const {
  auto add = [&](const std::vector<core::RateSegment>& segments, const std::string& src,
                 const std::string& dst) {
    if (hosts == nullptr || hosts->count(src) > 0) AppendSegments(segments, &(*up)[src]);
    if (hosts == nullptr || hosts->count(dst) > 0) AppendSegments(segments, &(*down)[dst]);
  };
  for (const auto& [id, record] : updates_) {
    if (record.state != UpdateState::kInFlight) continue;
    if (const GroupPush* group = groups_.Find(id)) {
      for (const GroupPart& part : group->parts) {
        add(part.planned.segments, part.planned.src, part.planned.dst);
      }
      continue;
    }
    if (IsGroupAggregate(record.aggregate_id)) continue;  // below, once
    add(record.planned.segments, record.planned.src, record.planned.dst);
  }
  const double now_s = clock_->NowSeconds();
  for (const DistributionLeg& leg : distribution_legs_) {
    if (leg.end_s <= now_s) continue;
    add(leg.segments, leg.src, leg.dst);
  }
  replicas_.ForEachCopy([&](uint64_t /*id*/, const ReplicaCopy& copy) {
    for (const ReplicaCopy::Leg& leg : copy.legs) add(leg.segments, leg.src, leg.dst);
  });
  aggregates_.ForEach([&](const AggregateRecord& aggregate) {
    add(aggregate.planned.segments, aggregate.planned.src, aggregate.planned.dst);
    for (const AggregateRecord::Hop& hop : aggregate.hops) {
      add(hop.planned.segments, hop.planned.src, hop.planned.dst);
    }
  });
  groups_.ForEach([&](uint64_t /*id*/, const GroupPush& group) {
    if (group.constituents.empty()) return;  // a push's own: above
    for (const TransferView& feed : group.feeds) add(feed.segments, feed.src, feed.dst);
    for (const GroupPart& part : group.parts) {
      add(part.planned.segments, part.planned.src, part.planned.dst);
    }
  });
}

void ClusterState::RecordDrop(const UpdateRecord& record, v1::Outcome outcome,
                              const std::string& category, const std::string& reason) {
  DropView drop;
  drop.transfer_id = record.transfer_id;
  drop.job = record.job;
  drop.server = record.server;
  drop.src = record.src_host;
  drop.outcome = outcome == v1::OUTCOME_DROPPED ? "dropped" : "failed";
  drop.category = category;
  drop.reason = reason;
  drop.at_s = clock_->NowSeconds();
  history_->RecordDrop(std::move(drop));
}

}  // namespace mlfabric
