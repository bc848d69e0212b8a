#include "scheduler/core/ordering.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

namespace mlfabric::core {

namespace {

// Lower bounds compared against exact fills carry a tiny relative slack so
// that rounding in the fill walk can never make the pruning skip a winner.
double Slack(double x) { return 1e-9 * (std::abs(x) + 1.0); }

class Orderer {
 public:
  Orderer(const PreparedBatch& batch, Network* net, const PlannerOptions& options)
      : batch_(batch), net_(net), options_(options) {
    const int n = static_cast<int>(batch.updates.size());
    paths_.resize(n);
    shared_.resize(n);
    alive_.assign(n, true);
    fresh_.assign(n, 0);
    peaks_.resize(n);
    static_key_.assign(n, 0);
    binding_.assign(n, 0);
    for (int u = 0; u < n; ++u) {
      const PreparedUpdate& update = batch.updates[u];
      for (const PreparedPart& part : update.parts) {
        Path path = net->PathBetween(update.worker, part.dst_host);
        // A same-host part (empty path) moves at the local copy rate.
        double peak = path.links.empty() ? kLocalCopyBps : kInfinity;
        for (int link : path.links) peak = std::min(peak, net->PeakRate(link));
        static_key_[u] = std::max(static_key_[u], peak > 0 ? part.bits / peak : kInfinity);
        local_parts_ = local_parts_ || path.links.empty();
        const int down = net->DownlinkOf(part.dst_host);
        if (std::find(dst_downlinks_.begin(), dst_downlinks_.end(), down) == dst_downlinks_.end()) {
          dst_downlinks_.push_back(down);
        }
        paths_[u].push_back(std::move(path));
        peaks_[u].push_back(peak);
      }
      by_deadline_[update.deadline].push_back(u);
      if (update.parts.size() > 1) NoteSharedLinks(u);
    }
    if (batch.multi_server) {
      // No key is below the batch's start: every update is a candidate
      // for the first pick, which evaluates them all (with cutoffs).
      for (int u = 0; u < n; ++u) heap_.push_back({net->start_s(), u});
      std::make_heap(heap_.begin(), heap_.end(), HeapAfter);
    }
    sorted_.resize(n);
    for (int u = 0; u < n; ++u) sorted_[u] = u;
    std::stable_sort(sorted_.begin(), sorted_.end(),
                     [&](int a, int b) { return static_key_[a] < static_key_[b]; });
    next_.resize(n);
    prev_.resize(n);
    slot_.resize(n);
    for (int p = 0; p < n; ++p) {
      next_[p] = p + 1 < n ? p + 1 : -1;
      prev_[p] = p - 1;
      slot_[sorted_[p]] = p;
    }
    head_ = n > 0 ? 0 : -1;
    remaining_ = n;
  }

  OrderingResult Run() {
    if (!options_.reference) net_->BeginJournal();
    int64_t pos = 1;
    bool have_next = false;
    Pick next;
    while (remaining_ > 0) {
      DropStale(pos);
      if (remaining_ == 0) break;
      const Pick pick = have_next ? next : PickAt(pos, *net_);
      have_next = false;
      if (pick.update < 0) break;
      const int g = pick.update;
      Remove(g);
      if (pick.key == kInfinity) {
        result_.drops.push_back({g, "no_bandwidth"});
        continue;
      }
      const bool forced = batch_.updates[g].deadline == pos;
      std::vector<PlannedTransfer> transfers;
      if (options_.reference) {
        Network after = *net_;
        if (!ReserveAll(g, &after, &transfers)) {
          result_.drops.push_back({g, "no_bandwidth"});
          continue;
        }
        // §5.1.3 look-ahead: the next pick on NetUp(NW, g*).
        if (forced) {
          const Pick lookahead = PickAt(pos + 1, after);
          if (lookahead.update >= 0 && pick.key > lookahead.key) {
            result_.drops.push_back({g, "deadline_lookahead"});
            continue;
          }
        }
        *net_ = std::move(after);
      } else {
        // The network is undone through its journal; the look-ahead's
        // keys, computed on NetUp(NW, g*), are no lower bounds on NW, so
        // the queue is restored with it.
        const size_t mark = net_->JournalMark();
        std::vector<HeapEntry> saved;
        if (forced) saved = heap_;
        if (!ReserveAll(g, net_, &transfers)) {
          net_->RollbackTo(mark);
          result_.drops.push_back({g, "no_bandwidth"});
          continue;
        }
        if (forced) {
          const Pick lookahead = PickAt(pos + 1, *net_);
          if (lookahead.update >= 0 && pick.key > lookahead.key) {
            net_->RollbackTo(mark);
            heap_ = std::move(saved);
            result_.drops.push_back({g, "deadline_lookahead"});
            continue;
          }
          // Nothing changes before the next step's pick: reuse it.
          next = lookahead;
          have_next = lookahead.update >= 0;
        }
      }
      Append(g, pick.key, std::move(transfers));
      // Nothing before this pick is undone: the journal need not keep it.
      if (!options_.reference) net_->DiscardJournal();
      ++pos;
    }
    if (!options_.reference) net_->DiscardJournal();
    return std::move(result_);
  }

