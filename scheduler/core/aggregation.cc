#include "scheduler/core/aggregation.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <thread>
#include <unordered_map>

namespace mlfabric::core {

namespace {

double Slack(double x) { return 1e-9 * (std::abs(x) + 1.0); }

// ChooseSplit's coarse pass also takes the split points of least bound when
// at most this many share it (more are no hint which split wins).
constexpr int kLeastBoundSplits = 4;

// Whether two items' parts go to the same hosts in the same order (part 0
// always goes to the input's dst_host).
bool SameLayout(const AggregationItem& a, const AggregationItem& b) {
  if (a.shards.size() != b.shards.size()) return false;
  for (size_t p = 0; p < a.shards.size(); ++p) {
    if (a.shards[p].dst_host != b.shards[p].dst_host) return false;
  }
  return true;
}

int64_t PartBytes(const AggregationItem& item, size_t part) {
  return part == 0 ? item.bytes : item.shards[part - 1].bytes;
}

// Cuts the segments of one fill of `item`'s parts' sum (ending at `end_s`)
// into one transfer per part, in part order: what filling and reserving
// each part in turn on the same path gives, since a part finds the path
// saturated until the previous one has ended.
void AppendPartTransfers(const AggregationItem& item, int host, TransferKind kind,
                         const std::vector<RateSegment>& segments, double end_s,
                         std::vector<PlannedTransfer>* out) {
  const size_t parts = item.shards.size() + 1;
  size_t k = 0;                           // the segment the next part starts in
  double from = segments.front().from_s;  // and where in it
  for (size_t p = 0; p < parts; ++p) {
    PlannedTransfer t;
    t.update = item.update;
    t.src = item.worker;
    t.dst = host;
    t.kind = kind;
    t.bytes = PartBytes(item, p);
    if (p + 1 == parts) {
      // The last part takes the rest, up to the fill's own end.
      for (; k < segments.size(); ++k) {
        const RateSegment& s = segments[k];
        if (s.to_s > from) t.segments.push_back({from, s.to_s, s.rate_bps});
        if (k + 1 < segments.size()) from = segments[k + 1].from_s;
      }
      t.end_s = end_s;
    } else {
      double bits = 8.0 * static_cast<double>(t.bytes);
      while (k < segments.size()) {
        const RateSegment& s = segments[k];
        const double available = s.rate_bps * (s.to_s - from);
        if (bits <= available + 1e-3) {  // as the fill walk decides it fits
          const double cut = std::min(s.to_s, from + bits / s.rate_bps);
          if (cut > from) t.segments.push_back({from, cut, s.rate_bps});
          from = cut;
          if (cut >= s.to_s && k + 1 < segments.size()) from = segments[++k].from_s;
          break;
        }
        if (s.to_s > from) t.segments.push_back({from, s.to_s, s.rate_bps});
        bits -= available;
        if (++k < segments.size()) from = segments[k].from_s;
      }
      t.end_s = t.segments.empty() ? from : t.segments.back().to_s;
    }
    t.start_s = t.segments.empty() ? t.end_s : t.segments.front().from_s;
    out->push_back(std::move(t));
  }
}

class SplitSearch {
 public:
  explicit SplitSearch(const AggregationInput& input)
      : in_(input), m_(static_cast<int>(input.items.size())) {
    // The split lower bound needs distinct aggregators other than the
    // destination (and no explicit topology links, checked per call).
    separate_aggregators_ = !input.aggregators.empty();
    for (size_t a = 0; a < input.aggregators.size(); ++a) {
      const int host = input.aggregators[a];
      separate_aggregators_ = separate_aggregators_ && host != input.dst_host &&
                              std::count(input.aggregators.begin(), input.aggregators.end(),
                                         host) == 1;
    }
    item_bits_.reserve(m_);
    for (const AggregationItem& item : input.items) {
      max_bits_ = std::max(max_bits_, 8.0 * static_cast<double>(item.bytes));
      double bits = 8.0 * static_cast<double>(item.bytes);
      for (const AggregationPart& part : item.shards) bits += 8.0 * static_cast<double>(part.bytes);
      item_bits_.push_back(bits);
      sharded_ = sharded_ || !item.shards.empty();
    }
    prefix_max_.assign(m_ + 1, input.now_s);
    for (int i = 0; i < m_; ++i) prefix_max_[i + 1] = std::max(prefix_max_[i], DirectArrival(i));
    // The bits that must cross some aggregator's downlink: an item whose
    // worker is itself an aggregator may be summed there without crossing
    // one (a same-host transfer reserves no link), so the bound leaves its
    // bits out.
    suffix_bits_.assign(m_ + 1, 0);
    for (int i = m_ - 1; i >= 0; --i) {
      const bool on_aggregator =
          std::count(input.aggregators.begin(), input.aggregators.end(), input.items[i].worker) > 0;
      suffix_bits_[i] = suffix_bits_[i + 1] + (on_aggregator ? 0.0 : item_bits_[i]);
    }
    if (sharded_) PrepareUplinkBound();
  }

