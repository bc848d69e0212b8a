#include "scheduler/core/replication.h"

#include <algorithm>

#include "scheduler/core/aggregation.h"

namespace mlfabric::core {

DivergenceTable::DivergenceTable(double gamma, double history_norm,
                                 const std::vector<double>& norms) {
  cumulative_.assign(norms.size() + 1, 0);
  double h = history_norm;
  for (size_t m = 1; m <= norms.size(); ++m) {
    h = gamma * h + norms[m - 1];
    cumulative_[m] = cumulative_[m - 1] + h;
  }
}

double DivergenceTable::Bound(size_t replica_applied, size_t server_applied) const {
  server_applied = std::min(server_applied, cumulative_.size() - 1);
  if (replica_applied >= server_applied) return 0;
  return cumulative_[server_applied] - cumulative_[replica_applied];
}

double DivergenceBound(double gamma, double history_norm, const std::vector<double>& norms,
                       size_t replica_applied, size_t server_applied) {
  return DivergenceTable(gamma, history_norm, norms).Bound(replica_applied, server_applied);
}

std::vector<double> HonestCommits(const std::vector<double>& arrival_s) {
  std::vector<double> commits(arrival_s.size());
  double previous = -kInfinity;
  for (size_t i = 0; i < arrival_s.size(); ++i) {
    previous = std::max(previous, arrival_s[i]);
    commits[i] = previous;
  }
  return commits;
}

namespace {

// Keeps positions [0, cut) of the server schedule.
void TruncateServer(ServerSchedule* server, size_t cut) {
  std::vector<int> remap(server->transfers.size(), -1);
  std::vector<PlannedTransfer> kept;
  std::vector<int> kept_position;
  for (size_t k = 0; k < server->transfers.size(); ++k) {
    if (static_cast<size_t>(server->transfer_position[k]) < cut) {
      remap[k] = static_cast<int>(kept.size());
      kept.push_back(std::move(server->transfers[k]));
      kept_position.push_back(server->transfer_position[k]);
    }
  }
  server->transfers = std::move(kept);
  server->transfer_position = std::move(kept_position);
  server->order.resize(cut);
  server->arrival_s.resize(cut);
  server->delivered_by.resize(cut);
  for (int& d : server->delivered_by) d = remap[d];
}

// The replica's schedule before the bound is enforced: Alg. 3 towards the
// replica over the stream (pending ++ order), on the network the server
// schedule left, then the direct tail.
struct TentativeReplica {
  AggregationInput input;
  AggregationResult agg;
  std::vector<PlannedTransfer> tail;  // aggregate_pending_only: this batch's copies
  std::vector<double> commit_s;       // honest commit per stream position
};

TentativeReplica PlanTentative(const PreparedBatch& batch, const ReplicaConfig& replica,
                               const ServerSchedule& server, Network* net,
                               const PlannerOptions& options) {
  TentativeReplica plan;
  AggregationInput& input = plan.input;
  input.now_s = batch.now_s;
  input.dst_host = replica.host;
  input.items = replica.pending;
  std::vector<AggregationItem> direct_tail;  // aggregate_pending_only: this batch's copies
  for (int u : server.order) {
    const AggregationItem item{u, batch.updates[u].worker, batch.updates[u].parts[0].bytes};
    (replica.aggregate_pending_only ? direct_tail : input.items).push_back(item);
  }
  {
    Network tentative = *net;
    input.direct = SequentialDirect(input.items, replica.host, batch.now_s, TransferKind::kReplica,
                                    &tentative);
  }
  input.aggregators = replica.aggregators;
  input.to_aggregator_kind = TransferKind::kReplica;
  input.aggregate_kind = TransferKind::kReplicaAggregate;
  plan.agg = Aggregate(input, net, options);
  // The direct tail goes after Alg. 3's schedule, in stream order.
  plan.tail = SequentialDirect(direct_tail, replica.host, batch.now_s, TransferKind::kReplica, net);
  for (const PlannedTransfer& t : plan.tail) plan.agg.arrival_s.push_back(t.end_s);
  plan.commit_s = HonestCommits(plan.agg.arrival_s);
  return plan;
}

// Moves the last of the `kept` server deliveries to start at `t_e` when its
// path has the capacity from then on; false, with the network as it was,
// when it does not (or `t_e` is no later than its start).
bool DelayLastDelivery(ServerSchedule* server, size_t kept, double t_e, Network* net) {
  PlannedTransfer& last = server->transfers[server->delivered_by[kept - 1]];
  if (!(t_e < kInfinity && t_e > last.start_s)) return false;
  const Path path = net->PathBetween(last.src, last.dst);
  net->Release(path, last.segments);
  FillResult fill = net->Fill(path, t_e, 8.0 * static_cast<double>(last.bytes));
  if (!fill.feasible) {
    net->Reserve(path, last.segments);
    return false;
  }
  net->Reserve(path, fill.segments);
  const int delivered = server->delivered_by[kept - 1];
  for (size_t i = 0; i < kept; ++i) {
    if (server->delivered_by[i] == delivered) server->arrival_s[i] = fill.end_s;
  }
  last.start_s = fill.segments.front().from_s;
  last.end_s = fill.end_s;
  last.segments = std::move(fill.segments);
  return true;
}

// The server gives up its last delivery (a direct update or a whole
// aggregate), adding its updates to `dropped`; returns the positions kept.
size_t DropLastDelivery(ServerSchedule* server, size_t kept, std::vector<int>* dropped) {
  size_t cut = kept - 1;
  while (cut > 0 && server->delivered_by[cut - 1] == server->delivered_by[kept - 1]) --cut;
  for (size_t i = cut; i < kept; ++i) dropped->push_back(server->order[i]);
  TruncateServer(server, cut);
  return cut;
}

// Freezes the stream prefix committed by T_last (`r` positions) with the
// transfers that bring it; punts the rest.
void FreezeStream(const ReplicaConfig& replica, const ServerSchedule& server,
                  const TentativeReplica& plan, size_t kept, size_t r, ReplicationResult* result) {
  const size_t pending = replica.pending.size();
  const size_t stream = pending + kept;
  for (size_t i = 0; i < stream; ++i) {
    result->stream.push_back(i < pending ? replica.pending[i].update : server.order[i - pending]);
  }
  for (size_t i = 0; i < r; ++i) result->commit_s.push_back(plan.commit_s[i]);
  for (size_t i = r; i < stream; ++i) result->punted.push_back(result->stream[i]);
  for (int i = 0; i < plan.agg.split && static_cast<size_t>(i) < r; ++i) {
    result->transfers.push_back(plan.input.direct[i]);
  }
  for (const AggregationGroup& group : plan.agg.groups) {
    if (static_cast<size_t>(group.items.back()) >= r) break;
    for (const PlannedTransfer& t : group.to_aggregator) result->transfers.push_back(t);
    result->transfers.push_back(group.aggregate);
  }
  const size_t aggregated = plan.input.items.size();  // stream positions Alg. 3 planned
  for (size_t i = 0; i < plan.tail.size() && aggregated + i < r; ++i) {
    result->transfers.push_back(plan.tail[i]);
  }
}

}  // namespace

ReplicationResult Replicate(const PreparedBatch& batch, const ReplicaConfig& replica,
                            ServerSchedule* server, Network* net, const PlannerOptions& options) {
  ReplicationResult result;
  const size_t m = server->order.size();
  const size_t lead = replica.lead.size();
  const size_t pending = replica.pending.size();
  std::vector<double> norms = replica.lead;
  norms.insert(norms.end(), replica.pending_norms.begin(), replica.pending_norms.end());
  for (int u : server->order) norms.push_back(batch.updates[u].norm);
  const DivergenceTable table(replica.momentum, replica.history_norm, norms);
  // Replica state (in updates applied) when `r` of the stream are in.
  auto replica_state = [&](size_t r) { return r == 0 ? size_t{0} : lead + r; };
  if (m + pending == 0) {
    result.divergence = table.Bound(0, lead);
    return result;
  }
  const TentativeReplica plan = PlanTentative(batch, replica, *server, net, options);
  const std::vector<double>& replica_commit = plan.commit_s;

  size_t kept = m;  // server positions kept (all unless no delay can keep the bound)
  auto server_state = [&]() { return lead + pending + kept; };
  // With no server commit in the batch there is no T_last to respect.
  auto last_commit = [&]() {
    return kept == 0 ? kInfinity : HonestCommits(server->arrival_s).back();
  };
  // Replica commits by time t (never the ones that cannot happen at all).
  const size_t reachable = static_cast<size_t>(
      std::lower_bound(replica_commit.begin(), replica_commit.end(), kInfinity) -
      replica_commit.begin());
  auto committed_by = [&](double t) {
    const size_t r = static_cast<size_t>(
        std::upper_bound(replica_commit.begin(), replica_commit.end(), t) -
        replica_commit.begin());
    return std::min({r, reachable, pending + kept});
  };
  auto violated = [&](size_t r) {
    return table.Bound(replica_state(r), server_state()) > replica.divergence_bound;
  };
  size_t r = committed_by(last_commit());
  while (kept > 0 && violated(r)) {
    // Delay the last server transfer to start after the earliest replica
    // commit a_e after which the bound holds (the bound only falls as the
    // replica catches up).
    size_t needed = r + 1;
    while (needed < pending + kept && violated(needed)) ++needed;
    if (DelayLastDelivery(server, kept, replica_commit[needed - 1], net)) {
      result.delayed_last = true;
      r = committed_by(last_commit());
      continue;
    }
    // No delay helps (the replica, or the last transfer's path after a_e,
    // never offers the capacity): the server gives up its last delivery
    // and tries again.
    kept = DropLastDelivery(server, kept, &result.dropped);
    r = committed_by(last_commit());
  }
  result.divergence = table.Bound(replica_state(r), server_state());
  FreezeStream(replica, *server, plan, kept, r, &result);
  return result;
}

}  // namespace mlfabric::core
