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
    peaks_.resize(n);
    shared_.resize(n);
    read_again_.resize(n);
    key_.assign(n, 0);
    alive_.assign(n, true);
    for (int u = 0; u < n; ++u) {
      const PreparedUpdate& update = batch.updates[u];
      for (const PreparedPart& part : update.parts) {
        Path path = net->PathBetween(update.worker, part.dst_host);
        // A same-host part (empty path) moves at the local copy rate.
        double peak = path.links.empty() ? kLocalCopyBps : kInfinity;
        for (int link : path.links) peak = std::min(peak, net->PeakRate(link));
        key_[u] = std::max(key_[u], peak > 0 ? part.bits / peak : kInfinity);
        local_parts_ = local_parts_ || path.links.empty();
        paths_[u].push_back(std::move(path));
        peaks_[u].push_back(peak);
        const int down = net->DownlinkOf(part.dst_host);
        if (std::find(dst_downlinks_.begin(), dst_downlinks_.end(), down) == dst_downlinks_.end()) {
          dst_downlinks_.push_back(down);
        }
      }
      by_deadline_[update.deadline].push_back(u);
      if (update.parts.size() > 1) {
        NoteSharedLinks(u);
        NoteReadAgain(u);
      }
    }
    sorted_.resize(n);
    for (int u = 0; u < n; ++u) sorted_[u] = u;
    std::stable_sort(sorted_.begin(), sorted_.end(),
                     [&](int a, int b) { return key_[a] < key_[b]; });
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
      if (pick.t_en == kInfinity) {
        result_.drops.push_back({g, "no_bandwidth"});
        continue;
      }
      const bool forced = batch_.updates[g].deadline == pos;
      if (!forced) {
        Commit(g, net_);
        ++pos;
        continue;
      }
      // §5.1.3 look-ahead: schedule g*, find the next pick on NetUp(NW, g*).
      if (options_.reference) {
        Network after = *net_;
        std::vector<PlannedTransfer> transfers = ReserveAll(g, &after);
        const Pick lookahead = PickAt(pos + 1, after);
        if (lookahead.update >= 0 && pick.t_en > lookahead.t_en) {
          result_.drops.push_back({g, "deadline_lookahead"});
          continue;
        }
        *net_ = std::move(after);
        Append(g, std::move(transfers));
      } else {
        const size_t mark = net_->JournalMark();
        std::vector<PlannedTransfer> transfers = ReserveAll(g, net_);
        const Pick lookahead = PickAt(pos + 1, *net_);
        if (lookahead.update >= 0 && pick.t_en > lookahead.t_en) {
          net_->RollbackTo(mark);
          result_.drops.push_back({g, "deadline_lookahead"});
          continue;
        }
        Append(g, std::move(transfers));
        // Nothing changes before the next step's pick: reuse it.
        next = lookahead;
        have_next = lookahead.update >= 0;
      }
      ++pos;
    }
    if (!options_.reference) net_->DiscardJournal();
    return std::move(result_);
  }

 private:
  struct Pick {
    int update = -1;
    double t_en = kInfinity;
  };

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

  // t_en(g) = max_j t_en(g^j), the parts reserved one after another (eq. 18).
  // `cutoff`: the caller only needs to know whether t_en beats it, so a
  // multi-part update stops once a part ends after it (t_en is the latest
  // part's end) and returns that end, which is above `cutoff` as t_en is.
  double TEn(int u, const Network& net, double cutoff = kInfinity) const {
    const PreparedUpdate& update = batch_.updates[u];
    if (update.parts.size() == 1) {
      return net.FillEnd(paths_[u][0], batch_.now_s, update.parts[0].bits, options_.reference);
    }
    if (!options_.reference && &net == net_) {
      // Multi-part (§10.2): the parts are reserved in turn on the orderer's
      // own network and undone through its journal (Run keeps one), which
      // restores it bit for bit. A copy of the network per candidate took
      // most of the planning time of sharded batches at 1000 workers.
      // A part is reserved only on the links a later part of the same
      // update reads again (read_again_): no other fill of this t_en sees
      // the rest, so the result is the same bit for bit at a fraction of
      // the reservations (a sharded update's parts share just the uplink).
      const size_t mark = net_->JournalMark();
      double end = 0;
      for (size_t j = 0; j < update.parts.size(); ++j) {
        const double part_end =
            net_->FillInto(paths_[u][j], batch_.now_s, update.parts[j].bits, &segments_);
        end = std::max(end, part_end);
        if (part_end == kInfinity || end > cutoff) break;  // never fits, or cannot win
        if (!read_again_[u][j].links.empty()) net_->Reserve(read_again_[u][j], segments_);
      }
      net_->RollbackTo(mark);
      return end;
    }
    Network scratch = net;  // the reference implementation: a copy
    double end = 0;
    for (size_t j = 0; j < update.parts.size(); ++j) {
      FillResult fill = scratch.Fill(paths_[u][j], batch_.now_s, update.parts[j].bits);
      if (!fill.feasible) return kInfinity;
      end = std::max(end, fill.end_s);
      scratch.Reserve(paths_[u][j], fill.segments);
    }
    return end;
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
      if (use.first > 1) shared_[u].push_back({link, use.second});
    }
  }

  // For each part of a multi-part update, the links of its path that a
  // later part crosses too: what TEn must reserve for the parts after it.
  void NoteReadAgain(int u) {
    const std::vector<Path>& paths = paths_[u];
    std::map<int, size_t> last_part;  // link -> the last part crossing it
    for (size_t j = 0; j < paths.size(); ++j) {
      for (int link : paths[j].links) last_part[link] = j;
    }
    read_again_[u].resize(paths.size());
    for (size_t j = 0; j < paths.size(); ++j) {
      for (int link : paths[j].links) {
        if (last_part[link] > j) read_again_[u][j].links.push_back(link);
      }
    }
  }

  // A lower bound on TEn(u) for a multi-part update: however its parts share
  // a link, together they move no more bits by time t than that link's
  // residual capacity carries from now to t, so the last one ends no sooner
  // than one transfer of all their bits over that link alone would (§10.2:
  // S parts leave through one uplink; the per-part bound below sees only
  // one part's bits). Exact for the link's current reservations.
  double SharedLinkBound(int u, const Network& net) const {
    double bound = 0;
    for (const auto& [link, bits] : shared_[u]) {
      Path alone;
      alone.links.push_back(link);
      bound = std::max(bound, net.FillEnd(alone, batch_.now_s, bits));
    }
    return bound;
  }

  // A lower bound on TEn(u): no part moves a byte before every link of its
  // path has residual capacity, nor faster than the path's peak rate.
  double LowerBound(int u, const Network& net) const {
    const PreparedUpdate& update = batch_.updates[u];
    double bound = 0;
    for (size_t j = 0; j < update.parts.size(); ++j) {
      double open = net.start_s();
      for (int link : paths_[u][j].links) open = std::max(open, net.OpenFrom(link));
      bound = std::max(bound, open + (peaks_[u][j] > 0 ? update.parts[j].bits / peaks_[u][j]
                                                        : kInfinity));
    }
    return bound;
  }

  static bool Better(double t, int u, const Pick& best) {
    return best.update < 0 || t < best.t_en || (t == best.t_en && u < best.update);
  }

  // ShrtDLine(pos, U - P, net): the update due at `pos` if any, else the one
  // with the shortest t_en. Updates already late for `pos` are not eligible.
  Pick PickAt(int64_t pos, const Network& net) const {
    Pick best;
    auto due = by_deadline_.find(pos);
    if (due != by_deadline_.end()) {
      for (int u : due->second) {
        if (!alive_[u]) continue;
        const double t = TEn(u, net);
        if (Better(t, u, best)) best = {u, t};
      }
      if (best.update >= 0) return best;
    }
    if (options_.reference) {
      for (int u = 0; u < static_cast<int>(alive_.size()); ++u) {
        if (!alive_[u] || batch_.updates[u].deadline < pos) continue;
        const double t = TEn(u, net);
        if (Better(t, u, best)) best = {u, t};
      }
      return best;
    }
    // No update ends before the earliest destination downlink opens, plus
    // its key; a same-host part needs no downlink, so then only `now`.
    double floor = local_parts_ ? net.start_s() : kInfinity;
    for (int link : dst_downlinks_) floor = std::min(floor, net.OpenFrom(link));
    for (int p = head_; p >= 0; p = next_[p]) {
      const int u = sorted_[p];
      if (best.update >= 0 && floor + key_[u] - Slack(floor + key_[u]) > best.t_en) break;
      if (batch_.updates[u].deadline < pos) continue;
      if (best.update >= 0) {
        const double bound = LowerBound(u, net);
        if (bound - Slack(bound) > best.t_en) continue;
        if (!shared_[u].empty()) {
          const double shared = SharedLinkBound(u, net);
          if (shared - Slack(shared) > best.t_en) continue;
        }
      }
      const double t = TEn(u, net, best.update >= 0 ? best.t_en : kInfinity);
      if (Better(t, u, best)) best = {u, t};
    }
    return best;
  }

  std::vector<PlannedTransfer> ReserveAll(int u, Network* net) const {
    const PreparedUpdate& update = batch_.updates[u];
    std::vector<PlannedTransfer> transfers;
    for (size_t j = 0; j < update.parts.size(); ++j) {
      FillResult fill = net->Fill(paths_[u][j], batch_.now_s, update.parts[j].bits);
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
      transfers.push_back(std::move(t));
    }
    return transfers;
  }

  void Commit(int u, Network* net) { Append(u, ReserveAll(u, net)); }

  void Append(int u, std::vector<PlannedTransfer> transfers) {
    double arrival = batch_.now_s;
    for (const PlannedTransfer& t : transfers) arrival = std::max(arrival, t.end_s);
    result_.order.push_back(u);
    result_.direct.push_back(std::move(transfers));
    result_.arrival_s.push_back(arrival);
  }

  const PreparedBatch& batch_;
  Network* net_;
  const PlannerOptions& options_;
  std::vector<std::vector<Path>> paths_;
  std::vector<std::vector<double>> peaks_;
  std::vector<std::vector<std::pair<int, double>>> shared_;  // NoteSharedLinks
  std::vector<std::vector<Path>> read_again_;                // NoteReadAgain
  mutable std::vector<RateSegment> segments_;  // TEn's scratch: one fill at a time
  std::vector<double> key_;
  std::vector<int> dst_downlinks_;
  bool local_parts_ = false;  // some part's worker is its destination host
  std::vector<bool> alive_;
  std::map<int64_t, std::vector<int>> by_deadline_;
  // Alive updates as a linked list in `key_` order.
  std::vector<int> sorted_, next_, prev_, slot_;
  int head_ = -1;
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
  }
  return result;
}

}  // namespace mlfabric::core