  // When item i's direct transfers (every part's) have all arrived.
  double DirectArrival(int i) const {
    double end = in_.direct[i].end_s;
    if (static_cast<size_t>(i) < in_.shard_direct.size()) {
      for (const PlannedTransfer& t : in_.shard_direct[i]) end = std::max(end, t.end_s);
    }
    return end;
  }

  // Applies item i's direct transfers to `net`.
  void ReserveDirect(int i, Network* net) const {
    auto reserve = [net](const PlannedTransfer& t) {
      if (t.end_s == kInfinity) return;
      net->Reserve(net->PathBetween(t.src, t.dst), t.segments);
    };
    reserve(in_.direct[i]);
    if (static_cast<size_t>(i) < in_.shard_direct.size()) {
      for (const PlannedTransfer& t : in_.shard_direct[i]) reserve(t);
    }
  }

  // DetAgg(n) on `net` (which holds the direct prefix of n items). Returns
  // the total time, or kInfinity when infeasible or (with `prune`) certainly
  // worse than `best`. With `groups` non-null, records the schedule.
  double DetAgg(int n, Network* net, double best, bool prune,
                std::vector<AggregationGroup>* groups) const {
    double t_max = prefix_max_[n];
    if (prune && t_max > best) return kInfinity;
    const int k = static_cast<int>(in_.aggregators.size());
    int idx = n;
    std::vector<RateSegment> segments;
    for (int a = 0; a < k && idx < m_; ++a) {
      const int host = in_.aggregators[a];
      const bool last = a == k - 1;
      if (prune) {
        const double bound = BoundFrom(a, t_max, idx, *net);
        if (bound - Slack(bound) > best) return kInfinity;
      }
      const int first = idx;
      OpenGroup open;
      open.end_s = in_.now_s;
      open.bytes.assign(in_.items[first].shards.size() + 1, 0);
      const bool record = groups != nullptr;
      if (!FillGroup(host, last, t_max, &idx, net, &segments, &open, record)) return kInfinity;
      if (idx == first) continue;
      if (prune && sharded_) {
        const double bound = AggregatesBound(host, first, open, *net);
        if (bound - Slack(bound) > best) return kInfinity;
      }
      if (!SendAggregates(host, first, net, &segments, &t_max, &open, record)) return kInfinity;
      if (record) {
        open.group.aggregator = host;
        groups->push_back(std::move(open.group));
      }
      if (prune && t_max > best) return kInfinity;
    }
    if (idx < m_) return kInfinity;
    return t_max;
  }

  // A lower bound on DetAgg(n)'s total, computed without running it, or
  // -kInfinity when none can be given. With distinct aggregators (none the
  // destination) and no explicit topology links:
  //  - group j (not the last) only takes items that reach a_j by T_j, the
  //    server-busy time before it, so it absorbs at most a_j's downlink
  //    capacity over [now, T_j];
  //  - T_1 = max direct arrival, and T_{j+1} = max(T_j, end of aggregate j)
  //    <= U_{j+1}: the end of an aggregate of the largest item size started
  //    at U_j >= T_j on the input network. When aggregate j is reserved,
  //    everything this split reserved before it on its path (direct
  //    transfers, earlier aggregates, items sent from a_j itself in groups
  //    up to j) has ended by T_j <= U_j, and what is reserved after it
  //    (later groups, even from a_j's own uplink) cannot slow it down: a
  //    fill only takes the residual left by earlier reservations;
  //  - everything the groups before cannot absorb goes through the last
  //    aggregator's downlink, which cannot have received it before the
  //    time its capacity integrates to those bits.
  double LowerBound(int n, const Network& base) const {
    if (n == m_) return prefix_max_[m_];
    return BoundFrom(0, prefix_max_[n], n, base);
  }