 private:
  struct Pick {
    int update = -1;
    double key = kInfinity;  // Key(update) on the network it was picked on
  };
  // The optimised pick's queue: `key` is a lower bound on Key(u) on the
  // current network (exact when fresh_[u] is the current call).
  struct HeapEntry {
    double key;
    int u;
  };
  // std::*_heap keep the largest first; this puts the least (key, u) first.
  static bool HeapAfter(const HeapEntry& a, const HeapEntry& b) {
    return a.key > b.key || (a.key == b.key && a.u > b.u);
  }

  void Remove(int u) {
    alive_[u] = false;
    --remaining_;
    const int p = slot_[u];
    if (prev_[p] >= 0) next_[prev_[p]] = next_[p]; else head_ = next_[p];
    if (next_[p] >= 0) prev_[next_[p]] = prev_[p];
  }

  void DropStale(int64_t pos) {
    while (!by_deadline_.empty() && by_deadline_.begin()->first < pos) {
      for (int u : by_deadline_.begin()->second) {
        if (alive_[u]) {
          Remove(u);
          result_.drops.push_back({u, "stale"});
        }
      }
      by_deadline_.erase(by_deadline_.begin());
    }
  }

  // The ordering key. A single-part update's is its t_en (Fig. 4(b)). A
  // multi-part update's (§10.2) is the latest of what each part could do
  // alone on the current network: each part filled on its own path, and
  // all parts that share a link (its worker's uplink) filled through that
  // link as one transfer. It bounds eq. 18's t_en, its parts reserved one
  // after another, from below, and unlike that t_en it never falls when
  // the network gains a reservation, so a key computed earlier is a lower
  // bound later (the lazy queue in PickAt) and §5.1.3's look-ahead
  // argument holds for sharded batches too (ordering.h).
  // `cutoff`: the caller only needs to know whether the key beats it; once
  // a term exceeds it the rest is skipped, *exact is false and the result
  // is a lower bound above `cutoff`.
  // The optimised implementation starts at the part whose term last
  // passed a cutoff (or was the largest): keys rise as reservations land,
  // mostly on the same busy downlink, so a cut-off evaluation then ends
  // after one walk. The key is a maximum, the same in any order.
  double Key(int u, const Network& net, double cutoff, bool* exact) {
    const PreparedUpdate& update = batch_.updates[u];
    double key = -kInfinity;  // a batch's clock may start below 0
    *exact = false;
    for (const SharedLink& shared : shared_[u]) {  // one fill each, usually the largest term
      key = std::max(key, net.FillEnd(shared.alone, batch_.now_s, shared.bits, options_.reference));
      if (key > cutoff) return key;
    }
    const size_t parts = update.parts.size();
    const size_t first = options_.reference ? 0 : binding_[u];
    size_t binding = first;
    double largest = -kInfinity;
    for (size_t i = 0, j = first; i < parts; ++i, j = j + 1 == parts ? 0 : j + 1) {
      const double end = net.FillEnd(paths_[u][j], batch_.now_s, update.parts[j].bits,
                                     options_.reference);
      if (end > largest) {
        largest = end;
        binding = j;
      }
      key = std::max(key, end);
      if (key > cutoff) {
        binding_[u] = binding;
        return key;
      }
    }
    binding_[u] = binding;
    *exact = true;
    return key;
  }

