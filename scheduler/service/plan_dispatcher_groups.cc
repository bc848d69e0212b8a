// A server group's batch (server_groups.h): each push's parts, or each
// group aggregate's sums, one per shard, held at the shards under one group
// sequence number.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/service/commands.h"
#include "scheduler/service/plan_dispatcher_run.h"

namespace mlfabric {

void PlanDispatcher::Run::DispatchGroup(const core::Plan& plan) {
  std::map<std::string, std::vector<const core::Transfer*>> transfers;  // by update
  std::map<std::string, std::vector<const core::Transfer*>> feeds;      // to aggregators
  // A group's aggregate is one transfer per shard, all naming the same
  // pushes: by its first push, and the later ones it takes along.
  std::map<std::string, std::vector<const core::Transfer*>> sums;
  std::set<std::string> summed_later;
  for (const core::Transfer& transfer : plan.transfers) {
    if (transfer.kind == core::TransferKind::kDirect) {
      transfers[transfer.update].push_back(&transfer);
    } else if (transfer.kind == core::TransferKind::kToAggregator) {
      feeds[transfer.update].push_back(&transfer);
    } else if (transfer.kind == core::TransferKind::kAggregate &&
               !transfer.constituents.empty()) {
      sums[transfer.constituents.front()].push_back(&transfer);
      summed_later.insert(transfer.constituents.begin() + 1, transfer.constituents.end());
    }
  }
  const size_t shards = server_.shards.size();
  for (const std::string& id_text : plan.order) {
    if (auto sum = sums.find(id_text); sum != sums.end()) {
      DispatchGroupAggregate(sum->second, feeds);
      continue;
    }
    if (summed_later.count(id_text)) continue;  // with its aggregate's first push
    const uint64_t id = std::stoull(id_text);
    auto* it = state_.FindPush(id);
    if (it == nullptr) continue;  // failed meanwhile
    std::vector<const core::Transfer*> parts(shards, nullptr);
    std::vector<const HostState*> hosts(shards, nullptr);
    const std::string problem = MatchGroupParts(transfers[id_text], &parts, &hosts);
    if (!problem.empty()) {
      state_.Complete(id, v1::OUTCOME_FAILED, problem, 0);
      continue;
    }
    DispatchGroupPush(id, (*it), parts, hosts);
  }
}

std::string PlanDispatcher::Run::MatchGroupParts(std::vector<const core::Transfer*> unused,
                                                 std::vector<const core::Transfer*>* parts,
                                                 std::vector<const HostState*>* hosts) {
  std::string problem;
  for (size_t i = 0; i < parts->size() && problem.empty(); ++i) {
    const ShardSlot& slot = server_.shards[i];
    const std::string& host = job_.servers[slot.server].host;
    (*hosts)[i] = state_.AliveHost(host);
    if ((*hosts)[i] == nullptr) {
      problem = absl::StrCat("shard ", i, " ('", slot.server, "') on ", host, " is down");
      break;
    }
    for (auto t = unused.begin(); t != unused.end(); ++t) {
      if ((*t)->dst == host && (*t)->bytes == slot.end - slot.begin) {
        (*parts)[i] = *t;
        unused.erase(t);
        break;
      }
    }
    if ((*parts)[i] == nullptr) {
      problem = absl::StrCat("the plan has no transfer for its part to shard ", i,
                             " (planner bug)");
    }
  }
  return problem;
}

void PlanDispatcher::Run::DispatchGroupPush(uint64_t id, UpdateRecord& record,
                                            const std::vector<const core::Transfer*>& parts,
                                            const std::vector<const HostState*>& hosts) {
  const size_t shards = parts.size();
  record.state = UpdateState::kInFlight;
  record.sequence = server_.next_sequence++;
  ++server_.in_flight;
  double end_s = 0;
  for (const core::Transfer* part : parts) end_s = std::max(end_s, part->end_s);
  const double deadline_s = end_s + config_.transfer_slack_s;
  record.planned =
      Planned(id, record.src_host, server_.host, record.bytes, *parts[0], deadline_s);
  record.planned.end_s = end_s;
  for (size_t i = 0; i < shards; ++i) {
    const ShardSlot& slot = server_.shards[i];
    const core::Transfer& transfer = *parts[i];
    GroupPart part;
    part.id = state_.NewTransferId();
    part.server = slot.server;
    part.host = transfer.dst;
    part.begin = slot.begin;
    part.end = slot.end;
    part.planned = Planned(part.id, record.src_host, part.host, slot.end - slot.begin,
                           transfer, deadline_s);
    view_.transfers.push_back(part.planned);

    commands::Expect expect = PushExpect(record, part.id, slot.server, slot.end - slot.begin);
    expect.held = true;
    expect.group_push = id;
    state_.Enqueue(part.host, commands::ExpectDelivery(expect));
    commands::Send send{part.id, job_.id, part.host, hosts[i]->data_address,
                        transfer.start_s, slot.end - slot.begin};
    send.source_transfer_id = id;
    send.local_id = record.local_id;
    send.part = true;
    send.part_offset = slot.begin;
    state_.Enqueue(record.src_host, commands::SendTransfer(send, transfer.segments));
    state_.groups().AddPart(id, std::move(part));
  }
  ++view_.scheduled;
  ++state_.stats.planned;
}

void PlanDispatcher::Run::DispatchGroupAggregate(
    const std::vector<const core::Transfer*>& sums,
    const std::map<std::string, std::vector<const core::Transfer*>>& feeds) {
  const std::vector<uint64_t> members = LiveConstituents(*sums.front());
  if (members.empty()) return;
  const std::string& aggregator_name = sums.front()->src;
  const size_t shards = server_.shards.size();
  const HostState* aggregator = state_.AliveHost(aggregator_name);
  GroupAggregateParts parts;
  const std::string problem =
      aggregator == nullptr ? absl::StrCat("aggregator host ", aggregator_name, " is down")
                            : MatchGroupAggregate(sums, feeds, members, &parts);
  if (!problem.empty()) {
    for (uint64_t member : members) state_.Complete(member, v1::OUTCOME_FAILED, problem, 0);
    return;
  }
  const uint64_t id = state_.NewTransferId();
  GroupPush& group = state_.groups().Open(id);
  group.constituents = members;
  group.aggregator = aggregator_name;
  group.sequence = server_.next_sequence++;
  double end_s = 0;
  for (const core::Transfer* sum : parts.sum_of) end_s = std::max(end_s, sum->end_s);
  const double deadline_s = end_s + config_.transfer_slack_s;
  // feed[m][i]: member m's part for shard i, on its way to the aggregator.
  std::vector<std::vector<uint64_t>> feed(members.size(), std::vector<uint64_t>(shards));
  for (auto& row : feed) {
    for (uint64_t& f : row) f = state_.NewTransferId();
  }
  SendGroupSums(id, parts, feed, deadline_s, &group);
  ++state_.stats.aggregates;
  SendGroupFeeds(id, parts, feed, *aggregator, end_s, deadline_s, &group);
  view_.transfers.insert(view_.transfers.end(), group.feeds.begin(), group.feeds.end());
}

std::string PlanDispatcher::Run::MatchGroupAggregate(
    const std::vector<const core::Transfer*>& sums,
    const std::map<std::string, std::vector<const core::Transfer*>>& feeds,
    const std::vector<uint64_t>& members, GroupAggregateParts* out) {
  const std::string& aggregator_name = sums.front()->src;
  const size_t shards = server_.shards.size();
  std::vector<const core::Transfer*>& sum_of = out->sum_of;
  std::vector<const HostState*>& hosts = out->hosts;
  std::vector<std::vector<const core::Transfer*>>& part_of = out->part_of;
  sum_of.assign(shards, nullptr);
  hosts.assign(shards, nullptr);
  part_of.assign(members.size(), {});
  for (size_t m = 0; m < members.size(); ++m) {
    auto found = feeds.find(std::to_string(members[m]));
    if (found != feeds.end()) part_of[m] = found->second;
  }
  std::vector<const core::Transfer*> unused_sums = sums;
  for (size_t i = 0; i < shards; ++i) {
    const ShardSlot& slot = server_.shards[i];
    const int64_t size = slot.end - slot.begin;
    const std::string& host = job_.servers[slot.server].host;
    hosts[i] = state_.AliveHost(host);
    if (hosts[i] == nullptr) {
      return absl::StrCat("shard ", i, " ('", slot.server, "') on ", host, " is down");
    }
    for (auto t = unused_sums.begin(); t != unused_sums.end(); ++t) {
      if ((*t)->dst == host && (*t)->bytes == size && (*t)->src == aggregator_name) {
        sum_of[i] = *t;
        unused_sums.erase(t);
        break;
      }
    }
    bool parts_found = sum_of[i] != nullptr;
    for (auto& parts : part_of) {  // a member's part of this size, to the aggregator
      const auto from = parts.begin() + static_cast<std::ptrdiff_t>(std::min(i, parts.size()));
      auto t = std::find_if(from, parts.end(), [&](const core::Transfer* p) {
        return p->bytes == size && p->dst == aggregator_name;
      });
      if (t == parts.end()) {
        parts_found = false;
        continue;
      }
      std::iter_swap(t, from);
    }
    if (!parts_found) {
      return absl::StrCat("the plan has no aggregate transfer for shard ", i,
                          " of its aggregate (planner bug)");
    }
  }
  return "";
}

void PlanDispatcher::Run::SendGroupSums(uint64_t id, const GroupAggregateParts& parts,
                                        const std::vector<std::vector<uint64_t>>& feed,
                                        double deadline_s, const GroupPush* group) {
  const std::vector<uint64_t>& members = group->constituents;
  const std::string& aggregator_name = group->aggregator;
  const UpdateRecord& first = state_.pushes().at(members.front());  // live when opened
  for (size_t i = 0; i < server_.shards.size(); ++i) {
    const ShardSlot& slot = server_.shards[i];
    const int64_t size = slot.end - slot.begin;
    const core::Transfer& sum = *parts.sum_of[i];
    GroupPart part;
    part.id = state_.NewTransferId();
    part.server = slot.server;
    part.host = sum.dst;
    part.begin = slot.begin;
    part.end = slot.end;
    part.planned = Planned(part.id, aggregator_name, part.host, size, sum, deadline_s);
    view_.transfers.push_back(part.planned);

    commands::Expect expect;
    expect.transfer_id = part.id;
    expect.job_id = job_.id;
    expect.server = slot.server;
    expect.sequence = group->sequence;
    expect.bytes = size;
    expect.src_host = aggregator_name;
    expect.worker = absl::StrCat("aggregate of ", members.size());
    expect.version = first.version;
    expect.constituents = members;
    expect.contributions = static_cast<int32_t>(members.size());
    expect.dtype = first.dtype;
    expect.held = true;
    expect.group_push = id;
    state_.Enqueue(part.host, commands::ExpectDelivery(expect));

    commands::Aggregate task;
    task.aggregate_id = part.id;
    task.job_id = job_.id;
    for (const auto& row : feed) task.constituents.push_back(row[i]);
    task.dst_host = part.host;
    task.dst_address = parts.hosts[i]->data_address;
    task.start_s = sum.start_s;
    task.bytes = size;
    task.dtype = first.dtype;
    state_.Enqueue(aggregator_name, commands::AggregateTask(task, sum.segments));
    state_.groups().AddPart(id, std::move(part));
  }
}

void PlanDispatcher::Run::SendGroupFeeds(uint64_t id, const GroupAggregateParts& parts,
                                         const std::vector<std::vector<uint64_t>>& feed,
                                         const HostState& aggregator, double end_s,
                                         double deadline_s, const GroupPush* group) {
  const std::vector<uint64_t>& members = group->constituents;
  const std::string& aggregator_name = group->aggregator;
  for (size_t m = 0; m < members.size(); ++m) {
    UpdateRecord* found = state_.FindPush(members[m]);
    if (found == nullptr) continue;  // failed meanwhile
    UpdateRecord& record = *found;
    record.state = UpdateState::kInFlight;
    record.sequence = group->sequence;
    record.aggregate_id = id;
    ++server_.in_flight;
    record.planned = Planned(record.transfer_id, record.src_host, aggregator_name, record.bytes,
                             *parts.part_of[m][0], deadline_s);
    record.planned.end_s = end_s;
    for (size_t i = 0; i < server_.shards.size(); ++i) {
      const ShardSlot& slot = server_.shards[i];
      const core::Transfer& hop = *parts.part_of[m][i];
      state_.groups().AddFeed(id, Planned(feed[m][i], record.src_host, aggregator_name,
                                          slot.end - slot.begin, hop, deadline_s));
      commands::Send send{feed[m][i], job_.id, aggregator_name, aggregator.data_address,
                          hop.start_s, slot.end - slot.begin};
      send.source_transfer_id = record.transfer_id;
      send.local_id = record.local_id;
      send.part = true;
      send.part_offset = slot.begin;
      state_.Enqueue(record.src_host, commands::SendTransfer(send, hop.segments));
    }
    ++view_.scheduled;
    ++state_.stats.planned;
  }
}

}  // namespace mlfabric