  // The same bound from the start of group j, with the running t_max and
  // items idx.. still to place, on the network as it is at that point (the
  // argument above holds for it unchanged: the aggregators from j on have
  // not been used yet, and everything reserved so far ends by t_max).
  //
  // Sharded items: a group sends several aggregates from its aggregator's
  // uplink, so one aggregate of the largest item size no longer bounds when
  // the group has arrived; only the last aggregator's case (every remaining
  // bit goes through its downlink) is used.
  double BoundFrom(int j, double t_max, int idx, const Network& net) const {
    const int k = static_cast<int>(in_.aggregators.size());
    if (k == 0) return -kInfinity;
    double rest = suffix_bits_[idx];
    if (sharded_) {
      if (j + 1 < k) return -kInfinity;
    } else if (separate_aggregators_ && !net.has_fixed_paths()) {
      double u = t_max;
      for (int i = j; i + 1 < k; ++i) {
        const int host = in_.aggregators[i];
        rest -= net.CapacityBits(net.DownlinkOf(host), in_.now_s, u);
        const double end = net.FillEnd(net.PathBetween(host, in_.dst_host), u, max_bits_);
        if (end == kInfinity) return -kInfinity;
        u = std::max(u, end);
      }
    } else if (j + 1 < k) {
      return -kInfinity;
    }
    if (rest <= 0) return t_max;
    // Whatever is left goes through the last aggregator's downlink.
    Path last;
    last.links.push_back(net.DownlinkOf(in_.aggregators[k - 1]));
    return std::max(t_max, net.FillEnd(last, in_.now_s, rest));
  }

  // A lower bound on DetAgg(n)'s total for sharded items, from their
  // workers' uplinks, on `uplinks`: the input network with the direct
  // transfers of items 0..n-1 reserved on their workers' uplinks only (what
  // those links hold in DetAgg(n)'s network). Once the bound exceeds
  // `enough` the rest is skipped (the result is then above `enough`).
  //
  // An item i >= n goes to an aggregator h. If its worker w is no
  // aggregator host, all its bits cross w's uplink, after those of w's items
  // in [n, i) (DetAgg reserves items in order, and nothing else it reserves
  // crosses w's uplink), so they have crossed no sooner than one fill of
  // those items' bits through that link alone; then h sends the group's
  // aggregates, which are no smaller than i's parts, and those not bound for
  // h itself cross h's uplink one after another: at least hop_bits_[i] at
  // the fastest aggregator uplink's peak rate. If w is an aggregator host,
  // at least hop_bits_[i] cross w's uplink either way (i's own transfer to
  // another aggregator, or the aggregates w sends when h = w), and the total
  // waits for them.
  //
  // Alg. 3 almost never aggregates sharded updates whose workers' uplinks
  // are what limits them (each part of an aggregate crosses one more
  // uplink), and with the other bounds off for sharded items
  // (BoundFrom) every split point was run to its first group.
  double UplinkBound(int n, const Network& uplinks, double enough) const {
    double bound = std::max(prefix_max_[n], downlink_suffix_[n]);
    for (int i = m_ - 1; i >= n && bound - Slack(bound) <= enough; --i) {
      const int w = in_.items[i].worker;
      Path uplink;
      uplink.links.push_back(uplinks.UplinkOf(w));
      double end;
      if (worker_aggregates_[i]) {
        end = uplinks.FillEnd(uplink, in_.now_s, hop_bits_[i]);
      } else {
        // Bits of w's items in [n, i]: its items up to i less those before n.
        const double bits = worker_bits_through_[i] - direct_bits_before_.at(w);
        end = uplinks.FillEnd(uplink, in_.now_s, bits);
        if (end != kInfinity && hop_bits_[i] > 0) {
          end += max_aggregator_uplink_bps_ > 0 ? hop_bits_[i] / max_aggregator_uplink_bps_
                                                : kInfinity;
        }
      }
      bound = std::max(bound, end);
    }
    return bound;
  }

  // Readies UplinkBound on `uplinks` (the input network).
  //
  // It also bounds by the parts' hosts' downlinks: an aggregated item's
  // part p reaches its host in an aggregate at least as large, through
  // that host's downlink (unless the host is an aggregator, which may be
  // summing it), no sooner than a fill of the part alone there on the input
  // network.
  void StartUplinkBound(const Network& uplinks) {
    max_aggregator_uplink_bps_ = 0;
    for (int host : in_.aggregators) {
      max_aggregator_uplink_bps_ =
          std::max(max_aggregator_uplink_bps_, uplinks.PeakRate(uplinks.UplinkOf(host)));
    }
    for (auto& [worker, bits] : direct_bits_before_) bits = 0;
    downlink_suffix_.assign(m_ + 1, -kInfinity);
    auto part_end = [&](int host, int64_t bytes) {
      if (std::count(in_.aggregators.begin(), in_.aggregators.end(), host) > 0) return -kInfinity;
      Path downlink;
      downlink.links.push_back(uplinks.DownlinkOf(host));
      return uplinks.FillEnd(downlink, in_.now_s, 8.0 * static_cast<double>(bytes));
    };
    for (int i = m_ - 1; i >= 0; --i) {
      const AggregationItem& item = in_.items[i];
      double end = part_end(in_.dst_host, item.bytes);
      for (const AggregationPart& part : item.shards) {
        end = std::max(end, part_end(part.dst_host, part.bytes));
      }
      downlink_suffix_[i] = std::max(downlink_suffix_[i + 1], end);
    }
  }

