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
// whose path never offers capacity, or whose parts cannot all be reserved in
// turn where a link's capacity ends, are dropped ("no_bandwidth").
//
// Multi-server models (§10.2): all parts of an update are reserved together
// (the main part first, then the shards in input order), and its arrival is
// the latest part's end (eq. 18). The key such an update is ordered by is
// not that arrival but a bound on it (our departure from Alg. 2 for sharded
// batches): the latest of each part's t_en alone on the current network and
// of all its parts' bits through each link several of them cross (its
// worker's uplink) as one transfer. A single-part update's key is its t_en.
//
//   Network net = Network::FromBatch(batch).value();
//   PreparedBatch prepared = PrepareBatch(batch, net).value();
//   OrderingResult ordering = OrderUpdates(prepared, &net, PlannerOptions{});
//   // net now carries the reservations of every ordered direct transfer.
//
// Why look-ahead only after forced picks: when g* has the least key, every
// other update g had key(g) >= key(g*) before NetUp(g*), and NetUp only
// lowers residuals, which never lowers a key, so the next pick cannot come
// first. Alg. 2 line 11 can therefore only fire after a deadline-forced
// pick (as §5.1.3 says). Eq. 18's t_en itself is not monotone in the
// reservations (a busier downlink can hold one part back and let another
// onto the shared uplink early enough to finish sooner), which is why the
// key is the bound: with it this argument holds for sharded batches too,
// and a key computed earlier stays a lower bound, so picks can be lazy.
// Ordered by the bound, the simulator at 1000 workers on 96 shards spent
// 7x less time per plan and applied 1.10x and 0.96x the gradients with two
// seeds (scheduler/core/README.md, "Benchmark (§7.4)", sharded batches).
//
// Optimised implementation (PlannerOptions::reference = false), same result:
// for batches with multi-part updates, a lazy queue of keys that were
// exact when computed (lower bounds now); an update whose key, made exact
// in this step, is still the least is the pick. For single-part batches,
// where each pick reserves the server's downlink that nearly every
// candidate crosses, a scan in the order of the static bound
// bits / peak(path), stopped once the downlinks' opening plus that bound
// exceeds the best t_en found, and skipping a candidate whose own links'
// opening bounds it out. The look-ahead uses the network journal instead
// of a copy and its pick is reused as the next step's pick.
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
  // Per position: the ordering key it was picked with (the update's t_en
  // for a single part; for several, the bound described above).
  std::vector<double> key_s;
};

// Alg. 2 on `*net` (which ends up carrying the ordered reservations).
OrderingResult OrderUpdates(const PreparedBatch& batch, Network* net,
                            const PlannerOptions& options);

// §6: the batch's updates as a list in input order (no deadlines, no
// ordering); each is reserved directly, in turn, on `*net`.
OrderingResult ListSchedule(const PreparedBatch& batch, Network* net);

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_ORDERING_H_
