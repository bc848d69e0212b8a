#include "scheduler/core/mlfabric_planner.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/core/aggregation.h"
#include "scheduler/core/network.h"
#include "scheduler/core/ordering.h"
#include "scheduler/core/prepared_batch.h"
#include "scheduler/core/replication.h"

namespace mlfabric::core {

namespace {

// Seeds for the two independent pre-assignments (server and replica
// aggregators) drawn from the batch's one seed.
constexpr uint64_t kReplicaSeedSalt = 0x5265706c696361ull;  // "Replica"

absl::Status ValidateReplica(const ReplicaSpec& replica, const Network& net,
                             const std::vector<UpdateRequest>& batch_updates) {
  if (net.HostIndex(replica.host) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica.host: '", replica.host, "' is not in hosts"));
  }
  for (size_t i = 0; i < replica.aggregators.size(); ++i) {
    if (net.HostIndex(replica.aggregators[i]) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("replica.aggregators[", i, "]: '",
                                                     replica.aggregators[i], "' is not in hosts"));
    }
  }
  if (!std::isfinite(replica.divergence_bound) || replica.divergence_bound < 0) {
    return absl::InvalidArgumentError("replica.divergence_bound: must be finite and >= 0");
  }
  if (!std::isfinite(replica.momentum) || replica.momentum < 0 || replica.momentum >= 1) {
    return absl::InvalidArgumentError("replica.momentum: must be in [0, 1)");
  }
  if (!std::isfinite(replica.history_norm) || replica.history_norm < 0) {
    return absl::InvalidArgumentError("replica.history_norm: must be finite and >= 0");
  }
  for (size_t i = 0; i < replica.lead.size(); ++i) {
    if (!std::isfinite(replica.lead[i]) || replica.lead[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("replica.lead[", i, "]: must be finite and >= 0"));
    }
  }
  std::unordered_set<std::string> ids;
  for (const UpdateRequest& u : batch_updates) ids.insert(u.id);
  for (size_t i = 0; i < replica.pending.size(); ++i) {
    const UpdateRequest& u = replica.pending[i];
    const std::string field = absl::StrCat("replica.pending[", i, "]");
    if (u.id.empty()) return absl::InvalidArgumentError(field + ".id: empty");
    if (!ids.insert(u.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".id: '", u.id, "' is already an update of this batch or pending"));
    }
    if (net.HostIndex(u.worker) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".worker: '", u.worker, "' is not in hosts"));
    }
    if (u.bytes <= 0) return absl::InvalidArgumentError(field + ".bytes: must be positive");
    if (!std::isfinite(u.norm) || u.norm < 0) {
      return absl::InvalidArgumentError(field + ".norm: must be finite and >= 0");
    }
  }
  return absl::OkStatus();
}

// Aggregator hosts usable towards `dst`: known, distinct, neither the
// destination nor in `exclude` (sorted), in the seeded pre-assigned order.
std::vector<int> UsableAggregators(const std::vector<std::string>& names, const Network& net,
                                   int dst, const std::vector<int>& exclude, uint64_t seed) {
  std::vector<int> hosts;
  for (const std::string& name : names) {
    const int host = net.HostIndex(name);
    if (host < 0 || host == dst) continue;
    if (std::binary_search(exclude.begin(), exclude.end(), host)) continue;
    if (std::find(hosts.begin(), hosts.end(), host) != hosts.end()) continue;
    hosts.push_back(host);
  }
  return ShuffleAggregators(std::move(hosts), seed);
}

// Update indices beyond Batch::updates name the replica's pending updates.
const std::string& IdOf(int index, const Batch& batch) {
  const int n = static_cast<int>(batch.updates.size());
  return index < n ? batch.updates[index].id : batch.replica->pending[index - n].id;
}