  // Moves the uplink bound from split n to n + 1: item n goes direct.
  void AdvanceUplinkBound(int n, Network* uplinks) {
    auto reserve = [uplinks](const PlannedTransfer& t) {
      if (t.end_s == kInfinity) return;
      const Path path = uplinks->PathBetween(t.src, t.dst);
      if (path.links.empty()) return;  // a copy in memory
      Path uplink;
      uplink.links.push_back(path.links[0]);  // the source's uplink
      uplinks->Reserve(uplink, t.segments);
    };
    reserve(in_.direct[n]);
    if (static_cast<size_t>(n) < in_.shard_direct.size()) {
      for (const PlannedTransfer& t : in_.shard_direct[n]) reserve(t);
    }
    direct_bits_before_[in_.items[n].worker] += item_bits_[n];
  }

  int m() const { return m_; }
  bool sharded() const { return sharded_; }
  double DirectOnlyTotal() const { return prefix_max_[m_]; }

 private:
  // A group DetAgg is filling: when its last member has arrived, per part
  // the largest size among the members (the aggregate's size), and (when
  // recording) the transfers.
  struct OpenGroup {
    double end_s = 0;
    std::vector<int64_t> bytes;
    AggregationGroup group;
  };

  // Sends items from `*idx` on to aggregator `host` while they share the
  // first one's part layout and (unless `last`, which takes them all)
  // arrive by `t_max`. False when that makes the split infeasible.
  bool FillGroup(int host, bool last, double t_max, int* idx, Network* net,
                 std::vector<RateSegment>* segments, OpenGroup* open, bool record) const {
    const int first = *idx;
    while (*idx < m_) {
      const AggregationItem& item = in_.items[*idx];
      if (*idx > first && !SameLayout(item, in_.items[first])) {
        if (last) return false;
        break;
      }
      const Path path = net->PathBetween(item.worker, host);
      const double end = net->FillInto(path, in_.now_s, item_bits_[*idx], segments);
      if (end == kInfinity && last) return false;
      if (!last && end > t_max) break;
      net->Reserve(path, *segments);
      if (record) {
        RecordToAggregator(item, host, *segments, end, &open->group);
        open->group.items.push_back(*idx);
      }
      open->end_s = std::max(open->end_s, end);
      for (size_t p = 0; p < open->bytes.size(); ++p) {
        open->bytes[p] = std::max(open->bytes[p], PartBytes(item, p));
      }
      ++*idx;
    }
    return true;
  }

  // An item's transfer(s) to its group's aggregator: one, or one per part.
  void RecordToAggregator(const AggregationItem& item, int host,
                          const std::vector<RateSegment>& segments, double end,
                          AggregationGroup* group) const {
    if (!item.shards.empty()) {
      AppendPartTransfers(item, host, in_.to_aggregator_kind, segments, end,
                          &group->to_aggregator);
      return;
    }
    PlannedTransfer t;
    t.update = item.update;
    t.src = item.worker;
    t.dst = host;
    t.kind = in_.to_aggregator_kind;
    t.bytes = item.bytes;
    t.start_s = segments.front().from_s;
    t.end_s = end;
    t.segments = segments;
    group->to_aggregator.push_back(std::move(t));
  }

  // A lower bound on when a sharded group's aggregates have all arrived:
  // SendAggregates starts each at the group's end and each crosses
  // `host`'s uplink (unless its part's host is `host`), so together they
  // end no sooner than one transfer of all their bits through that link
  // alone. One fill where sending them takes one per part.
  double AggregatesBound(int host, int first, const OpenGroup& open, const Network& net) const {
    double bits = 0;
    for (size_t p = 0; p < open.bytes.size(); ++p) {
      const int dst = p == 0 ? in_.dst_host : in_.items[first].shards[p - 1].dst_host;
      if (!net.PathBetween(host, dst).links.empty()) bits += 8.0 * static_cast<double>(open.bytes[p]);
    }
    Path uplink;
    uplink.links.push_back(net.UplinkOf(host));
    return std::max(open.end_s, net.FillEnd(uplink, open.end_s, bits));
  }

