// In-network aggregation (paper §5.2, Alg. 3), used for the server's
// batch, for the replica's (§5.3, with the replica's own aggregators) and in
// synchronous mode over a list (§6).
//
// Given items in commit order with their direct transfer schedules (as Alg. 2
// reserved them one after another), and k aggregators in a pre-assigned
// (seeded random) order, Alg. 3 tries every split point n = 0..|U|: the first
// n items go directly to the destination with their Alg. 2 schedules; then
// aggregator 1 collects the following items as long as each can reach it no
// later than t_max, the time until which the destination link is busy
// ("never leave the server link fallow"); when the next item would not make
// it, aggregator 1's aggregate is sent to the destination and t_max moves to
// its arrival; aggregator 2 continues, and so on. Order is preserved inside
// and across groups. The split with the least total time (until everything
// has arrived, eq. 16) wins; ties go to the larger n (fewer aggregation hops,
// earlier individual commits). A split is chosen over sending everything
// direct (n = |U|) only when it ends at least kMinAggregationGain_s sooner:
// sharded batches often tie to within rounding (the same worker uplink
// limits both schedules), and an extra hop for 10^-14 s is no gain.
//
// Our reading of the paper's open points, documented here:
//  - k + 1 groups at most (§5.2); the last aggregator takes every remaining
//    item without the t_max constraint, otherwise that split is infeasible.
//  - An aggregator whose group would be empty is skipped (no transfer).
//  - An aggregate starts when its last constituent has arrived and is as
//    large as its largest constituent (a sum of equally shaped updates).
//  - t_max never decreases (it is the running maximum of arrivals).
//
// Sharded items (our extension; §10.2 schedules a model split across
// several servers without aggregation): an item with `shards` has parts
// 0..S-1, part 0 to dst_host and part p to shards[p-1].dst_host. Its direct
// arrival is the latest of its parts' direct transfers. At an aggregator
// each part is a transfer of its own, in part order, each filled on the
// path from the worker from now_s and reserved before the next; since they
// share that path, the next part finds it saturated until the previous one
// ends, so this is computed as one fill of the parts' sum cut at the part
// boundaries (the same schedule, one fill instead of S). The item reaches
// the aggregator with its last part, and the admission rule uses that time.
// The aggregator then sends one aggregate per part, in part order, to that
// part's host, as large as the group's largest part of that index, each
// starting when the group's last member has arrived, reserved in turn; the
// group (and each member) arrives with the latest of them. A group's
// members share one part layout (the same hosts in the same order); an item
// with another layout starts the next group (at the last aggregator the
// split is infeasible). The lower bound below does not hold for the
// per-part aggregates as it stands, so for sharded inputs only its
// last-aggregator case is used, with a bound of their own from the workers'
// uplinks: an aggregated item's bits leave its worker's uplink, then its
// group's aggregates leave the aggregator's (SplitSearch::UplinkBound).
// AggregateChains does not take sharded items.
//
//   AggregationResult agg = Aggregate(input, &net, PlannerOptions{});
//   // net (the network *without* the items' direct reservations on input)
//   // now carries the chosen schedule: direct prefix + groups.
//
// Optimised implementation (same result as PlannerOptions::reference):
// split points reuse one network with the direct prefix applied
// incrementally and undo the rest through the journal (instead of a copy
// per split point); a split point is skipped, or abandoned mid-way, as soon
// as a lower bound on its total exceeds the best total found (the running
// t_max, or what the remaining aggregators' downlinks can absorb before the
// server link frees; see SplitSearch::LowerBound); a coarse pass over every
// 16th split point (and those whose bound is the least of all, when at most
// four share it) seeds the best total first; and the split
// points may be divided between `threads` threads, each with its own network
// copy, joined before returning. Pruning only removes strictly worse split
// points, so the result never depends on thread timing.
//
// Our departure for sharded batches of many items (at least
// PlannerOptions::sampled_split_from ordered items, default 64): the search
// tries a sample of the split points, not all of them: the coarse pass's
// (every 16th and those of least bound), the last quarter (few items
// aggregated: cheap to try, and often the winner), and every split point
// within a 16th of the batch of the best of those. Such a batch's split
// points each send S aggregates per group, and trying them all took most
// of its planning time at 1000 workers on 96 shards; the sample finds the
// exhaustive search's split in most batches and otherwise one whose total
// is within a fraction of a percent (planner_benchmark --sim_shards,
// scheduler/core/README.md). With the option at 0 the search is exhaustive
// and gives the reference implementation's split.
//
// Thread safety: pure function of its arguments.
#ifndef MLFABRIC_SCHEDULER_CORE_AGGREGATION_H_
#define MLFABRIC_SCHEDULER_CORE_AGGREGATION_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "scheduler/core/network.h"
#include "scheduler/core/prepared_batch.h"

