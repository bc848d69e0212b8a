// Bounded-consistency replication (paper §3.3 and §5.3).
//
// The divergence bound. With momentum (eq. 2) the model moves by
// h_{t+1} = w_{t+1} - w_t = gamma h_t + u_t. If the replica holds state R
// (model w_R, history h_R) and the server has applied S >= R updates of the
// common sequence u_1..u_S (indices counted from the replica state 0, whose
// history is h_0), then
//
//   w_S - w_R = sum_{m=R+1..S} h_m
//             = c_0 h_0 + sum_{j=1..S} c_j u_j,  with
//   c_0 = sum_{m=R+1..S} gamma^m,   c_j = sum_{m=max(j,R+1)..S} gamma^{m-j}.
//
// For R = 0, S = 2 this is eq. 7: c_0 = gamma + gamma^2, c_1 = 1 + gamma,
// c_2 = 1; for R = 1, S = 2 it is eq. 8 (c_0 = gamma^2, c_1 = gamma, c_2 = 1).
// Cauchy-Schwarz on every cross term, <x_i, x_j> <= |x_i||x_j|, gives eq. 10-11:
//
//   |w_S - w_R|^2 <= sum_i sum_j c_i c_j |x_i||x_j| = (sum_j c_j |x_j|)^2,
//
// i.e. eq. 11's constants are a_1 = c_0^2, a_2 = c_1^2, a_3 = c_2^2,
// a_4 = 2 c_0 c_1, a_5 = 2 c_1 c_2, a_6 = 2 c_0 c_2 (the paper prints the last
// cross term as |u_1||h_0|; it pairs h^0 with u_2). The bound needs only
// norms and, for a lead of any length, is computed in O(S) as
// sum_{m=R+1..S} H_m with H_0 = |h_0|, H_m = gamma H_{m-1} + |u_m|.
//
// The replication step (§5.3) runs after the server schedule: the replica's
// transfers are planned on the network the server's transfers left, by
// Alg. 3 with the replica's own aggregators, in the server's commit order.
// At T_last (the last server commit) the bound must hold; if it would not,
// the last server transfer is delayed to start after the earliest replica
// commit a_e that makes it hold. Replica transfers committing after T_last
// are punted to the next batch (not part of this plan).
//
// The replica's stream is `pending ++ order`: updates the server applied in
// earlier batches whose replica transfers were punted (`ReplicaSpec::
// pending`, re-sent now, ahead of this batch's), then this batch's in commit
// order. `lead`: norms of the updates the server applied before those that
// the replica still lacks because their (frozen) transfers are in flight;
// the core does not move their bytes and counts them as outstanding until
// the stream's first replica commit, which can only happen after them. The
// divergence sequence is lead ++ pending ++ order.
//
// When no delay can help (the replica's path, or the last transfer's path
// after a_e, never offers the capacity), the server gives up its last
// delivery (a direct update or a whole aggregate: "replica_divergence" drops)
// and the check repeats, so the bound stays a guarantee (§1: "should always
// be satisfied"), never traded silently. Only a lead that already breaks the
// bound before this batch cannot be repaired; the server then commits
// nothing.
//
// Thread safety: pure functions.
#ifndef MLFABRIC_SCHEDULER_CORE_REPLICATION_H_
#define MLFABRIC_SCHEDULER_CORE_REPLICATION_H_

#include <cstddef>
#include <vector>

#include "scheduler/core/aggregation.h"
#include "scheduler/core/network.h"
#include "scheduler/core/prepared_batch.h"

namespace mlfabric::core {

// Upper bound on |w_S - w_R| for a replica at state R and a server at state
// S over the update norms `norms` (u_1.. in apply order), momentum `gamma`
// and replica history norm `history_norm` (see the file comment).
double DivergenceBound(double gamma, double history_norm, const std::vector<double>& norms,
                       size_t replica_applied, size_t server_applied);

// Prefix form for repeated queries: H_m and their running sums.
class DivergenceTable {
 public:
  DivergenceTable(double gamma, double history_norm, const std::vector<double>& norms);
  // Same value as DivergenceBound(..., replica_applied, server_applied).
  double Bound(size_t replica_applied, size_t server_applied) const;

 private:
  std::vector<double> cumulative_;  // cumulative_[m] = H_1 + ... + H_m
};

// The server side of a batch as the replication step sees and may change it.
struct ServerSchedule {
  std::vector<int> order;           // update indices, commit order
  std::vector<double> arrival_s;    // per position
  std::vector<PlannedTransfer> transfers;
  // Per position: index into `transfers` of the transfer that brings it (or
  // its aggregate) to the server.
  std::vector<int> delivered_by;
  // Per transfer: the first position it serves (its update's, or an
  // aggregate's first constituent's).
  std::vector<int> transfer_position;
};

struct ReplicaConfig {
  int host = -1;
  std::vector<int> aggregators;  // pre-assigned order
  double divergence_bound = 0;
  double momentum = 0;
  double history_norm = 0;
  std::vector<double> lead;
  // Punted updates re-sent ahead of the batch: `update` indices are
  // Batch::updates.size() + j for ReplicaSpec::pending[j].
  std::vector<AggregationItem> pending;
  std::vector<double> pending_norms;
  // ReplicaSpec::aggregate_pending_only: Alg. 3 runs over the `pending`
  // prefix of the stream alone and this batch's copies follow it direct.
  bool aggregate_pending_only = false;
};

struct ReplicationResult {
  std::vector<PlannedTransfer> transfers;  // frozen replica transfers
  std::vector<double> commit_s;            // per committed stream position (a prefix)
  std::vector<int> stream;                 // update indices of the stream (pending ++ kept order)
  std::vector<int> punted;                 // update indices punted to the next batch
  // Update indices removed from the end of the server's order because no
  // delay could keep the bound with them applied ("replica_divergence").
  std::vector<int> dropped;
  double divergence = 0;                   // bound at the (possibly delayed) T_last
  bool delayed_last = false;
};

// Honest commit times: the server applies in order, so position i commits at
// max(arrival_i, commit_{i-1}).
std::vector<double> HonestCommits(const std::vector<double>& arrival_s);

// §5.3 on `*net` (the network after the server's reservations). May rewrite
// the last server transfer in `*server` (and the affected arrivals).
ReplicationResult Replicate(const PreparedBatch& batch, const ReplicaConfig& replica,
                            ServerSchedule* server, Network* net, const PlannerOptions& options);

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_REPLICATION_H_