  // One aggregate per part from `host` (the group starting at item
  // `first`), in part order, each reserved before the next; `*t_max` grows
  // to their ends. False when one can never arrive.
  bool SendAggregates(int host, int first, Network* net, std::vector<RateSegment>* segments,
                      double* t_max, OpenGroup* open, bool record) const {
    for (size_t p = 0; p < open->bytes.size(); ++p) {
      const int dst = p == 0 ? in_.dst_host : in_.items[first].shards[p - 1].dst_host;
      const Path path = net->PathBetween(host, dst);
      const double end = net->FillInto(
          path, open->end_s, 8.0 * static_cast<double>(open->bytes[p]), segments);
      if (end == kInfinity) return false;
      net->Reserve(path, *segments);
      *t_max = std::max(*t_max, end);
      if (!record) continue;
      PlannedTransfer t;
      t.src = host;
      t.dst = dst;
      t.kind = in_.aggregate_kind;
      t.bytes = open->bytes[p];
      t.start_s = segments->front().from_s;
      t.end_s = end;
      t.segments = *segments;
      if (p == 0) {
        open->group.aggregate = std::move(t);
      } else {
        open->group.shard_aggregates.push_back(std::move(t));
      }
    }
    return true;
  }

  // UplinkBound's per-item figures (sharded items only).
  void PrepareUplinkBound() {
    std::unordered_map<int, double> through;  // worker -> bits of its items so far
    for (int i = 0; i < m_; ++i) {
      const AggregationItem& item = in_.items[i];
      worker_aggregates_.push_back(std::count(in_.aggregators.begin(), in_.aggregators.end(),
                                              item.worker) > 0);
      worker_bits_through_.push_back(through[item.worker] += item_bits_[i]);
      // Bits per part host; an aggregator host's share may stay local.
      std::unordered_map<int, double> by_host;
      by_host[in_.dst_host] += 8.0 * static_cast<double>(item.bytes);
      for (const AggregationPart& part : item.shards) {
        by_host[part.dst_host] += 8.0 * static_cast<double>(part.bytes);
      }
      double local = 0;
      for (const auto& [host, bits] : by_host) {
        if (std::count(in_.aggregators.begin(), in_.aggregators.end(), host) > 0) {
          local = std::max(local, bits);
        }
      }
      hop_bits_.push_back(std::max(0.0, item_bits_[i] - local));
      direct_bits_before_.emplace(item.worker, 0.0);
    }
  }

