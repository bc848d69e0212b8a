// Model distribution for batched `get` (paper §10.3): the mirror image of
// aggregation. Requests that arrive together are answered with one model
// version; instead of the server's uplink sending the model to every
// requester, up to k° earmarked distributors each receive it once and fan it
// out to a group of requesters.
//
// Our reading of §10.3 (a variant of Alg. 3 with the t_en's replaced by
// server-to-distributor and distributor-to-worker transfer times): for every
// split n (the first n requesters, in request order, are served directly by
// the server: "the workers in the first group receive the model directly
// from the server") and every number u of distributors used, the server
// first sends the model to distributor u, then u-1, ..., 1 ("we first
// transfer the model from the server to the k°-th distributor and then
// proceed backwards"), then to its n direct requesters; distributor u (the
// earliest served) takes the next requesters in order while each delivery
// ends no later than the server's own last send (the mirror of "never leave
// the server link fallow"), then distributor u-1, ...; distributor 1 takes
// whatever remains. A non-last distributor with an empty group makes that
// (n, u) infeasible. The case finishing all deliveries earliest wins; ties go
// to the larger n, then the smaller u. A distributor that also requested the
// model is served by its own receipt. Distributors are pre-assigned in a
// seeded random order, as aggregators are (§5.2).
//
//   DistributionRequest request = ...;
//   absl::StatusOr<DistributionPlan> plan = PlanModelDistribution(request);
//
// Cost: the exhaustive search (`DistributionOptions::reference`) evaluates
// all O(k° x |requesters|) cases in full, O(|requesters|) fills each (5 to
// 7 minutes per plan at 1000 x 500). The default search gives the same plan
// from a few cases. A request has no topology, so every path is the
// sender's uplink and the receiver's downlink: the server's sends and each
// distributor's fan-out touch disjoint links. Per u, one pass over the
// server's sends (a chain that is the same prefix for every n) gives each
// n's receipts, last-send time and the exact server-side part of the total;
// a case is then evaluated as its fan-out alone, with the same fills bit
// for bit. Cases are ruled out by exact bounds, compared with a margin for
// rounding: (a) the server's uplink carries u - 1 + n copies that someone
// waits for, so no case ends before now + (u - 1 + n) x bits / its peak
// (monotone in u and n: whole loops stop); (b) a case stops as soon as a
// delivery ends after the total to beat; (c) c deliveries need c x bits
// of a distributor's uplink peak, and a group stops at the first receiver
// too slow to be served by the server's last send, which bounds where each
// group ends and so what the last distributor must serve; (d) a
// distributor that did not ask for the model must serve someone, and a
// group surely reaches as far as the links' least rates allow (the c-th
// copy ends by receipt + c x bits / uplink + bits / downlink), so cases
// that surely leave it none are infeasible. The per-batch objective tries
// u outwards from sqrt(2 |requesters|) (where u + n copies serve about
// (u + n)^2 / 2 requesters) and each u's cases best-first by their bound;
// the deadline objective takes cases by copies u + n, best-first within
// each. 1000 x 500: a few ms for either objective (planner_benchmark
// --distribution).
//
// Thread safety: pure function.
#ifndef MLFABRIC_SCHEDULER_CORE_DISTRIBUTION_H_
#define MLFABRIC_SCHEDULER_CORE_DISTRIBUTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/core/types.h"