Transfer ToTransfer(const PlannedTransfer& t, const Batch& batch, const Network& net) {
  Transfer out;
  if (t.update >= 0) out.update = IdOf(t.update, batch);
  out.src = net.HostName(t.src);
  out.dst = net.HostName(t.dst);
  out.kind = t.kind;
  out.start_s = t.start_s;
  out.end_s = t.end_s;
  out.bytes = t.bytes;
  out.segments = t.segments;
  return out;
}

// What aggregation decided for the ordered positions: the first `split` go
// direct, the rest through Alg. 3's `groups` or through streaming `chains`.
struct AggregationOutcome {
  int split = 0;
  std::vector<AggregationGroup> groups;
  std::optional<ChainResult> chains;
};

// Aggregator hosts for the server's updates. No host that receives a part
// (nor the replica, nor the server) aggregates.
std::vector<int> ServerAggregators(const Batch& batch, const PreparedBatch& prepared,
                                   int replica_host, const Network& net) {
  std::vector<int> excluded = {prepared.server, replica_host};
  for (const PreparedUpdate& u : prepared.updates) {
    for (size_t j = 1; j < u.parts.size(); ++j) excluded.push_back(u.parts[j].dst_host);
  }
  std::sort(excluded.begin(), excluded.end());
  excluded.erase(std::unique(excluded.begin(), excluded.end()), excluded.end());
  return UsableAggregators(batch.aggregators, net, prepared.server, excluded, batch.seed);
}

// Alg. 3's input: the ordered updates with their parts and direct transfers.
AggregationInput AggregationInputOf(const Batch& batch, const PreparedBatch& prepared,
                                    const OrderingResult& ordering,
                                    std::vector<int> aggregators) {
  AggregationInput input;
  input.now_s = batch.now_s;
  input.dst_host = prepared.server;
  input.aggregators = std::move(aggregators);
  for (size_t i = 0; i < ordering.order.size(); ++i) {
    const PreparedUpdate& u = prepared.updates[ordering.order[i]];
    AggregationItem item{u.index, u.worker, u.parts[0].bytes};
    for (size_t j = 1; j < u.parts.size(); ++j) {
      item.shards.push_back({u.parts[j].dst_host, u.parts[j].bytes});
    }
    input.items.push_back(std::move(item));
    input.direct.push_back(ordering.direct[i][0]);
    if (prepared.multi_server) {
      input.shard_direct.emplace_back(ordering.direct[i].begin() + 1, ordering.direct[i].end());
    }
  }
  return input;
}