  const AggregationInput& in_;
  const int m_;
  std::vector<double> item_bits_;  // per item: all its parts
  // UplinkBound: per item, whether its worker is an aggregator host, the
  // bits of its worker's items up to it, the bits its aggregates send off
  // their aggregator; per worker, the bits of its items before the split.
  std::vector<bool> worker_aggregates_;
  std::vector<double> worker_bits_through_;
  std::vector<double> hop_bits_;
  std::unordered_map<int, double> direct_bits_before_;
  std::vector<double> downlink_suffix_;  // per n: the downlink bound of items n..
  double max_aggregator_uplink_bps_ = 0;
  std::vector<double> prefix_max_;
  std::vector<double> suffix_bits_;
  bool separate_aggregators_ = false;
  bool sharded_ = false;  // some item has shards
  double max_bits_ = 0;
};

void AtomicMin(std::atomic<double>* target, double value) {
  double current = target->load();
  while (value < current && !target->compare_exchange_weak(current, value)) {
  }
}

}  // namespace

std::vector<PlannedTransfer> SequentialDirect(const std::vector<AggregationItem>& items,
                                              int dst_host, double now_s, TransferKind kind,
                                              Network* net) {
  std::vector<PlannedTransfer> direct;
  direct.reserve(items.size());
  for (const AggregationItem& item : items) {
    PlannedTransfer t;
    t.update = item.update;
    t.src = item.worker;
    t.dst = dst_host;
    t.kind = kind;
    t.bytes = item.bytes;
    const Path path = net->PathBetween(item.worker, dst_host);
    FillResult fill = net->Fill(path, now_s, 8.0 * static_cast<double>(item.bytes));
    t.end_s = fill.end_s;
    if (fill.feasible) {
      net->Reserve(path, fill.segments);
      t.start_s = fill.segments.front().from_s;
      t.segments = std::move(fill.segments);
    } else {
      t.start_s = now_s;
    }
    direct.push_back(std::move(t));
  }
  return direct;
}

std::vector<int> ShuffleAggregators(std::vector<int> hosts, uint64_t seed) {
  uint64_t state = seed;
  auto next = [&state]() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (size_t i = hosts.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(next() % i);
    std::swap(hosts[i - 1], hosts[j]);
  }
  return hosts;
}

AggregationSplit ChooseSplit(const AggregationInput& input, const Network& base,
                             const PlannerOptions& options) {
  SplitSearch search(input);
  const Network* net = &base;
  const int m = search.m();
  std::vector<double> totals(m + 1, kInfinity);
  totals[m] = search.DirectOnlyTotal();
  if (!input.aggregators.empty() && m > 0) {
    if (options.reference) {
      // Alg. 3 lines 21-23 as written: a fresh network per split point.
      for (int n = 0; n < m; ++n) {
        Network state = *net;
        for (int i = 0; i < n; ++i) search.ReserveDirect(i, &state);
        totals[n] = search.DetAgg(n, &state, kInfinity, false, nullptr);
      }
    } else {
      // Only a split that ends kMinAggregationGain_s before the direct
      // schedule can be chosen: the running best starts there.
      std::atomic<double> best(totals[m] - kMinAggregationGain_s);
      std::vector<char> evaluated(m, 0);
      std::vector<double> bounds(m);
      for (int n = 0; n < m; ++n) {
        const double bound = search.LowerBound(n, *net);
        bounds[n] = bound - Slack(bound);
      }
      if (search.sharded()) {
        Network uplinks = *net;
        search.StartUplinkBound(uplinks);
        for (int n = 0; n < m; ++n) {
          const double bound = search.UplinkBound(n, uplinks, best.load());
          bounds[n] = std::max(bounds[n], bound - Slack(bound));
          if (n + 1 < m) search.AdvanceUplinkBound(n, &uplinks);
        }
      }
      // Evaluates split n on `state` (which holds the direct prefix of n).
      auto evaluate = [&](int n, Network* state) {
        evaluated[n] = 1;
        if (bounds[n] > best.load()) return;
        const size_t mark = state->JournalMark();
        const double total = search.DetAgg(n, state, best.load(), true, nullptr);
        state->RollbackTo(mark);
        totals[n] = total;
        if (total < kInfinity) AtomicMin(&best, total);
      };
      // Sharded batches of many items search a sample of the split points
      // (PlannerOptions::sampled_split_from; our departure, aggregation.h).
      const bool sampled = search.sharded() && options.sampled_split_from > 0 &&
                           m >= std::max(32, options.sampled_split_from);
      // Split points the coarse pass takes besides every step-th:
      //  - best first, those whose bound is the least of all, when there are
      //    few of them. Where the bounds tell the splits apart the least is
      //    often tight (sharded batches at 1000 workers: one split's bound
      //    equals its total and is below every other's), and once it is
      //    the best the rest are pruned unevaluated;
      //  - sampled, the last quarter: a split that sends few items through
      //    aggregators is cheap to try and often the one that wins.
      std::vector<char> also(m, 0);
      if (m >= 32) {
        const double lowest = *std::min_element(bounds.begin(), bounds.end());
        const int ties = static_cast<int>(std::count(bounds.begin(), bounds.end(), lowest));
        if (ties <= kLeastBoundSplits && lowest <= best.load()) {
          for (int n = 0; n < m; ++n) also[n] = bounds[n] == lowest;
        }
        if (sampled) std::fill(also.begin() + (m - m / 4), also.end(), 1);
      }
      auto wanted = [&](int n, int step) {
        return !evaluated[n] && (step == 1 || n % step == step / 2 || also[n]);
      };
      auto run = [&](int lo, int hi, int step) {
        // No direct prefix is built past the last split point that may
        // still win (bounds only fall behind `best` as it falls).
        int last = hi - 1;
        while (last >= lo && !(wanted(last, step) && bounds[last] <= best.load())) --last;
        if (last < lo) return;
        Network state = *net;
        state.BeginJournal();
        for (int i = 0; i < lo; ++i) search.ReserveDirect(i, &state);
        state.DiscardJournal();
        for (int n = lo; n <= last; ++n) {
          if (wanted(n, step)) evaluate(n, &state);
          if (n == last) break;
          search.ReserveDirect(n, &state);
          state.DiscardJournal();
        }
      };
      // A coarse pass first: a good best total early lets the bounds prune
      // most split points of the full pass (pruning never changes the result).
      const int step = m / 16;
      if (m >= 32) run(0, m, step);
      // Threads pay for their start and network copy only when many split
      // points survive the bounds.
      int survivors = 0;
      for (int n = 0; n < m; ++n) survivors += !evaluated[n] && bounds[n] <= best.load();
      const int threads = std::max(
          1, std::min(options.threads, survivors / std::max(1, options.min_splits_per_thread)));
      if (sampled) {
        // What is left of the sample: the split points within a step of the
        // best the coarse pass found; with no split beating all-direct, none.
        int found = m;
        for (int n = m - 1; n >= 0; --n) {
          if (totals[n] < kInfinity && totals[n] < totals[found]) found = n;
        }
        if (found < m) run(std::max(0, found - step), std::min(m, found + step + 1), 1);
      } else if (threads == 1) {
        run(0, m, 1);
      } else {
        // Later split points carry longer direct prefixes; split evenly by count.
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) {
          pool.emplace_back(run, m * t / threads, m * (t + 1) / threads, 1);
        }
        for (std::thread& thread : pool) thread.join();
      }
    }
  }
  AggregationSplit chosen;
  chosen.split = m;
  const double needed = totals[m] - kMinAggregationGain_s;
  for (int n = m - 1; n >= 0; --n) {
    if (totals[n] < needed && totals[n] < totals[chosen.split]) chosen.split = n;
  }
  chosen.total_s = totals[chosen.split];
  return chosen;
}

