#include "scheduler/service/plan_dispatcher.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "scheduler/service/commands.h"
#include "scheduler/service/plan_dispatcher_run.h"
#include "scheduler/service/round_grants.h"

namespace mlfabric {

PlanDispatcher::PlanDispatcher(const SchedulerConfig& config, ClusterState* state,
                               AdminHistory* history)
    : config_(config), state_(state), history_(history) {}

void PlanDispatcher::Apply(const BatchWork& work, const std::string& planner_name) {
  JobState* job = state_->FindJob(work.job);
  if (job == nullptr) return;
  state_->stats.plan_ms_total += work.compute_ms;
  state_->stats.plan_ms_max = std::max(state_->stats.plan_ms_max, work.compute_ms);
  Run run(*this, work, job);
  history_->RecordBatch(run.Dispatch(planner_name));
}

TransferView PlanDispatcher::Run::Planned(uint64_t id, const std::string& src,
                                          const std::string& dst, int64_t bytes,
                                          const core::Transfer& transfer,
                                          double deadline_s) const {
  TransferView planned;
  planned.transfer_id = id;
  planned.batch_id = work_.batch_id;
  planned.job = work_.job;
  planned.server = work_.server;
  planned.src = src;
  planned.dst = dst;
  planned.bytes = bytes;
  planned.start_s = transfer.start_s;
  planned.end_s = transfer.end_s;
  planned.deadline_s = deadline_s;
  planned.planned_at_s = work_.batch.now_s;
  planned.segments = transfer.segments;
  return planned;
}

commands::Expect PlanDispatcher::Run::PushExpect(const UpdateRecord& record,
                                                  uint64_t transfer_id, const std::string& server,
                                                  int64_t bytes) const {
  commands::Expect expect;
  expect.transfer_id = transfer_id;
  expect.job_id = job_.id;
  expect.server = server;
  expect.sequence = record.sequence;
  expect.bytes = bytes;
  expect.src_host = record.src_host;
  expect.worker = record.worker;
  expect.version = record.version;
  expect.norm = record.norm;
  expect.dtype = record.dtype;
  return expect;
}

void PlanDispatcher::Run::FailAll(const std::set<uint64_t>& ids, const std::string& reason) {
  for (uint64_t id : ids) state_.Complete(id, v1::OUTCOME_FAILED, reason, 0);
}

void PlanDispatcher::Run::RecordBatch() {
  const absl::StatusOr<core::Plan>& plan = work_.plan;
  view_.id = work_.batch_id;
  view_.job = work_.job;
  view_.server = work_.server;
  view_.server_host = work_.batch.server;
  view_.planned_at_s = work_.batch.now_s;
  view_.compute_ms = work_.compute_ms;
  view_.worker_thread = work_.worker_thread;
  view_.updates = static_cast<int64_t>(work_.batch.updates.size());
  view_.network = work_.batch.hosts;
  if (plan.ok()) {
    view_.drops = plan->dropped;
  } else {
    view_.error = std::string(plan.status().message());
  }
  view_.dropped = static_cast<int64_t>(view_.drops.size());
}

BatchView PlanDispatcher::Run::Dispatch(const std::string& planner_name) {
  const absl::StatusOr<core::Plan>& plan = work_.plan;
  RecordBatch();

  std::set<uint64_t> in_batch;
  for (const core::UpdateRequest& update : work_.batch.updates) {
    in_batch.insert(std::stoull(update.id));
  }
  // Updates that failed while the batch was being planned are gone already.
  auto& pending = server_.pending;
  pending.erase(std::remove_if(pending.begin(), pending.end(),
                               [&](uint64_t id) { return in_batch.count(id) > 0; }),
                pending.end());
  if (!plan.ok()) {
    MLF_LOG(ERROR) << "planner " << planner_name << " failed for server " << work_.server
                   << ": " << plan.status().message();
    FailAll(in_batch, absl::StrCat("scheduler could not plan: ", plan.status().message()));
    return std::move(view_);
  }
  const HostState* server_host = state_.AliveHost(server_.host);
  if (server_host == nullptr) {
    FailAll(in_batch, absl::StrCat("server host ", server_.host, " is down"));
    return std::move(view_);
  }
  for (const core::Drop& drop : plan->dropped) {
    const uint64_t id = std::stoull(drop.id);
    if (state_.pushes().count(id)) state_.Complete(id, v1::OUTCOME_DROPPED, drop.reason, 0);
  }
  if (!server_.shards.empty()) {
    DispatchGroup(*plan);
    return std::move(view_);
  }
  const PlanIndex index = IndexPlan(*plan);
  for (const std::string& id_text : plan->order) DispatchUpdate(id_text, index, *server_host);
  DispatchReplica(*plan);
  return std::move(view_);
}

PlanDispatcher::Run::PlanIndex PlanDispatcher::Run::IndexPlan(const core::Plan& plan) {
  PlanIndex index;
  for (const core::Transfer& transfer : plan.transfers) {
    if (transfer.kind == core::TransferKind::kDirect) index.direct[transfer.update] = &transfer;
    if (transfer.kind == core::TransferKind::kToAggregator) {
      index.to_aggregator[transfer.update] = &transfer;
    }
    if (transfer.kind == core::TransferKind::kAggregate) {
      if (!transfer.into.empty()) {
        index.feeds[transfer.into] = &transfer;
        continue;
      }
      for (const std::string& constituent : transfer.constituents) {
        index.aggregate_of[constituent] = &transfer;
      }
    }
  }
  return index;
}

void PlanDispatcher::Run::DispatchUpdate(const std::string& id_text, const PlanIndex& index,
                                         const HostState& server_host) {
  const uint64_t id = std::stoull(id_text);
  auto* it = state_.FindPush(id);
  if (it == nullptr) return;  // failed meanwhile
  if (auto transfer = index.direct.find(id_text); transfer != index.direct.end()) {
    DispatchDirect((*it), *transfer->second, server_host);
    return;
  }
  auto aggregate = index.aggregate_of.find(id_text);
  if (aggregate == index.aggregate_of.end()) {
    state_.Complete(id, v1::OUTCOME_FAILED,
                    "the plan has no transfer for this update (planner bug)", 0);
    return;
  }
  std::vector<const core::Transfer*> chain;
  for (auto up = index.feeds.find(aggregate->second->update); up != index.feeds.end();
       up = index.feeds.find(up->second->update)) {
    chain.insert(chain.begin(), up->second);
  }
  const core::Transfer* hop = nullptr;
  if (auto found = index.to_aggregator.find(id_text); found != index.to_aggregator.end()) {
    hop = found->second;
  }
  // Without a transfer, a chain member is summed at its own host, which
  // must then be the first aggregator the chain names it at.
  bool local = false;
  std::vector<const core::Transfer*> nodes = chain;
  nodes.push_back(aggregate->second);
  for (const core::Transfer* node : nodes) {
    if (std::count(node->constituents.begin(), node->constituents.end(), id_text)) {
      local = node->src == it->src_host;
      break;
    }
  }
  if (hop == nullptr && !local) {
    // An aggregate opened for earlier members would wait for it forever.
    if (auto opened = aggregate_ids_.find(aggregate->second);
        opened != aggregate_ids_.end() && opened->second != 0) {
      state_.FailAggregate(opened->second,
                           absl::StrCat("member ", id, " has no transfer in the plan"));
    }
    state_.Complete(id, v1::OUTCOME_FAILED,
                    "the plan has no transfer for this update (planner bug)", 0);
    return;
  }
  const uint64_t aggregate_id = OpenAggregate(*aggregate->second, chain, server_host);
  if (aggregate_id == 0) {
    state_.Complete(id, v1::OUTCOME_FAILED,
                    absl::StrCat("an aggregator host of its aggregate (",
                                 aggregate->second->src, chain.empty() ? "" : " or a chain hop",
                                 ") is down"),
                    0);
    return;
  }
  if (state_.aggregates().Find(aggregate_id) == nullptr) {  // failed by an earlier member
    state_.Complete(id, v1::OUTCOME_FAILED,
                    "its in-network aggregate failed before it was dispatched", 0);
    return;
  }
  DispatchViaAggregator((*it), hop, aggregate_id, aggregate->second->end_s);
}

void PlanDispatcher::Run::DispatchDirect(UpdateRecord& record, const core::Transfer& transfer,
                                         const HostState& server_host) {
  record.state = UpdateState::kInFlight;
  record.sequence = server_.next_sequence++;
  ++server_.in_flight;
  // A round's member is applied only when its whole round is in.
  const double deadline_s = transfer.end_s + config_.transfer_slack_s +
                            (work_.round_size > 0 ? config_.round_timeout_s : 0);
  record.planned = Planned(record.transfer_id, record.src_host, server_.host, record.bytes,
                           transfer, deadline_s);
  view_.transfers.push_back(record.planned);
  ++view_.scheduled;

  commands::Expect expect = PushExpect(record, record.transfer_id, work_.server, record.bytes);
  expect.round_size = AnnouncedRoundSize(record.version);
  expect.contributions = 1;
  state_.Enqueue(server_.host, commands::ExpectDelivery(expect));
  commands::Send send{record.transfer_id, job_.id, server_.host, server_host.data_address,
                      transfer.start_s, record.bytes};
  send.local_id = record.local_id;
  // A round member's next round may run on this plan (round_grants.h), at
  // the rate it gives this transfer while it sends (waits between its
  // segments, for transfers reserved before it, are not the next round's).
  if (work_.round_size > 0) {
    double sending_s = 0;
    for (const core::RateSegment& segment : transfer.segments) {
      if (segment.rate_bps > 0) sending_s += segment.to_s - segment.from_s;
    }
    const double rate_bps =
        sending_s > 0 ? 8.0 * static_cast<double>(record.bytes) / sending_s : 0.0;
    send.next_round = IssueRoundGrant(&state_, config_, job_, work_.server, &server_, record,
                                      rate_bps, server_host.data_address);
  }
  state_.Enqueue(record.src_host, commands::SendTransfer(send, transfer.segments));
  ++state_.stats.planned;
}

int32_t PlanDispatcher::Run::AnnouncedRoundSize(int64_t round) const {
  if (work_.round_size <= 0) return 0;
  auto known = server_.rounds.find(round);
  return known != server_.rounds.end() && known->second.size > 0 ? known->second.size
                                                                  : work_.round_size;
}

void PlanDispatcher::Run::DispatchViaAggregator(UpdateRecord& record, const core::Transfer* hop,
                                                uint64_t aggregate_id, double aggregate_end_s) {
  const AggregateRecord& aggregate = *state_.aggregates().Find(aggregate_id);  // open
  // A chain member summed where it is: a transfer to its own host, which
  // the daemon folds into the aggregation without a socket.
  core::Transfer local;
  if (hop == nullptr) {
    local.src = local.dst = record.src_host;
    local.start_s = aggregate.planned.start_s;
    local.end_s = local.start_s;
    hop = &local;
  }
  const HostState* aggregator = state_.AliveHost(hop->dst);
  record.state = UpdateState::kInFlight;
  record.sequence = aggregate.sequence;
  record.aggregate_id = aggregate_id;
  ++server_.in_flight;
  // It is applied only when its aggregate is.
  const double deadline_s = aggregate_end_s + config_.transfer_slack_s +
                            (work_.round_size > 0 ? config_.round_timeout_s : 0);
  record.planned =
      Planned(record.transfer_id, record.src_host, hop->dst, record.bytes, *hop, deadline_s);
  view_.transfers.push_back(record.planned);
  ++view_.scheduled;
  commands::Send send{record.transfer_id, job_.id, hop->dst,
                      aggregator ? aggregator->data_address : std::string(), hop->start_s,
                      record.bytes};
  send.local_id = record.local_id;
  state_.Enqueue(record.src_host, commands::SendTransfer(send, hop->segments));
  ++state_.stats.planned;
}

std::vector<uint64_t> PlanDispatcher::Run::LiveConstituents(const core::Transfer& transfer) const {
  std::vector<uint64_t> constituents;
  for (const std::string& text : transfer.constituents) {
    const uint64_t constituent = std::stoull(text);
    if (state_.pushes().count(constituent)) constituents.push_back(constituent);
  }
  return constituents;
}

uint64_t PlanDispatcher::Run::OpenAggregate(const core::Transfer& transfer,
                                            const std::vector<const core::Transfer*>& chain,
                                            const HostState& server_host) {
  if (auto known = aggregate_ids_.find(&transfer); known != aggregate_ids_.end()) {
    return known->second;
  }
  uint64_t id = 0;
  const std::vector<uint64_t> constituents = LiveConstituents(transfer);
  bool hosts_alive = state_.AliveHost(transfer.src) != nullptr;
  for (const core::Transfer* hop : chain) hosts_alive = hosts_alive && state_.AliveHost(hop->src);
  if (hosts_alive && !constituents.empty()) {
    id = state_.NewTransferId();
    AggregateRecord& aggregate = state_.aggregates().Open(id);
    aggregate.job = work_.job;
    aggregate.server = work_.server;
    aggregate.host = transfer.src;
    aggregate.constituents = constituents;
    aggregate.sequence = server_.next_sequence++;
    aggregate.planned = Planned(id, transfer.src, server_.host, transfer.bytes, transfer,
                                transfer.end_s + config_.transfer_slack_s);
    view_.transfers.push_back(aggregate.planned);
    const UpdateRecord& first = state_.pushes().at(constituents.front());  // live, above
    ExpectAggregate(transfer, aggregate, first);
    SendAggregateTasks(transfer, chain, server_host, first, &aggregate);
  }
  aggregate_ids_[&transfer] = id;
  return id;
}

void PlanDispatcher::Run::ExpectAggregate(const core::Transfer& transfer,
                                          const AggregateRecord& aggregate,
                                          const UpdateRecord& first) {
  const std::vector<uint64_t>& constituents = aggregate.constituents;
  commands::Expect expect;
  expect.transfer_id = aggregate.id;
  expect.job_id = job_.id;
  expect.server = work_.server;
  expect.sequence = aggregate.sequence;
  expect.bytes = transfer.bytes;
  expect.src_host = transfer.src;
  expect.worker = absl::StrCat("aggregate of ", constituents.size());
  expect.version = first.version;
  expect.constituents = constituents;
  expect.round_size = AnnouncedRoundSize(first.version);
  expect.contributions = static_cast<int32_t>(constituents.size());
  expect.dtype = first.dtype;
  state_.Enqueue(server_.host, commands::ExpectDelivery(expect));
}

void PlanDispatcher::Run::SendAggregateTasks(const core::Transfer& transfer,
                                             const std::vector<const core::Transfer*>& chain,
                                             const HostState& server_host,
                                             const UpdateRecord& first,
                                             AggregateRecord* aggregate) {
  const uint64_t id = aggregate->id;
  // A chain: every hop sums what reaches its host (the previous hop's
  // partial sum and the members added there) and streams it on.
  uint64_t upstream = 0;
  std::vector<uint64_t> summed;  // constituents in the partial sums so far
  std::vector<const core::Transfer*> nodes = chain;
  nodes.push_back(&transfer);
  for (size_t j = 0; j < nodes.size(); ++j) {
    const core::Transfer& node = *nodes[j];
    const bool last = j + 1 == nodes.size();
    const uint64_t node_id = last ? id : state_.NewTransferId();
    commands::Aggregate task;
    task.aggregate_id = node_id;
    task.job_id = job_.id;
    if (upstream != 0) task.constituents.push_back(upstream);
    for (uint64_t member : LiveConstituents(node)) {
      if (std::find(summed.begin(), summed.end(), member) != summed.end()) continue;
      task.constituents.push_back(member);
      summed.push_back(member);
    }
    const HostState* next = last ? &server_host : state_.AliveHost(node.dst);
    task.dst_host = last ? server_.host : node.dst;
    task.dst_address = next != nullptr ? next->data_address : std::string();
    task.start_s = node.start_s;
    task.bytes = node.bytes;
    task.dtype = first.dtype;
    state_.Enqueue(node.src, commands::AggregateTask(task, node.segments));
    ++(last ? state_.stats.aggregates : state_.stats.chain_hops);
    if (!last) {
      AggregateRecord::Hop hop;
      hop.id = node_id;
      hop.host = node.src;
      hop.planned = Planned(node_id, node.src, node.dst, node.bytes, node,
                            transfer.end_s + config_.transfer_slack_s);
      view_.transfers.push_back(hop.planned);
      state_.aggregates().AddHop(id, std::move(hop));
    }
    upstream = node_id;
  }
}

void PlanDispatcher::Run::DispatchReplica(const core::Plan& plan) {
  auto replica = job_.replica_hosts.find(work_.server);
  if (replica == job_.replica_hosts.end() || !work_.batch.replica.has_value()) return;
  const HostState* replica_host = state_.AliveHost(replica->second);
  if (replica_host == nullptr) return;
  std::map<std::string, const core::Transfer*> copies;      // direct, by update
  std::map<std::string, const core::Transfer*> feeds;       // to an aggregator, by update
  std::map<std::string, const core::Transfer*> aggregate_of;  // update -> its aggregate
  for (const core::Transfer& t : plan.transfers) {
    if (t.kind == core::TransferKind::kReplica) {
      (t.dst == replica->second ? copies : feeds)[t.update] = &t;
    } else if (t.kind == core::TransferKind::kReplicaAggregate) {
      for (const std::string& c : t.constituents) aggregate_of[c] = &t;
    }
  }
  // Copies go in the replica's commit order, which is also its delivery
  // order (§5.3); an aggregate takes the position of its first constituent.
  std::set<const core::Transfer*> sent_aggregates;
  for (const core::Commit& commit : plan.replica_commits) {
    if (auto aggregate = aggregate_of.find(commit.update); aggregate != aggregate_of.end()) {
      if (sent_aggregates.insert(aggregate->second).second) {
        DispatchReplicaAggregate(*aggregate->second, feeds, replica->second, *replica_host);
      }
      continue;
    }
    auto transfer = copies.find(commit.update);
    if (transfer == copies.end()) continue;
    const uint64_t source = std::stoull(commit.update);
    PendingReplica what;
    // A copy of a push still in flight waits at the replica for its outcome.
    bool held = false;
    if (auto* record = state_.FindPush(source)) {
      what = {source,          record->src_host, record->worker, record->bytes,
              record->version, record->norm,     record->dtype};
      held = true;
    } else if (std::optional<PendingReplica> punted = TakePunted(source)) {
      what = *punted;
    } else {
      continue;  // failed meanwhile
    }
    const uint64_t copy = state_.NewTransferId();
    ReplicaCopy record{work_.job, work_.server, source, what.src_host,
                       replica->second, server_.replica.next_sequence};
    record.held = held;
    record.legs = {{what.src_host, replica->second, transfer->second->segments}};
    state_.replicas().AddCopy(copy, std::move(record));
    server_.replica.in_flight[copy] = what.norm;

    commands::Expect expect = ReplicaExpect(copy, what.src_host, what);
    expect.held = held;
    expect.source = source;
    state_.Enqueue(replica->second, commands::ExpectDelivery(expect));
    commands::Send send{copy, job_.id, replica->second, replica_host->data_address,
                        transfer->second->start_s, what.bytes};
    send.source_transfer_id = source;
    state_.Enqueue(what.src_host, commands::SendTransfer(send, transfer->second->segments));
    ++state_.stats.replica_copies;
    state_.stats.replica_bytes += what.bytes;
    ++state_.stats.replica_updates;
  }
  for (const std::string& id_text : plan.punted) {
    auto* record = state_.FindPush(std::stoull(id_text));
    if (record != nullptr) record->replica_punted = true;
  }
}

std::optional<PendingReplica> PlanDispatcher::Run::TakePunted(uint64_t source) {
  auto& punted = server_.replica.pending;
  auto held = std::find_if(punted.begin(), punted.end(),
                           [&](const PendingReplica& p) { return p.id == source; });
  if (held == punted.end()) return std::nullopt;
  PendingReplica what = *held;
  punted.erase(held);
  return what;
}

commands::Expect PlanDispatcher::Run::ReplicaExpect(uint64_t copy, const std::string& src_host,
                                                    const PendingReplica& what) {
  commands::Expect expect;
  expect.transfer_id = copy;
  expect.job_id = job_.id;
  expect.server = "replica:" + work_.server;
  expect.sequence = server_.replica.next_sequence++;
  expect.bytes = what.bytes;
  expect.src_host = src_host;
  expect.worker = what.worker;
  expect.version = what.version;
  expect.norm = what.norm;
  expect.dtype = what.dtype;
  return expect;
}

void PlanDispatcher::Run::DispatchReplicaAggregate(
    const core::Transfer& aggregate, const std::map<std::string, const core::Transfer*>& feeds,
    const std::string& replica_name, const HostState& replica_host) {
  const std::vector<ReplicaMember> members = ReplicaMembers(aggregate, feeds);
  const HostState* aggregator = state_.AliveHost(aggregate.src);
  if (members.empty()) return;
  if (aggregator == nullptr) {
    // Punted copies wait for the next batch; the others become punted.
    for (const ReplicaMember& m : members) {
      if (!m.in_flight) {
        server_.replica.pending.push_back(m.what);
      } else if (auto* record = state_.FindPush(m.what.id)) {
        record->replica_punted = true;
      }
    }
    return;
  }
  const uint64_t id = state_.NewTransferId();
  ReplicaCopy record{work_.job, work_.server, 0, aggregate.src, replica_name,
                     server_.replica.next_sequence};
  PendingReplica sum = members.front().what;
  sum.norm = 0;
  commands::Aggregate task;
  task.aggregate_id = id;
  task.job_id = job_.id;
  task.dst_host = replica_name;
  task.dst_address = replica_host.data_address;
  task.start_s = aggregate.start_s;
  task.bytes = sum.bytes;
  task.dtype = sum.dtype;
  for (const ReplicaMember& member : members) {
    const PendingReplica& what = member.what;
    const core::Transfer* feed = member.feed;
    const uint64_t feed_id = state_.NewTransferId();
    task.constituents.push_back(feed_id);
    record.constituents.push_back(what.id);
    record.norms.push_back(what.norm);
    record.feeders.push_back(what.src_host);
    if (member.in_flight) {
      record.unsettled.insert(what.id);
    } else {
      record.applied_members[what.id] = what.norm;
    }
    state_.replicas().AddFeed(feed_id, id);
    sum.norm += what.norm;  // |sum of u| <= sum of |u|
    sum.version = std::max(sum.version, what.version);
    record.legs.push_back({what.src_host, aggregate.src, feed->segments});
    commands::Send send{feed_id, job_.id, aggregate.src, aggregator->data_address,
                        feed->start_s, what.bytes};
    send.source_transfer_id = what.id;
    state_.Enqueue(what.src_host, commands::SendTransfer(send, feed->segments));
  }
  record.held = !record.unsettled.empty();
  record.legs.push_back({aggregate.src, replica_name, aggregate.segments});
  state_.replicas().AddCopy(id, record);
  server_.replica.in_flight[id] = sum.norm;
  commands::Expect expect = ReplicaExpect(id, aggregate.src, sum);
  expect.constituents = record.constituents;
  expect.held = record.held;
  state_.Enqueue(replica_name, commands::ExpectDelivery(expect));
  state_.Enqueue(aggregate.src, commands::AggregateTask(task, aggregate.segments));
  ++state_.stats.replica_copies;
  ++state_.stats.replica_aggregates;
  state_.stats.replica_bytes += sum.bytes;
  state_.stats.replica_updates += static_cast<int64_t>(members.size());
}

std::vector<PlanDispatcher::Run::ReplicaMember> PlanDispatcher::Run::ReplicaMembers(
    const core::Transfer& aggregate, const std::map<std::string, const core::Transfer*>& feeds) {
  std::vector<ReplicaMember> members;
  for (const std::string& id_text : aggregate.constituents) {
    const uint64_t id = std::stoull(id_text);
    auto feed = feeds.find(id_text);
    if (auto* record = state_.FindPush(id)) {
      if (feed == feeds.end()) continue;
      const UpdateRecord& r = (*record);
      members.push_back({{id, r.src_host, r.worker, r.bytes, r.version, r.norm, r.dtype},
                         feed->second, true});
      continue;
    }
    std::optional<PendingReplica> punted = TakePunted(id);
    if (!punted.has_value()) continue;  // failed meanwhile, or its source is gone
    if (feed == feeds.end()) {
      server_.replica.pending.push_back(*punted);
      continue;
    }
    members.push_back({*punted, feed->second, false});
  }
  return members;
}

}  // namespace mlfabric