namespace mlfabric::core {

struct DistributionRequest {
  double now_s = 0;
  std::string server;
  int64_t model_bytes = 0;
  std::vector<std::string> requesters;    // hosts asking for the model, request order
  std::vector<std::string> distributors;  // the k° earmarked hosts (may be empty)
  std::vector<HostLink> hosts;
  uint64_t seed = 1;
};

struct Delivery {
  std::string host;
  double at_s = 0;
  std::string via;  // the server or the distributor it came from
  // Cut-through plans only (0 otherwise): the planned rate of its stream
  // (the least along its path), its uplink now, and how many requesters it
  // forwards to. A daemon uses them to place gets that come later as
  // leaves where they will be fast (daemon/engine/get_batcher.h).
  double rate_bps = 0;
  double uplink_bps = 0;
  int children = 0;
};

struct DistributionPlan {
  int direct = 0;             // requesters served directly by the server
  int distributors_used = 0;  // server copies = direct + distributors_used
  double total_s = 0;         // when the last requester has the model
  std::vector<Transfer> transfers;  // kind kDirect; `update` is "model"
  std::vector<Delivery> deliveries; // one per requester, request order
  // Cut-through plans only (0 otherwise): the rate of the slowest copy the
  // server sends itself.
  double copy_bps = 0;
  // Cut-through plans only: if the server sent every copy itself, its
  // uplink (not the requesters' downlinks) would be what slows them (each
  // copy's rate within min_saving of the uplink's share). Where it is not,
  // one more copy from the server costs the others little, so a daemon
  // does not make requesters forward to gets that come later.
  bool server_bound = false;
};

struct DistributionOptions {
  // Evaluate every (n, u) case in full, for either objective (the
  // straightforward search the benchmark and tests compare against). The
  // default search prunes cases that provably cannot win and gives the
  // identical plan.
  bool reference = false;
  // When finite (an absolute time): the objective that spares the server's
  // link for what comes next. Among the cases whose last delivery
  // is no later than this, take the one with the fewest server copies
  // (u + n), ties to the earlier total, then the larger n, then the smaller
  // u. If no case meets it, the per-batch objective (earliest total) decides
  // as before. Single hop, like the per-batch search.
  double deadline_s = kNoDeadline;
  static constexpr double kNoDeadline = 1e300;
};

absl::StatusOr<DistributionPlan> PlanModelDistribution(const DistributionRequest& request,
                                                       const DistributionOptions& options = {});

// Model distribution for a data plane that forwards cut-through (the live
// daemons, daemon/engine/relay_table.h): a distributor passes each
// packet on as it arrives, so a requester deep in a tree has the model about
// as soon as its parent, not one whole transfer later as
// PlanModelDistribution assumes (store-and-forward). Then chains and
// narrow trees are nearly free in time and spare the server's uplink: the
// server sends F copies per batch.
//
// A link's rate is the mean rate its residual profile (else its capacity)
// gives a stream that starts now and carries the model (c copies at once
// for an uplink feeding c children, each getting a c-th), so a link that is
// fully reserved for a moment is slow, not unusable. The requesters are
// ranked by their uplink's rate, fastest first, and laid out as an F-ary tree in that order
// (the server feeds the first F, requester i >= F is fed by requester
// (i - F) / F), so slow uplinks end up as leaves (N3). A node with c
// children gives each uplink / c; a requester's rate is the least along its
// path (and its downlink); it has the model after bits / rate plus one
// packet's time and hop_s per hop past the first (the cut-through delay).
// F from 1 to max_fanout is tried, and the star (F = every requester: the
// server sends each copy itself, no tree); the smallest total wins, ties to
// the smaller F (fewer server copies), but a tree must end at least
// min_saving of the star's time sooner than the star. So a tree is used
// only where the server's uplink is what limits the batch (N1), not where
// the requesters' own links do (N3). `deliveries` give every requester its `via` (the server or its
// parent requester), estimated time, stream rate, uplink and number of
// children (`copy_bps`: the slowest server copy); `transfers` is empty: a forwarded
// stream is not a reservation the network model can hold.
struct CutThroughOptions {
  int max_fanout = 4;
  // A tree is taken only if it ends at least this fraction of the star's
  // time sooner than the star: the time saved must pay for what the model
  // leaves out, the forwarders' uplinks (their own pushes come next) and
  // the hop each level adds. 0 = the earliest plan wins.
  double min_saving = 0.2;
  int64_t packet_bytes = 32 * 1024;
  double hop_s = 0.001;  // a forwarding daemon's own delay per hop, beyond the packet's time
};
absl::StatusOr<DistributionPlan> PlanCutThroughDistribution(const DistributionRequest& request,
                                                            const CutThroughOptions& options = {});

// The batch `request` describes (its time, server and hosts), validated as
// every planner's input is (ValidateBatch). Both planners start from it.
absl::StatusOr<Batch> DistributionBatch(const DistributionRequest& request);

// A canonical text form of a plan (every field, full precision): equal plans
// give equal text. Used to compare implementations.
std::string DistributionPlanToText(const DistributionPlan& plan);

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_DISTRIBUTION_H_