  // Links that several parts of a multi-part update cross (its worker's
  // uplink, unless a topology says otherwise), with the bits they carry.
  void NoteSharedLinks(int u) {
    const PreparedUpdate& update = batch_.updates[u];
    std::map<int, std::pair<int, double>> crossing;  // link -> parts, bits
    for (size_t j = 0; j < update.parts.size(); ++j) {
      for (int link : paths_[u][j].links) {
        auto& [parts, bits] = crossing[link];
        ++parts;
        bits += update.parts[j].bits;
      }
    }
    for (const auto& [link, use] : crossing) {
      if (use.first < 2) continue;
      SharedLink shared;
      shared.alone.links.push_back(link);
      shared.bits = use.second;
      shared_[u].push_back(std::move(shared));
    }
  }

  static bool Better(double key, int u, const Pick& best) {
    return best.update < 0 || key < best.key || (key == best.key && u < best.update);
  }

  // ShrtDLine(pos, U - P, net): the update due at `pos` if any, else the one
  // with the least key (ties: the earlier update). Updates already late for
  // `pos` are not eligible.
  Pick PickAt(int64_t pos, const Network& net) {
    Pick best;
    bool exact;
    auto due = by_deadline_.find(pos);
    if (due != by_deadline_.end()) {
      for (int u : due->second) {
        if (!alive_[u]) continue;
        const double key = Key(u, net, kInfinity, &exact);
        if (Better(key, u, best)) best = {u, key};
      }
      if (best.update >= 0) return best;
    }
    if (options_.reference) {
      for (int u = 0; u < static_cast<int>(alive_.size()); ++u) {
        if (!alive_[u] || batch_.updates[u].deadline < pos) continue;
        const double key = Key(u, net, kInfinity, &exact);
        if (Better(key, u, best)) best = {u, key};
      }
      return best;
    }
    if (!batch_.multi_server) return ScanAt(pos, net);
    // Lazy queue: every entry's key is a lower bound on its update's key
    // now (keys only rise as reservations are added). An entry made exact
    // in this call that reaches the front is the least, ties included.
    ++call_;
    while (!heap_.empty()) {
      const HeapEntry top = heap_.front();
      if (!alive_[top.u] || batch_.updates[top.u].deadline < pos) {
        std::pop_heap(heap_.begin(), heap_.end(), HeapAfter);
        heap_.pop_back();
        continue;
      }
      if (fresh_[top.u] == call_) return {top.u, top.key};
      std::pop_heap(heap_.begin(), heap_.end(), HeapAfter);
      heap_.pop_back();
      const double cutoff = heap_.empty() ? kInfinity : heap_.front().key;
      const double key = Key(top.u, net, cutoff, &exact);
      if (exact) fresh_[top.u] = call_;
      heap_.push_back({key, top.u});
      std::push_heap(heap_.begin(), heap_.end(), HeapAfter);
    }
    return best;
  }

  // PickAt's candidates for a batch of single-part updates, whose keys are
  // their t_en. Each pick reserves the server's downlink, which nearly
  // every candidate crosses, so earlier keys bound little: a scan in the
  // order of the static bound bits / peak rate, stopped once the earliest
  // destination downlink's opening plus that bound exceeds the best t_en
  // (no byte moves before its downlink has residual capacity), is faster
  // on the §7.4 batches (scheduler/core/README.md).
  Pick ScanAt(int64_t pos, const Network& net) {
    Pick best;
    bool exact;
    // A same-host part needs no downlink, so then the floor is `now`.
    double floor = local_parts_ ? net.start_s() : kInfinity;
    for (int link : dst_downlinks_) floor = std::min(floor, net.OpenFrom(link));
    for (int p = head_; p >= 0; p = next_[p]) {
      const int u = sorted_[p];
      if (best.update >= 0 && floor + static_key_[u] - Slack(floor + static_key_[u]) > best.key) {
        break;
      }
      if (batch_.updates[u].deadline < pos) continue;
      if (best.update >= 0) {
        const double bound = LowerBound(u, net);
        if (bound - Slack(bound) > best.key) continue;
      }
      const double key = Key(u, net, kInfinity, &exact);
      if (Better(key, u, best)) best = {u, key};
    }
    return best;
  }

  // A lower bound on a single-part update's t_en: no byte moves before
  // every link of its path has residual capacity, nor faster than the
  // path's peak rate.
  double LowerBound(int u, const Network& net) const {
    double open = net.start_s();
    for (int link : paths_[u][0].links) open = std::max(open, net.OpenFrom(link));
    return open + (peaks_[u][0] > 0 ? batch_.updates[u].parts[0].bits / peaks_[u][0] : kInfinity);
  }

