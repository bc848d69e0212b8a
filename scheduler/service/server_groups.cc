#include "scheduler/service/server_groups.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "scheduler/service/commands.h"
#include "scheduler/service/in_doubt.h"

namespace mlfabric {

namespace {

// An error in field `field` of shard `name`'s ShardSpec.
absl::Status InvalidShard(const std::string& name, const std::string& field,
                          const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("shard.", field, " of server '", name, "': ", what));
}

// RegisterShard: the spec on its own, and against the job's servers (the
// group is not a plain server, the shard not a group nor another group's).
absl::Status CheckShardSpec(const JobState& job, const v1::RegisterEntityRequest& request) {
  const v1::ShardSpec& spec = request.shard();
  const std::string& name = request.name();
  const std::string& group_name = spec.group();
  auto invalid = [&](const std::string& field, const std::string& what) {
    return InvalidShard(name, field, what);
  };
  if (group_name == name) return invalid("group", "must differ from the shard's own name");
  if (spec.count() < 1 || spec.count() > kMaxShards) {
    return invalid("count", absl::StrCat("must be in [1, ", kMaxShards, "], got ", spec.count()));
  }
  if (spec.index() < 0 || spec.index() >= spec.count()) {
    return invalid("index", absl::StrCat("must be in [0, ", spec.count(), "), got ", spec.index()));
  }
  if (spec.begin() < 0 || spec.end() <= spec.begin()) {
    return invalid("begin/end", absl::StrCat("[", spec.begin(), ", ", spec.end(),
                                             ") is not a non-empty byte range"));
  }
  if (spec.index() == 0 && spec.begin() != 0) {
    return invalid("begin", absl::StrCat("shard 0 must begin at byte 0, got ", spec.begin()));
  }
  if (request.round_size() != 0) {
    return invalid("group", "a shard cannot run synchronous rounds (round_size must be 0)");
  }
  auto existing = job.servers.find(group_name);
  if (existing != job.servers.end() && existing->second.shards.empty()) {
    return invalid("group", absl::StrCat("'", group_name,
                                         "' is a server of this job, not a server group"));
  }
  if (auto self = job.servers.find(name);
      self != job.servers.end() && !self->second.shards.empty()) {
    return invalid("group", absl::StrCat("'", name, "' is itself a server group"));
  }
  if (auto self = job.servers.find(name);
      self != job.servers.end() && !self->second.group.empty() &&
      (self->second.group != group_name)) {
    return invalid("group", absl::StrCat("'", name, "' is a shard of group '",
                                         self->second.group, "' already"));
  }
  return absl::OkStatus();
}

// RegisterShard: the shard's byte range meets those of its registered
// neighbours in `group`.
absl::Status CheckShardNeighbours(const ServerState& group, const std::string& name,
                                  const v1::ShardSpec& spec) {
  if (spec.index() > 0) {
    const ShardSlot& before = group.shards[spec.index() - 1];
    if (!before.server.empty() && before.end != spec.begin()) {
      return InvalidShard(name, "begin",
                          absl::StrCat("shard ", spec.index() - 1, " ('", before.server,
                                       "') ends at byte ", before.end, ", so shard ",
                                       spec.index(), " must begin there, not at ",
                                       spec.begin()));
    }
  }
  if (spec.index() + 1 < spec.count()) {
    const ShardSlot& after = group.shards[spec.index() + 1];
    if (!after.server.empty() && after.begin != spec.end()) {
      return InvalidShard(name, "end",
                          absl::StrCat("shard ", spec.index() + 1, " ('", after.server,
                                       "') begins at byte ", after.begin, ", so shard ",
                                       spec.index(), " must end there, not at ", spec.end()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RegisterShard(ClusterState* state, JobState* job,
                           const v1::RegisterEntityRequest& request) {
  const v1::ShardSpec& spec = request.shard();
  const std::string& name = request.name();
  const std::string& group_name = spec.group();
  if (absl::Status checked = CheckShardSpec(*job, request); !checked.ok()) return checked;
  ServerState& group = job->servers[group_name];
  if (group.shards.empty()) {
    group.shards.resize(spec.count());
  } else if (static_cast<int>(group.shards.size()) != spec.count()) {
    return InvalidShard(name, "count",
                        absl::StrCat("group '", group_name, "' has ", group.shards.size(),
                                     " shards, this one says ", spec.count()));
  }
  ShardSlot& slot = group.shards[spec.index()];
  if (!slot.server.empty() && slot.server != name) {
    return InvalidShard(name, "index",
                        absl::StrCat("shard ", spec.index(), " of group '", group_name,
                                     "' is '", slot.server, "' already"));
  }
  if (absl::Status meets = CheckShardNeighbours(group, name, spec); !meets.ok()) return meets;
  slot.server = name;
  slot.begin = spec.begin();
  slot.end = spec.end();
  if (spec.index() == 0) group.host = request.host();
  // Registering again with a restarted scheduler: the group's versions go
  // on from the shards' (all equal, as every shard applies every push),
  // and the positions other shards caught up on meanwhile are passed.
  group.model_version = std::max(group.model_version, request.model_version());
  job->servers[name].group = group_name;
  for (const auto& [position, reason] : slot.owed_skips) {
    SkipGroupPosition(state, *job, request.host(), name, position, reason);
  }
  if (!slot.owed_skips.empty()) {
    MLF_LOG(INFO) << "shard '" << name << "' of group '" << group_name << "' on "
                  << request.host() << " skips " << slot.owed_skips.size()
                  << " position(s) other shards caught up on while it was away";
  }
  slot.owed_skips.clear();
  return absl::OkStatus();
}

absl::Status RegisterServerOfGroups(ClusterState* state, JobState* job,
                                    const v1::RegisterEntityRequest& request) {
  auto known = job->servers.find(request.name());
  if (known != job->servers.end() && !known->second.shards.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name: '", request.name(), "' is a server group of job '", request.job(),
        "'; a server of its own needs another name"));
  }
  if (!request.shard().group().empty()) return RegisterShard(state, job, request);
  if (known != job->servers.end() && !known->second.group.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("shard: server '", request.name(),
                                                   "' is a shard of group '",
                                                   known->second.group,
                                                   "'; register it with its shard spec"));
  }
  return absl::OkStatus();
}

std::string ShardText(const v1::ShardSpec& spec) {
  if (spec.group().empty()) return "";
  return absl::StrCat(" (shard ", spec.index(), " of ", spec.count(), " of group '", spec.group(),
                      "', bytes [", spec.begin(), ", ", spec.end(), "))");
}

absl::Status CheckGroupPush(const ClusterState& state, const JobState& job,
                            const std::string& name, const ServerState& server, int64_t bytes) {
  if (!server.group.empty() && bytes >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("server: '", name, "' is a shard of server group '", server.group,
                     "'; push to the group, which moves each shard its part"));
  }
  if (server.shards.empty()) return absl::OkStatus();
  if (std::string lacks = GroupIncomplete(state, job, server); !lacks.empty()) {
    return absl::UnavailableError(
        absl::StrCat("server group '", name, "' is not complete: ", lacks));
  }
  if (bytes >= 0 && bytes != GroupBytes(server)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes: the push has ", bytes, " bytes; server group '", name, "' holds a model of ",
        GroupBytes(server), " bytes in ", server.shards.size(), " shards"));
  }
  return absl::OkStatus();
}