// Step 2, aggregation (Alg. 3). §10.2 describes multi-server scheduling
// without aggregation; aggregating sharded updates is our extension
// (aggregation.h): a member sends each of its parts to the aggregator, which
// sends one aggregate per part to that part's host. A multi-server batch with
// a replica goes direct: §5.3 delays and punts one delivery per update, and
// the service does not plan replicas of sharded models. On aggregation,
// `*net` becomes `base` carrying the chosen schedule and `server->arrival_s`
// its arrivals.
AggregationOutcome AggregateOrdered(const Batch& batch, const PreparedBatch& prepared,
                                    const OrderingResult& ordering, int replica_host,
                                    const Network& base, const PlannerOptions& options,
                                    Network* net, ServerSchedule* server) {
  const size_t m = ordering.order.size();
  AggregationOutcome outcome;
  outcome.split = static_cast<int>(m);
  std::vector<int> aggregators = ServerAggregators(batch, prepared, replica_host, *net);
  const bool aggregate =
      !aggregators.empty() && m > 0 && !(prepared.multi_server && batch.replica.has_value());
  if (!aggregate) return outcome;
  const AggregationInput input =
      AggregationInputOf(batch, prepared, ordering, std::move(aggregators));
  const AggregationSplit chosen = ChooseSplit(input, base, options);
  AggregationResult agg;
  agg.split = chosen.split;
  agg.total_s = chosen.total_s;
  // Everything direct: `*net` already holds exactly that (Alg. 2 reserved
  // the direct transfers in this order, undoing its trials bit for bit), so
  // it is not rebuilt from `base`. Sync mode's list releases a failed
  // update's parts instead of undoing them, and the reference rebuilds.
  const bool reuse = chosen.split == static_cast<int>(m) && batch.mode != Mode::kSync &&
                     !options.reference;
  Network aggregated = reuse ? Network() : base;
  if (!reuse) {
    agg = AggregateWithSplit(input, chosen.split, &aggregated);
    agg.total_s = chosen.total_s;
  }
  // Streaming chains (aggregation.h) when they finish no later than Alg. 3's
  // best split: they spare the server's link. Not with a replica, whose §5.3
  // schedule delays and punts Alg. 3's transfers, nor for sharded updates (a
  // chain carries one update's bytes to one host).
  if (batch.streaming_aggregation && !batch.replica.has_value() && !prepared.multi_server &&
      m > 1 && options.max_chain_hops >= 1) {
    Network streamed = base;
    ChainResult chain = AggregateChains(input, options.max_chain_hops, &streamed);
    // Compared as durations from now (a slack relative to the clock's
    // value would let a chain that finishes later by microseconds win).
    const double chain_s = chain.total_s - input.now_s, agg_s = agg.total_s - input.now_s;
    if (chain.chained > 0 && chain_s <= agg_s + 1e-9 * (agg_s + 1e-3)) {
      outcome.chains = std::move(chain);
      aggregated = std::move(streamed);
    }
  }
  if (outcome.chains.has_value() || !reuse) *net = std::move(aggregated);
  if (outcome.chains.has_value()) {
    server->arrival_s = outcome.chains->arrival_s;
    outcome.split = 0;
    for (const AggregationChain& c : outcome.chains->chains) {
      if (c.items.size() > 1) break;
      ++outcome.split;
    }
  } else if (!reuse) {
    outcome.split = agg.split;
    server->arrival_s = agg.arrival_s;
    outcome.groups = std::move(agg.groups);
  }  // reused: every arrival is the direct one Alg. 2 gave (server->arrival_s)
  return outcome;
}

// The server's transfers in host indices: the direct transfers of the first
// `split` positions (none with chains, which are added to the plan on their
// own), then each group's.
void ScheduleServerTransfers(AggregationOutcome* outcome, OrderingResult* ordering,
                             ServerSchedule* server) {
  for (int i = 0; i < outcome->split && !outcome->chains.has_value(); ++i) {
    double latest = -kInfinity;
    for (PlannedTransfer& t : ordering->direct[i]) {
      if (t.end_s > latest) {
        latest = t.end_s;
        server->delivered_by[i] = static_cast<int>(server->transfers.size());
      }
      server->transfers.push_back(std::move(t));
      server->transfer_position.push_back(i);
    }
  }
  // A group: its members' transfers, then its aggregates (one per part),
  // consecutive; its members are delivered by the latest aggregate.
  for (AggregationGroup& group : outcome->groups) {
    const int first = group.items.front();
    for (PlannedTransfer& t : group.to_aggregator) {
      server->transfers.push_back(std::move(t));
      server->transfer_position.push_back(first);
    }
    int latest = static_cast<int>(server->transfers.size());
    server->transfers.push_back(std::move(group.aggregate));
    server->transfer_position.push_back(first);
    for (PlannedTransfer& t : group.shard_aggregates) {
      if (t.end_s > server->transfers[latest].end_s) {
        latest = static_cast<int>(server->transfers.size());
      }
      server->transfers.push_back(std::move(t));
      server->transfer_position.push_back(first);
    }
    for (int i : group.items) server->delivered_by[i] = latest;
  }
}