  // Reserves update u's parts in turn (eq. 18). False, with some parts
  // reserved, when a part finds no capacity after the ones before it
  // (possible only where a link's capacity ends; the caller undoes them).
  bool ReserveAll(int u, Network* net, std::vector<PlannedTransfer>* transfers) const {
    const PreparedUpdate& update = batch_.updates[u];
    transfers->clear();
    for (size_t j = 0; j < update.parts.size(); ++j) {
      FillResult fill = net->Fill(paths_[u][j], batch_.now_s, update.parts[j].bits);
      if (!fill.feasible) return false;
      net->Reserve(paths_[u][j], fill.segments);
      PlannedTransfer t;
      t.update = u;
      t.src = update.worker;
      t.dst = update.parts[j].dst_host;
      t.kind = TransferKind::kDirect;
      t.bytes = update.parts[j].bytes;
      t.start_s = fill.segments.empty() ? batch_.now_s : fill.segments.front().from_s;
      t.end_s = fill.end_s;
      t.segments = std::move(fill.segments);
      transfers->push_back(std::move(t));
    }
    return true;
  }

  void Append(int u, double key, std::vector<PlannedTransfer> transfers) {
    double arrival = batch_.now_s;
    for (const PlannedTransfer& t : transfers) arrival = std::max(arrival, t.end_s);
    result_.order.push_back(u);
    result_.direct.push_back(std::move(transfers));
    result_.arrival_s.push_back(arrival);
    result_.key_s.push_back(key);
  }

  struct SharedLink {
    Path alone;  // the link as a one-link path
    double bits = 0;
  };

  const PreparedBatch& batch_;
  Network* net_;
  const PlannerOptions& options_;
  std::vector<std::vector<Path>> paths_;
  std::vector<std::vector<SharedLink>> shared_;  // NoteSharedLinks
  std::vector<std::vector<double>> peaks_;      // per part: its path's peak rate
  std::vector<double> static_key_;              // max over parts of bits / peak
  std::vector<size_t> binding_;                 // Key: the part to walk first
  std::vector<int> dst_downlinks_;
  bool local_parts_ = false;  // some part's worker is its destination host
  std::vector<bool> alive_;
  std::map<int64_t, std::vector<int>> by_deadline_;
  // ScanAt's alive updates as a linked list in static_key_ order.
  std::vector<int> sorted_, next_, prev_, slot_;
  int head_ = -1;
  // PickAt's lazy queue for batches with multi-part updates.
  std::vector<HeapEntry> heap_;
  std::vector<int64_t> fresh_;  // the PickAt call that made heap_'s entry exact
  int64_t call_ = 0;
  int remaining_ = 0;
  OrderingResult result_;
};

}  // namespace

OrderingResult OrderUpdates(const PreparedBatch& batch, Network* net,
                            const PlannerOptions& options) {
  return Orderer(batch, net, options).Run();
}

OrderingResult ListSchedule(const PreparedBatch& batch, Network* net) {
  OrderingResult result;
  for (const PreparedUpdate& update : batch.updates) {
    std::vector<PlannedTransfer> transfers;
    std::vector<Path> paths;
    bool feasible = true;
    double arrival = batch.now_s;
    for (const PreparedPart& part : update.parts) {
      Path path = net->PathBetween(update.worker, part.dst_host);
      FillResult fill = net->Fill(path, batch.now_s, part.bits);
      if (!fill.feasible) {
        feasible = false;
        break;
      }
      net->Reserve(path, fill.segments);
      PlannedTransfer t;
      t.update = update.index;
      t.src = update.worker;
      t.dst = part.dst_host;
      t.bytes = part.bytes;
      t.start_s = fill.segments.front().from_s;
      t.end_s = fill.end_s;
      t.segments = std::move(fill.segments);
      arrival = std::max(arrival, t.end_s);
      transfers.push_back(std::move(t));
      paths.push_back(std::move(path));
    }
    if (!feasible) {
      for (size_t j = 0; j < transfers.size(); ++j) net->Release(paths[j], transfers[j].segments);
      result.drops.push_back({update.index, "no_bandwidth"});
      continue;
    }
    result.order.push_back(update.index);
    result.direct.push_back(std::move(transfers));
    result.arrival_s.push_back(arrival);
    result.key_s.push_back(arrival);
  }
  return result;
}

}  // namespace mlfabric::core