std::string GroupIncomplete(const ClusterState& state, const JobState& job,
                            const ServerState& group) {
  std::vector<std::string> missing;
  for (size_t i = 0; i < group.shards.size(); ++i) {
    const ShardSlot& slot = group.shards[i];
    if (slot.server.empty()) {
      missing.push_back(absl::StrCat("shard ", i, " is not registered"));
      continue;
    }
    auto server = job.servers.find(slot.server);
    if (server == job.servers.end() || state.AliveHost(server->second.host) == nullptr) {
      missing.push_back(absl::StrCat("shard ", i, " ('", slot.server, "') is down"));
    }
  }
  std::string text;
  for (const std::string& m : missing) absl::StrAppend(&text, text.empty() ? "" : "; ", m);
  return text;
}

int64_t GroupBytes(const ServerState& group) {
  return group.shards.empty() ? 0 : group.shards.back().end;
}

void GroupPartReady(ClusterState* state, uint64_t part_id) {
  const GroupLedger::PartOf owner = state->groups().FindPart(part_id);
  if (owner.push == nullptr) return;
  const uint64_t push_id = owner.push_id;
  GroupPush* push = owner.push;
  owner.part->ready = true;
  if (push->released) return;
  for (const GroupPart& p : push->parts) {
    if (!p.ready) return;
  }
  uint64_t sequence = push->sequence;
  if (push->constituents.empty()) {
    auto* record = state->FindPush(push_id);
    if (record == nullptr) return;
    sequence = record->sequence;
  }
  push->released = true;
  for (const GroupPart& p : push->parts) {
    state->Enqueue(p.host, commands::ReleaseDelivery(p.id, sequence));
  }
}