namespace mlfabric::core {

inline constexpr double kMinAggregationGain_s = 1e-6;

// One further part of a sharded item (§10.2): `bytes` to `dst_host`.
struct AggregationPart {
  int dst_host = -1;
  int64_t bytes = 0;
};

struct AggregationItem {
  int update = -1;  // index into Batch::updates
  int worker = -1;
  int64_t bytes = 0;  // part 0, to AggregationInput::dst_host
  // Parts 1.. of an update to a model split across servers (§10.2,
  // UpdateRequest::shards), in part order; empty for a single-server update.
  std::vector<AggregationPart> shards;
};

struct AggregationInput {
  double now_s = 0;
  int dst_host = -1;
  std::vector<AggregationItem> items;  // commit order
  // Per item: its direct transfer to dst_host, computed on the input network
  // with the previous items' direct transfers reserved (Alg. 2 / list order).
  std::vector<PlannedTransfer> direct;
  // Per item, for sharded items: the direct transfers of parts 1.., in part
  // order, reserved after `direct` and before the next item's. May be empty
  // (no item has shards) or shorter than `items`.
  std::vector<std::vector<PlannedTransfer>> shard_direct;
  std::vector<int> aggregators;  // host indices, in pre-assigned group order
  TransferKind to_aggregator_kind = TransferKind::kToAggregator;
  TransferKind aggregate_kind = TransferKind::kAggregate;
};

struct AggregationGroup {
  int aggregator = -1;
  std::vector<int> items;  // positions in AggregationInput::items
  // Per member in commit order: one transfer per part, in part order.
  std::vector<PlannedTransfer> to_aggregator;
  PlannedTransfer aggregate;  // part 0, to dst_host
  // Sharded groups: parts 1.., in part order, each to its part's host.
  std::vector<PlannedTransfer> shard_aggregates;
};

struct AggregationResult {
  int split = 0;       // the first `split` items go directly
  double total_s = 0;  // when everything has arrived at dst_host
  std::vector<AggregationGroup> groups;
  std::vector<double> arrival_s;  // per item: its (or its aggregate's) arrival
};

// Alg. 3 on `*net` (see the file comment for what `*net` holds before/after).
AggregationResult Aggregate(const AggregationInput& input, Network* net,
                            const PlannerOptions& options);

// Alg. 3's choice alone: the split point and its total on `base` (the
// network without the items' direct reservations), nothing reserved.
// Aggregate is ChooseSplit then AggregateWithSplit; a caller whose network
// already holds every direct transfer (in item order) may skip the second
// when the split is items.size() (everything direct).
struct AggregationSplit {
  int split = 0;
  double total_s = 0;
};
AggregationSplit ChooseSplit(const AggregationInput& input, const Network& base,
                             const PlannerOptions& options);

// The lower bounds ChooseSplit prunes split points with, per split point
// n < items.size(), on `base` (-kInfinity where none is known); each is at
// most what AggregateWithSplit(input, n, copy of base) totals. For tests.
std::vector<double> SplitLowerBounds(const AggregationInput& input, const Network& base);

// DetAgg(split) alone (Alg. 3 lines 1-20 for one split point), applied to
// `*net` like Aggregate; total_s is kInfinity when the split is infeasible.
// For tests and what-if analysis.
AggregationResult AggregateWithSplit(const AggregationInput& input, int split, Network* net);

// Direct transfers of `items` to `dst_host` in order, each reserved on `*net`
// before the next (the "tentative" schedule Alg. 3 starts from). Items that
// cannot reach dst_host at all get a transfer with end_s = kInfinity.
std::vector<PlannedTransfer> SequentialDirect(const std::vector<AggregationItem>& items,
                                              int dst_host, double now_s, TransferKind kind,
                                              Network* net);

// Streaming chains (our extension of Alg. 3 for a saturated server link,
// scheduler/core/README.md "Streaming chains"). The daemons sum packet by
// packet and forward each summed packet at once (Mercury's immediate
// aggregation), so an aggregate need not wait for its last constituent:
// w1 -> w2 -> ... -> wg -> dst, where each w_j adds its own update to the
// partial sum streaming through it, moves every byte over each link once,
// in lock-step. In the fluid model such a chain is one path made of every
// hop's links (up(w1), down(w2), up(w2), ..., down(dst)): it fills that
// path's residual bottleneck at every instant, and the server's downlink
// carries one update's bytes for the whole chain instead of g.
//
// Greedy, in commit order: item i opens a chain; item i+1 extends it when
// it has the chain's size (the daemons sum equally shaped updates), its
// worker is an aggregator (another update of a host already in the chain
// is summed there, with no link of its own; a new host joins next to dst
// while the chain has fewer than `max_hops` hosts), and the sum of the
// members' arrivals is no larger
// than with the chain as it is followed by item i+1 on its own (so a member
// whose slow link would slow the whole chain stays out of it). A chain of one item is an
// ordinary direct transfer; when every chain has one item the schedule is
// Alg. 2's direct schedule. Order is preserved inside and across chains.
// Sharded items (§10.2) are not chained: with any of them the result has
// total_s = kInfinity and no chain.
struct AggregationChain {
  std::vector<int> items;  // positions in AggregationInput::items, commit order
  std::vector<int> hosts;  // distinct; the chain runs hosts[0] -> ... -> dst
  std::vector<int> node;   // per item: the index into `hosts` of its worker
  int64_t bytes = 0;       // every member's size (every hop moves this many)
  double start_s = 0;
  double end_s = 0;
  std::vector<RateSegment> segments;  // every hop moves at these rates
};

struct ChainResult {
  double total_s = 0;  // when everything has arrived at dst_host
  std::vector<AggregationChain> chains;
  std::vector<double> arrival_s;  // per item
  int chained = 0;                // items in chains of two or more
};

// The chain schedule on `*net` (the network without the items' direct
// reservations), which then carries it. Only `input.items`, `dst_host`,
// `now_s` and `aggregators` (as a set) are used; total_s is kInfinity when
// some item cannot reach dst_host. `*net` is left journaling (with an empty
// journal).
ChainResult AggregateChains(const AggregationInput& input, int max_hops, Network* net);

// The links of a chain hosts[0] -> ... -> hosts.back() -> dst on `net`;
// nullopt when they are more than a Path holds (LinkList::kMaxLinks).
std::optional<Path> ChainPath(const std::vector<int>& hosts, int dst, const Network& net);

// A seeded Fisher-Yates shuffle (SplitMix64): the random pre-assignment of
// aggregators to groups (§5.2), deterministic across platforms.
std::vector<int> ShuffleAggregators(std::vector<int> hosts, uint64_t seed);

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_AGGREGATION_H_