std::vector<double> SplitLowerBounds(const AggregationInput& input, const Network& base) {
  SplitSearch search(input);
  const int m = search.m();
  std::vector<double> bounds(m);
  for (int n = 0; n < m; ++n) bounds[n] = search.LowerBound(n, base);
  if (search.sharded()) {
    Network uplinks = base;
    search.StartUplinkBound(uplinks);
    for (int n = 0; n < m; ++n) {
      bounds[n] = std::max(bounds[n], search.UplinkBound(n, uplinks, kInfinity));
      search.AdvanceUplinkBound(n, &uplinks);
    }
  }
  return bounds;
}

AggregationResult Aggregate(const AggregationInput& input, Network* net,
                            const PlannerOptions& options) {
  const AggregationSplit chosen = ChooseSplit(input, *net, options);
  AggregationResult result = AggregateWithSplit(input, chosen.split, net);
  result.total_s = chosen.total_s;
  return result;
}

std::optional<Path> ChainPath(const std::vector<int>& hosts, int dst, const Network& net) {
  Path path;
  for (size_t j = 0; j < hosts.size(); ++j) {
    const int next = j + 1 < hosts.size() ? hosts[j + 1] : dst;
    const Path hop = net.PathBetween(hosts[j], next);
    if (path.links.size() + hop.links.size() > LinkList::kMaxLinks) return std::nullopt;
    for (int link : hop.links) path.links.push_back(link);
  }
  return path;
}

namespace {

// A link used twice by one chain would carry its stream twice; a fill that
// sees it once would over-reserve it. (Never with distinct hosts and no
// explicit topology.)
bool LinksDistinct(const Path& path) {
  std::vector<int> links(path.links.begin(), path.links.end());
  std::sort(links.begin(), links.end());
  return std::adjacent_find(links.begin(), links.end()) == links.end();
}

// True when `host` may sum in a chain: one of the (sorted) aggregators, and
// not the destination.
bool ChainAggregator(int host, const AggregationInput& input,
                     const std::vector<int>& sorted_aggregators) {
  return host != input.dst_host &&
         std::binary_search(sorted_aggregators.begin(), sorted_aggregators.end(), host);
}

// Adds item `next` to `*chain`, whose stream runs over `*path` and ends at
// `*end`, when it may join and that does not raise the sum of the arrivals
// (updating `*path` and `*end`). False: the chain stops before `next`.
bool ExtendChain(const AggregationInput& input, int next, int max_hops,
                 const std::vector<int>& sorted_aggregators, Network* net,
                 std::vector<RateSegment>* segments, AggregationChain* chain, Path* path,
                 double* end) {
  const AggregationItem& item = input.items[next];
  // Every hop forwards the partial sum of equally shaped updates.
  if (item.bytes != chain->bytes) return false;
  // Another update of a host in the chain is summed there (no link);
  // a new host joins at the end, next to dst.
  const auto at = std::find(chain->hosts.begin(), chain->hosts.end(), item.worker);
  const int node = static_cast<int>(at - chain->hosts.begin());
  std::vector<int> hosts = chain->hosts;
  Path longer = *path;
  double longer_end = *end;
  const bool aggregator = ChainAggregator(item.worker, input, sorted_aggregators);
  if (at != chain->hosts.end()) {
    if (!aggregator) return false;  // it would sum there
  } else {
    if (!aggregator || static_cast<int>(hosts.size()) >= max_hops) return false;
    hosts.push_back(item.worker);
    const std::optional<Path> chained = ChainPath(hosts, input.dst_host, *net);
    if (!chained.has_value() || !LinksDistinct(*chained)) return false;
    longer = *chained;
    longer_end = net->FillEnd(longer, input.now_s, 8.0 * static_cast<double>(chain->bytes));
    if (longer_end == kInfinity) return false;
  }
  // The alternative: this chain as it is, then the item on its own.
  const size_t mark = net->JournalMark();
  net->FillInto(*path, input.now_s, 8.0 * static_cast<double>(chain->bytes), segments);
  net->Reserve(*path, *segments);
  const double alone_end = net->FillEnd(net->PathBetween(item.worker, input.dst_host),
                                        input.now_s, 8.0 * static_cast<double>(item.bytes));
  net->RollbackTo(mark);
  // Extend when that does not raise the sum of the arrivals: a member
  // that slows the chain (a slow link, N3) delays every member. Summed as
  // durations from now_s, so that the rounding slack is relative to them
  // and not to the clock (a live scheduler's times are seconds since boot:
  // a slack relative to those was tens of microseconds, and a 4 KiB round
  // rooted on h0 was chained h0 -> h1 -> h0 instead of going direct).
  const double members = static_cast<double>(chain->items.size());
  const double extended = (members + 1) * (longer_end - input.now_s);
  const double separate = members * (*end - input.now_s) + (alone_end - input.now_s);
  if (extended > separate + Slack(separate)) return false;
  chain->items.push_back(next);
  chain->node.push_back(node);
  chain->hosts = std::move(hosts);
  *path = longer;
  *end = longer_end;
  return true;
}

}  // namespace