// Step 3, replication (§5.3), for a batch with a replica.
ReplicationResult ReplicateToReplica(const Batch& batch, const PreparedBatch& prepared,
                                     int replica_host, const PlannerOptions& options,
                                     ServerSchedule* server, Network* net) {
  ReplicaConfig config;
  config.host = replica_host;
  config.aggregators = UsableAggregators(batch.replica->aggregators, *net, replica_host,
                                         {prepared.server}, batch.seed ^ kReplicaSeedSalt);
  config.divergence_bound = batch.replica->divergence_bound;
  config.momentum = batch.replica->momentum;
  config.history_norm = batch.replica->history_norm;
  config.lead = batch.replica->lead;
  config.aggregate_pending_only = batch.replica->aggregate_pending_only;
  const int n = static_cast<int>(batch.updates.size());
  for (size_t j = 0; j < batch.replica->pending.size(); ++j) {
    const UpdateRequest& u = batch.replica->pending[j];
    config.pending.push_back({n + static_cast<int>(j), net->HostIndex(u.worker), u.bytes});
    config.pending_norms.push_back(u.norm);
  }
  return Replicate(prepared, config, server, net, options);
}

// The server's transfers in the contract's terms. A group's aggregates are a
// run of consecutive aggregate transfers (its members' transfers come before
// each group), and each names the whole group: the positions delivered by a
// transfer of the run.
void AppendServerTransfers(const ServerSchedule& server, const Batch& batch, const Network& net,
                           int* aggregate_count, Plan* plan) {
  std::vector<std::string> run_constituents;
  for (size_t k = 0; k < server.transfers.size(); ++k) {
    Transfer t = ToTransfer(server.transfers[k], batch, net);
    if (t.kind == TransferKind::kAggregate) {
      if (k == 0 || server.transfers[k - 1].kind != TransferKind::kAggregate) {
        size_t run_end = k;
        while (run_end < server.transfers.size() &&
               server.transfers[run_end].kind == TransferKind::kAggregate) {
          ++run_end;
        }
        run_constituents.clear();
        for (size_t i = 0; i < server.order.size(); ++i) {
          const int by = server.delivered_by[i];
          if (by >= static_cast<int>(k) && by < static_cast<int>(run_end)) {
            run_constituents.push_back(batch.updates[server.order[i]].id);
          }
        }
      }
      t.update = absl::StrCat("agg:", ++*aggregate_count);
      t.constituents = run_constituents;
    }
    plan->transfers.push_back(std::move(t));
  }
}

// The streaming chains' transfers. Every hop of a chain moves at the chain's
// rates. Node j of a chain (its j-th host) sums the previous node's partial
// sum and its own host's members, and sends the sum on; a first node with one
// member just sends that update.
void AppendChainTransfers(const ChainResult& chains, const ServerSchedule& server, int dst,
                          const Batch& batch, const Network& net, int* aggregate_count,
                          Plan* plan) {
  for (const AggregationChain& c : chains.chains) {
    const int nodes = static_cast<int>(c.hosts.size());
    for (int j = 0; j < nodes; ++j) {
      Transfer t;
      t.src = net.HostName(c.hosts[j]);
      t.dst = net.HostName(j + 1 < nodes ? c.hosts[j + 1] : dst);
      t.start_s = c.start_s;
      t.end_s = c.end_s;
      t.bytes = c.bytes;
      t.segments = c.segments;
      std::vector<std::string> here;  // members up to this node, commit order
      for (size_t i = 0; i < c.items.size(); ++i) {
        if (c.node[i] <= j) here.push_back(batch.updates[server.order[c.items[i]]].id);
      }
      if (j == 0 && here.size() == 1) {
        t.update = here[0];
        t.kind = nodes == 1 ? TransferKind::kDirect : TransferKind::kToAggregator;
      } else {
        t.update = absl::StrCat("agg:", ++*aggregate_count);
        t.kind = TransferKind::kAggregate;
        t.constituents = std::move(here);
        if (j + 1 < nodes) t.into = absl::StrCat("agg:", *aggregate_count + 1);
      }
      plan->transfers.push_back(std::move(t));
    }
  }
}

