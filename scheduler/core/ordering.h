// Update ordering (paper §5.1, Alg. 2) and its synchronous counterpart (§6).
//
// OrderUpdates builds the commit order of one server's batch greedily:
// at position i it takes the update whose deadline dl(g) = v(g) + tau_max -
// v_init (eq. 9) is i, if any, else the update with the shortest t_en on the
// current residual network (shortest transfer first, §5.1.1); each pick is
// reserved (NetUp) before the next. When the pick was forced by its deadline
// it looks ahead (§5.1.3): if the next pick, scheduled on the network after
// the forced one, would finish first, the forced update is dropped at its
// worker ("deadline_lookahead") so the server link never idles for it.
// Updates whose deadline has passed (dl(g) < i) are dropped ("stale"); updates
// whose path never offers capacity are dropped ("no_bandwidth").
//
// Multi-server models (§10.2): all parts of an update are reserved together
// (the main part first, then the shards in input order) and
// t_en(g) = max_j t_en(g^j) (eq. 18).
//
//   Network net = Network::FromBatch(batch).value();
//   PreparedBatch prepared = PrepareBatch(batch, net).value();
//   OrderingResult ordering = OrderUpdates(prepared, &net, PlannerOptions{});
//   // net now carries the reservations of every ordered direct transfer.
//
// Why look-ahead only after forced picks: when g* is the shortest update,
// every other update g had t_en(g) >= t_en(g*) before NetUp(g*), and NetUp
// only lowers residuals, so the next pick cannot finish first. Alg. 2 line
// 11 can therefore only fire after a deadline-forced pick (as §5.1.3 says).
// That argument holds for single-part batches only. A multi-part update's
// t_en (eq. 18, its parts reserved one after another) is not monotone in
// the reservations: a busier downlink can hold one part back and let
// another part onto the shared uplink early enough to finish sooner, so
// after an unforced pick of a multi-part batch the next pick may finish
// first. Nothing is dropped then: the look-ahead still runs only after
// forced picks, as §5.1.3 defines it, and the order is still the
// shortest-first choice at each step; only the arrival times are not
// sorted. (Reserving an update's parts at once, each on a share of the
// uplink, makes t_en monotone, but it changes the plans of every sharded
// batch and made busy-link batches 1.6-8x slower to plan; README.md,
// "Benchmark (§7.4)".)
//
// Optimised implementation (PlannerOptions::reference = false), same result:
// candidates are scanned in order of a static lower bound
// key(g) = max_j bits_j / peak(path_j) and the scan stops once
// open_floor + key(g) exceeds the best t_en found (a transfer moves no byte
// before its destination downlink first has residual capacity), and a
// candidate is skipped when a lower bound on its t_en already exceeds that
// best (per part; for a multi-part update also all its parts' bits through
// the link they share, its worker's uplink); the
// look-ahead uses the network journal instead of a copy and its pick is
// reused as the next step's pick.
//
// Thread safety: pure function of its arguments.
#ifndef MLFABRIC_SCHEDULER_CORE_ORDERING_H_
#define MLFABRIC_SCHEDULER_CORE_ORDERING_H_

#include <string>
#include <utility>
#include <vector>

#include "scheduler/core/network.h"
#include "scheduler/core/prepared_batch.h"

namespace mlfabric::core {

struct OrderingResult {
  std::vector<int> order;                          // update indices, commit order
  std::vector<std::pair<int, std::string>> drops;  // update index, reason
  // Per position in `order`: the direct transfers, one per part.
  std::vector<std::vector<PlannedTransfer>> direct;
  // Per position: when the last part arrives (max_j t_en).
  std::vector<double> arrival_s;
};

// Alg. 2 on `*net` (which ends up carrying the ordered reservations).
OrderingResult OrderUpdates(const PreparedBatch& batch, Network* net,
                            const PlannerOptions& options);

// §6: the batch's updates as a list in input order (no deadlines, no
// ordering); each is reserved directly, in turn, on `*net`.
OrderingResult ListSchedule(const PreparedBatch& batch, Network* net);

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_ORDERING_H_