ChainResult AggregateChains(const AggregationInput& input, int max_hops, Network* net) {
  ChainResult result;
  const int m = static_cast<int>(input.items.size());
  result.arrival_s.assign(m, kInfinity);
  result.total_s = input.now_s;
  for (const AggregationItem& item : input.items) {
    if (!item.shards.empty()) {
      result.total_s = kInfinity;
      return result;
    }
  }
  std::vector<int> aggregators = input.aggregators;
  std::sort(aggregators.begin(), aggregators.end());
  std::vector<RateSegment> segments;
  net->BeginJournal();  // the alternatives below are tried and undone
  int idx = 0;
  while (idx < m) {
    net->DiscardJournal();
    AggregationChain chain;
    chain.items = {idx};
    chain.hosts = {input.items[idx].worker};
    chain.bytes = input.items[idx].bytes;
    Path path = net->PathBetween(chain.hosts[0], input.dst_host);
    double end = net->FillEnd(path, input.now_s, 8.0 * static_cast<double>(chain.bytes));
    if (end == kInfinity) {
      result.total_s = kInfinity;
      return result;
    }
    chain.node = {0};
    // The next items join one by one while each may and pays its way.
    while (idx + static_cast<int>(chain.items.size()) < m &&
           ExtendChain(input, idx + static_cast<int>(chain.items.size()), max_hops, aggregators,
                       net, &segments, &chain, &path, &end)) {
    }
    const double bits = 8.0 * static_cast<double>(chain.bytes);
    end = net->FillInto(path, input.now_s, bits, &segments);
    net->Reserve(path, segments);
    chain.start_s = segments.front().from_s;
    chain.end_s = end;
    chain.segments = segments;
    for (int i : chain.items) result.arrival_s[i] = end;
    if (chain.items.size() > 1) result.chained += static_cast<int>(chain.items.size());
    result.total_s = std::max(result.total_s, end);
    idx += static_cast<int>(chain.items.size());
    result.chains.push_back(std::move(chain));
  }
  net->DiscardJournal();
  return result;
}

AggregationResult AggregateWithSplit(const AggregationInput& input, int split, Network* net) {
  SplitSearch search(input);
  const int m = search.m();
  AggregationResult result;
  result.split = split;
  for (int i = 0; i < split; ++i) search.ReserveDirect(i, net);
  result.total_s = search.DetAgg(split, net, kInfinity, false, &result.groups);
  result.arrival_s.assign(m, kInfinity);
  for (int i = 0; i < split; ++i) result.arrival_s[i] = search.DirectArrival(i);
  for (const AggregationGroup& group : result.groups) {
    double arrival = group.aggregate.end_s;
    for (const PlannedTransfer& t : group.shard_aggregates) arrival = std::max(arrival, t.end_s);
    for (int i : group.items) result.arrival_s[i] = arrival;
  }
  return result;
}

}  // namespace mlfabric::core