namespace {

// A group aggregate's part or feed ended (GroupPartEnded).
void GroupAggregatePartEnded(ClusterState* state, uint64_t id, GroupPush* group,
                             GroupPart* part, bool applied, int64_t version,
                             const std::string& error) {
  const std::string why = error.empty() ? std::string("failed") : error;
  if (part == nullptr) {  // a feed: reported only when it fails
    if (applied) return;
    state->FailGroupAggregate(id, absl::StrCat("a part on its way to aggregator ",
                                               group->aggregator, " failed: ", why));
    return;
  }
  if (!applied) {
    state->FailGroupAggregate(
        id, absl::StrCat("its sum for shard '", part->server, "' on ", part->host,
                         " from aggregator ", group->aggregator, ": ", why));
    return;
  }
  part->applied = true;
  part->version = version;
  int64_t low = version, high = version;
  for (const GroupPart& p : group->parts) {
    if (!p.applied) return;
    low = std::min(low, p.version);
    high = std::max(high, p.version);
  }
  const GroupPush done = *state->groups().Take(id);
  if (low != high) {
    MLF_LOG(ERROR) << "group aggregate " << id << " was applied at versions " << low << ".."
                   << high << " across shards";
  }
  std::string job_name;
  for (uint64_t member : done.constituents) {
    if (auto* record = state->FindPush(member)) {
      job_name = record->job;
    }
  }
  if (JobState* job = state->FindJob(job_name)) {
    for (const GroupPart& p : done.parts) {
      ServerState& shard = job->servers[p.server];
      shard.model_version = std::max(shard.model_version, p.version);
      if (auto group_server = job->servers.find(shard.group); group_server != job->servers.end()) {
        group_server->second.model_version = std::max(group_server->second.model_version, high);
      }
    }
  }
  // The shards applied the constituents as consecutive versions ending at
  // `low`, in commit order.
  const int64_t n = static_cast<int64_t>(done.constituents.size());
  for (int64_t i = 0; i < n; ++i) {
    auto* record = state->FindPush(done.constituents[i]);
    if (record == nullptr) continue;
    record->aggregate_id = 0;
    state->Complete(done.constituents[i], v1::OUTCOME_APPLIED, "", low - (n - 1 - i));
  }
}

}  // namespace

void GroupPartEnded(ClusterState* state, uint64_t part_id, bool applied, int64_t version,
                    const std::string& error) {
  if (std::optional<uint64_t> aggregate = state->groups().AggregateFed(part_id)) {
    if (GroupPush* group = state->groups().Find(*aggregate)) {
      GroupAggregatePartEnded(state, *aggregate, group, nullptr, applied, version, error);
    }
    return;
  }
  const GroupLedger::PartOf owner = state->groups().FindPart(part_id);
  if (owner.push == nullptr) return;
  const uint64_t push_id = owner.push_id;
  GroupPush* push = owner.push;
  GroupPart* part = owner.part;
  if (!push->constituents.empty()) {
    GroupAggregatePartEnded(state, push_id, push, part, applied, version, error);
    return;
  }
  auto* record = state->FindPush(push_id);
  if (record == nullptr) return;
  if (!applied) {
    const size_t index = static_cast<size_t>(part - push->parts.data());
    const std::string where =
        absl::StrCat("part ", index, " (bytes [", part->begin, ", ", part->end, ") to shard '",
                     part->server, "' on ", part->host, ")");
    const std::string why = error.empty() ? std::string("failed") : error;
    state->Complete(push_id, v1::OUTCOME_FAILED,
                    push->released
                        ? absl::StrCat(where, " was not applied after every shard had its "
                                              "part (shards that applied theirs keep it): ",
                                       why)
                        : absl::StrCat(where, ": ", why, "; no shard applied the push"),
                    0);
    return;
  }
  part->applied = true;
  part->version = version;
  int64_t low = version, high = version;
  for (const GroupPart& p : push->parts) {
    if (!p.applied) return;
    low = std::min(low, p.version);
    high = std::max(high, p.version);
  }
  if (low != high) {
    // Cannot happen while every shard applies the group's sequence; said
    // loudly if it does (a shard application counting versions its own way).
    MLF_LOG(ERROR) << "push " << push_id << " to group '" << record->server
                   << "' was applied at versions " << low << ".." << high << " across shards";
  }
  JobState* job = state->FindJob(record->job);
  if (job != nullptr) {
    ServerState& group = job->servers[record->server];
    group.model_version = std::max(group.model_version, high);
    for (const GroupPart& p : push->parts) {
      ServerState& shard = job->servers[p.server];
      shard.model_version = std::max(shard.model_version, p.version);
    }
  }
  state->Complete(push_id, v1::OUTCOME_APPLIED, "", low);
}

}  // namespace mlfabric
