#include "scheduler/core/aggregation.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <thread>

namespace mlfabric::core {

namespace {

double Slack(double x) { return 1e-9 * (std::abs(x) + 1.0); }

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
    for (const AggregationItem& item : input.items) {
      max_bits_ = std::max(max_bits_, 8.0 * static_cast<double>(item.bytes));
    }
    prefix_max_.assign(m_ + 1, input.now_s);
    for (int i = 0; i < m_; ++i) prefix_max_[i + 1] = std::max(prefix_max_[i], input.direct[i].end_s);
    suffix_bits_.assign(m_ + 1, 0);
    for (int i = m_ - 1; i >= 0; --i) {
      suffix_bits_[i] = suffix_bits_[i + 1] + 8.0 * static_cast<double>(input.items[i].bytes);
    }
  }

  // Applies item i's direct transfer to `net`.
  void ReserveDirect(int i, Network* net) const {
    const PlannedTransfer& t = in_.direct[i];
    if (t.end_s == kInfinity) return;
    net->Reserve(net->PathBetween(t.src, t.dst), t.segments);
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
      double group_end = in_.now_s;
      int64_t group_bytes = 0;
      AggregationGroup group;
      while (idx < m_) {
        const AggregationItem& item = in_.items[idx];
        const Path path = net->PathBetween(item.worker, host);
        const double bits = 8.0 * static_cast<double>(item.bytes);
        const double end = net->FillInto(path, in_.now_s, bits, &segments);
        if (end == kInfinity && last) return kInfinity;
        if (!last && end > t_max) break;
        net->Reserve(path, segments);
        if (groups != nullptr) {
          PlannedTransfer t;
          t.update = item.update;
          t.src = item.worker;
          t.dst = host;
          t.kind = in_.to_aggregator_kind;
          t.bytes = item.bytes;
          t.start_s = segments.front().from_s;
          t.end_s = end;
          t.segments = segments;
          group.to_aggregator.push_back(std::move(t));
          group.items.push_back(idx);
        }
        group_end = std::max(group_end, end);
        group_bytes = std::max(group_bytes, item.bytes);
        ++idx;
      }
      if (idx == first) continue;
      const Path path = net->PathBetween(host, in_.dst_host);
      const double end = net->FillInto(path, group_end, 8.0 * static_cast<double>(group_bytes),
                                       &segments);
      if (end == kInfinity) return kInfinity;
      net->Reserve(path, segments);
      t_max = std::max(t_max, end);
      if (groups != nullptr) {
        group.aggregator = host;
        group.aggregate.src = host;
        group.aggregate.dst = in_.dst_host;
        group.aggregate.kind = in_.aggregate_kind;
        group.aggregate.bytes = group_bytes;
        group.aggregate.start_s = segments.front().from_s;
        group.aggregate.end_s = end;
        group.aggregate.segments = segments;
        groups->push_back(std::move(group));
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
  double BoundFrom(int j, double t_max, int idx, const Network& net) const {
    const int k = static_cast<int>(in_.aggregators.size());
    if (k == 0) return -kInfinity;
    double rest = suffix_bits_[idx];
    if (separate_aggregators_ && !net.has_fixed_paths()) {
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

  int m() const { return m_; }
  double DirectOnlyTotal() const { return prefix_max_[m_]; }

 private:
  const AggregationInput& in_;
  const int m_;
  std::vector<double> prefix_max_;
  std::vector<double> suffix_bits_;
  bool separate_aggregators_ = false;
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

AggregationResult Aggregate(const AggregationInput& input, Network* net,
                            const PlannerOptions& options) {
  SplitSearch search(input);
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
      std::atomic<double> best(totals[m]);
      std::vector<char> evaluated(m, 0);
      std::vector<double> bounds(m);
      for (int n = 0; n < m; ++n) {
        const double bound = search.LowerBound(n, *net);
        bounds[n] = bound - Slack(bound);
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
      auto run = [&](int lo, int hi, int step) {
        Network state = *net;
        state.BeginJournal();
        for (int i = 0; i < lo; ++i) search.ReserveDirect(i, &state);
        state.DiscardJournal();
        for (int n = lo; n < hi; ++n) {
          if (!evaluated[n] && (step == 1 || n % step == step / 2)) evaluate(n, &state);
          search.ReserveDirect(n, &state);
          state.DiscardJournal();
        }
      };
      // A coarse pass first: a good best total early lets the bounds prune
      // most split points of the full pass (pruning never changes the result).
      if (m >= 32) run(0, m, m / 16);
      // Threads pay for their start and network copy only when many split
      // points survive the bounds.
      int survivors = 0;
      for (int n = 0; n < m; ++n) survivors += !evaluated[n] && bounds[n] <= best.load();
      const int threads = std::max(
          1, std::min(options.threads, survivors / std::max(1, options.min_splits_per_thread)));
      if (threads == 1) {
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
  int split = m;
  for (int n = m - 1; n >= 0; --n) {
    if (totals[n] < totals[split]) split = n;
  }
  AggregationResult result = AggregateWithSplit(input, split, net);
  result.total_s = totals[split];
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

}  // namespace

ChainResult AggregateChains(const AggregationInput& input, int max_hops, Network* net) {
  ChainResult result;
  const int m = static_cast<int>(input.items.size());
  result.arrival_s.assign(m, kInfinity);
  result.total_s = input.now_s;
  std::vector<int> aggregators = input.aggregators;
  std::sort(aggregators.begin(), aggregators.end());
  auto is_aggregator = [&](int host) {
    return host != input.dst_host &&
           std::binary_search(aggregators.begin(), aggregators.end(), host);
  };
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
    while (idx + static_cast<int>(chain.items.size()) < m) {
      const int next = idx + static_cast<int>(chain.items.size());
      const AggregationItem& item = input.items[next];
      // Every hop forwards the partial sum of equally shaped updates.
      if (item.bytes != chain.bytes) break;
      // Another update of a host in the chain is summed there (no link);
      // a new host joins at the end, next to dst.
      const auto at = std::find(chain.hosts.begin(), chain.hosts.end(), item.worker);
      const int node = static_cast<int>(at - chain.hosts.begin());
      std::vector<int> hosts = chain.hosts;
      Path longer = path;
      double longer_end = end;
      if (at != chain.hosts.end()) {
        if (!is_aggregator(item.worker)) break;  // it would sum there
      } else {
        if (!is_aggregator(item.worker) || static_cast<int>(hosts.size()) >= max_hops) break;
        hosts.push_back(item.worker);
        const std::optional<Path> chained = ChainPath(hosts, input.dst_host, *net);
        if (!chained.has_value() || !LinksDistinct(*chained)) break;
        longer = *chained;
        longer_end = net->FillEnd(longer, input.now_s, 8.0 * static_cast<double>(chain.bytes));
        if (longer_end == kInfinity) break;
      }
      // The alternative: this chain as it is, then the item on its own.
      const size_t mark = net->JournalMark();
      net->FillInto(path, input.now_s, 8.0 * static_cast<double>(chain.bytes), &segments);
      net->Reserve(path, segments);
      const double alone_end =
          net->FillEnd(net->PathBetween(item.worker, input.dst_host), input.now_s,
                       8.0 * static_cast<double>(item.bytes));
      net->RollbackTo(mark);
      // Extend when that does not raise the sum of the arrivals: a member
      // that slows the chain (a slow link, N3) delays every member.
      const double members = static_cast<double>(chain.items.size());
      const double extended = (members + 1) * longer_end;
      const double separate = members * end + alone_end;
      if (extended > separate + Slack(separate)) break;
      chain.items.push_back(next);
      chain.node.push_back(node);
      chain.hosts = std::move(hosts);
      path = longer;
      end = longer_end;
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
  for (int i = 0; i < split; ++i) result.arrival_s[i] = input.direct[i].end_s;
  for (const AggregationGroup& group : result.groups) {
    for (int i : group.items) result.arrival_s[i] = group.aggregate.end_s;
  }
  return result;
}

}  // namespace mlfabric::core