// Replica transfers: an aggregate is the transfer that follows its group's
// contributions (Replicate emits them in that order).
void AppendReplicaTransfers(const ReplicationResult& replication, int replica_host,
                            const Batch& batch, const Network& net, int* aggregate_count,
                            Plan* plan) {
  std::vector<std::string> pending;
  for (const PlannedTransfer& rt : replication.transfers) {
    Transfer t = ToTransfer(rt, batch, net);
    if (rt.kind == TransferKind::kReplicaAggregate) {
      t.update = absl::StrCat("agg:", ++*aggregate_count);
      t.constituents = std::move(pending);
      pending.clear();
    } else if (rt.dst != replica_host) {
      pending.push_back(t.update);
    }
    plan->transfers.push_back(std::move(t));
  }
}

}  // namespace

absl::StatusOr<Plan> MlfabricPlanner::PlanBatch(const Batch& batch) const {
  RETURN_IF_ERROR(ValidateBatch(batch));
  ASSIGN_OR_RETURN(Network net, Network::FromBatch(batch));
  ASSIGN_OR_RETURN(PreparedBatch prepared, PrepareBatch(batch, net));
  int replica_host = -1;
  if (batch.replica.has_value()) {
    RETURN_IF_ERROR(ValidateReplica(*batch.replica, net, batch.updates));
    replica_host = net.HostIndex(batch.replica->host);
    if (replica_host == prepared.server) {
      return absl::InvalidArgumentError("replica.host: must differ from the server");
    }
  }
  const Network base = net;

  // 1. Ordering (Alg. 2), or the input list in synchronous mode (§6).
  OrderingResult ordering = batch.mode == Mode::kSync
                                ? ListSchedule(prepared, &net)
                                : OrderUpdates(prepared, &net, options_);

  // 2. Aggregation (Alg. 3).
  ServerSchedule server;
  server.order = ordering.order;
  server.arrival_s = ordering.arrival_s;
  server.delivered_by.assign(ordering.order.size(), -1);
  AggregationOutcome aggregation =
      AggregateOrdered(batch, prepared, ordering, replica_host, base, options_, &net, &server);
  ScheduleServerTransfers(&aggregation, &ordering, &server);

  // 3. Replication (§5.3).
  ReplicationResult replication;
  if (batch.replica.has_value()) {
    replication = ReplicateToReplica(batch, prepared, replica_host, options_, &server, &net);
  }

  // 4. The plan, in the contract's terms.
  Plan plan;
  for (int u : server.order) plan.order.push_back(batch.updates[u].id);
  for (const auto& [u, reason] : ordering.drops) plan.dropped.push_back({batch.updates[u].id, reason});
  for (int u : replication.dropped) plan.dropped.push_back({batch.updates[u].id, "replica_divergence"});
  int aggregate_count = 0;
  AppendServerTransfers(server, batch, net, &aggregate_count, &plan);
  if (aggregation.chains.has_value()) {
    AppendChainTransfers(*aggregation.chains, server, prepared.server, batch, net,
                         &aggregate_count, &plan);
  }
  const std::vector<double> commits = HonestCommits(server.arrival_s);
  for (size_t i = 0; i < server.order.size(); ++i) {
    plan.commits.push_back({batch.updates[server.order[i]].id, commits[i], static_cast<int>(i + 1)});
  }
  AppendReplicaTransfers(replication, replica_host, batch, net, &aggregate_count, &plan);
  for (size_t i = 0; i < replication.commit_s.size(); ++i) {
    plan.replica_commits.push_back(
        {IdOf(replication.stream[i], batch), replication.commit_s[i], static_cast<int>(i + 1)});
  }
  for (int u : replication.punted) plan.punted.push_back(IdOf(u, batch));
  plan.aggregation_split = aggregation.split;
  plan.replica_divergence = replication.divergence;
  return plan;
}

}  // namespace mlfabric::core
