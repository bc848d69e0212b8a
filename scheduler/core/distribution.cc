#include "scheduler/core/distribution.h"

// Cases share one network and undo their reservations through its journal.
// The default search (distribution.h, Cost) rests on one fact about §10.3's
// cases: with a congestion-free core the server's sends (its uplink, the
// receivers' downlinks) and each distributor's fan-out (its uplink, its
// group's downlinks) touch disjoint links. So the server's sends of every n
// for one u form one chain computed once, and a case's fan-out can be
// evaluated on the untouched network from the chain's figures, with the
// same fills (bit for bit) as the case evaluated in full.

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/core/aggregation.h"
#include "scheduler/core/network.h"
#include "scheduler/core/planner.h"

namespace mlfabric::core {

namespace {

struct Candidate {
  double total_s = kInfinity;
  int direct = 0;
  int used = 0;
  std::vector<PlannedTransfer> transfers;
  std::vector<std::pair<int, double>> delivered;  // (requester position, at_s)
  std::vector<int> via;                           // per delivered entry: source host
};

// What a search chooses: the case (n = direct, u = used) and its total.
struct Choice {
  double total_s = kInfinity;
  int direct = 0;
  int used = 0;
};

// A bound is compared with computed times only beyond this slack: fills sum
// many segments (their rounding is far below a relative 1e-9) and times may
// be large absolute values.
double Slack(double t) { return 1e-9 * std::abs(t) + 1e-12; }
// True when a time known to be at least `lower_s` (up to rounding) is
// certainly later than `t_s`.
bool CertainlyAfter(double lower_s, double t_s) {
  return lower_s - Slack(lower_s) > t_s + Slack(t_s);
}
// True when a time known to be at most `upper_s` (up to rounding) is
// certainly no later than `t_s`.
bool CertainlyBy(double upper_s, double t_s) {
  return upper_s + Slack(upper_s) < t_s - Slack(t_s);
}

// The least capacity a link ever offers before reservations.
double LeastRate(const Network& net, int link) {
  const std::vector<double>& rates = net.link(link).rates_bps;
  return *std::min_element(rates.begin(), rates.end());
}

// The server's sends of every case with u distributors (§10.3: distributor
// u first, then u-1, ..., 1, then the direct group in request order). They
// do not depend on n beyond the prefix of direct sends, so one pass gives
// every n's figures.
struct ServerChain {
  int used = 0;
  bool reachable = false;  // every distributor receives a copy
  bool complete = true;    // false: cut at the caller's n cap
  std::vector<int> rest;   // requesters not among the u distributors, in order
  std::vector<double> received;  // per distributor j < used
  // Per n = 0 .. done.size() - 1: when the server's last send ends (the
  // non-last distributors' delivery limit) and the latest server-side time
  // a requester waits for (direct deliveries, requesting distributors'
  // receipts, and every non-last distributor's receipt, which its nonempty
  // group's deliveries follow): the case's total is at least this, exactly.
  std::vector<double> done;
  std::vector<double> waited;
  std::vector<double> down_peak;         // per rest index
  // Per rest index: bits / LeastRate of its downlink (kInfinity if zero).
  std::vector<double> down_slowest_s;
  std::vector<double> suffix_min_down;   // per rest index, and +inf at the end
};

class DistributionSearch {
 public:
  DistributionSearch(const DistributionRequest& request, const Network& net, int server,
                     std::vector<int> requesters, std::vector<int> distributors)
      : now_s_(request.now_s),
        model_bytes_(request.model_bytes),
        bits_(8.0 * static_cast<double>(request.model_bytes)),
        bits_floor_(bits_ - 1e-3),
        server_(server),
        requesters_(std::move(requesters)),
        distributors_(std::move(distributors)),
        state_(net),
        position_(request.hosts.size(), static_cast<int>(requesters_.size())),
        is_used_(request.hosts.size(), 0) {
    for (size_t i = 0; i < requesters_.size(); ++i) {
      position_[requesters_[i]] = static_cast<int>(i);
    }
    for (int host : distributors_) {
      up_peak_.push_back(net.PeakRate(net.UplinkOf(host)));
      up_least_.push_back(LeastRate(net, net.UplinkOf(host)));
    }
    server_peak_ = net.PeakRate(net.UplinkOf(server_));
    state_.BeginJournal();
  }

  int num_requesters() const { return static_cast<int>(requesters_.size()); }
  int num_distributors() const { return static_cast<int>(distributors_.size()); }

  // Case (n, u) in full, as §10.3 describes it: the server sends to
  // distributors u-1 ... 0, then to the first n of the rest; distributor
  // u-1 takes the next requesters while each delivery ends by the server's
  // last send, then u-2, ...; distributor 0 takes whatever remains. An
  // infinite total: infeasible, or some delivery after `bound_s`.
  // `record`: keep the transfers and deliveries (the search itself reuses
  // one segment buffer). The network is left as it was.
  Candidate Evaluate(int n, int used, double bound_s, bool record);

  // Exhaustive searches: every case in full. FewestCopies may find none.
  Candidate ReferenceEarliest();
  Candidate ReferenceFewestCopies(double deadline_s);

  // The same choices, pruned (distribution.h, Cost).
  Choice Earliest();
  Choice FewestCopies(double deadline_s);

 private:
  bool Requested(int host) const { return position_[host] < num_requesters(); }
  std::vector<int> RestFor(int used);
  // Evaluate's one copy of the model from `src` to `dst` from `t0` on,
  // reserved (and kept in `*c` when `record`); kInfinity when it cannot be.
  double Send(int src, int dst, double t0, bool record, Candidate* c);
  // Pruning (a): a case sends u - 1 + n copies over the server's uplink
  // that some requester waits for (n when u = 0), so it cannot end before
  // this; true when that is certainly after `limit_s`.
  bool CannotMeet(int used, int n, double limit_s) const;
  // The server's sends for u distributors and every n up to `n_cap`, or
  // until the case certainly ends after `limit_s` (larger n do too).
  ServerChain Chain(int used, double limit_s, int n_cap);
  // At most this many deliveries of distributor j end by `limit_s`: its
  // uplink carries each one's bits from its receipt on.
  int Capacity(const ServerChain& chain, int j, double limit_s) const;
  // An upper bound on where distributor j's group ends when it starts at
  // rest index `pos` and its deliveries must end by `limit_s`: its capacity,
  // and the first requester whose delivery, even alone at the lesser of the
  // two NICs' peaks, ends after the limit (the group stops there).
  // Monotone in `pos`, so chaining it bounds the real chain of groups.
  int GroupEndBound(const ServerChain& chain, int j, int pos, double limit_s) const;
  // A lower bound on where distributor j's group ends when it starts at
  // rest index `pos` and stops at the first delivery after `limit_s`: its
  // c-th delivery ends by receipt + c x bits / its uplink's least rate +
  // bits / the receiver's least rate (at every instant either the uplink
  // is full, carrying at most these c copies, or the c-th copy runs at its
  // receiver's rate), so while that is by the limit the group goes on.
  // Monotone in `pos` (a later start only lowers each c). For pruning (d).
  int GroupEndLowerBound(const ServerChain& chain, int j, int pos, double limit_s) const;
  // Prunings (c) and (d): a lower bound on when distributor 0 (the last)
  // delivers its last copy in case n, given that every delivery of the case
  // ends by `limit_s` (kInfinity: unconditional): the non-last groups end
  // at most where GroupEndBound says, the last one serves the rest at its
  // uplink's peak at best. -kInfinity: no bound; kInfinity: the case is
  // infeasible (or, with a limit, cannot meet it).
  double LastGroupBound(const ServerChain& chain, int n, double limit_s) const;
  // Case n of `chain` evaluated from the chain's figures: the fan-out only,
  // on the untouched network, stopping as soon as a delivery ends after
  // `bound_s` (pruning (b)) or the groups left cannot serve the requesters
  // left by then, or surely leave a distributor none (as in (c), (d)).
  // Equal to Evaluate(n, chain.used, bound_s, false).total_s, bit for bit.
  double FanOut(const ServerChain& chain, int n, double bound_s);
  // Earliest's test: true when case n of `chain` (with lower bound `lower`
  // on its total) certainly cannot beat `best`.
  bool RuledOut(const Choice& best, const ServerChain& chain, int n, double lower) const;
  // Earliest's search over the cases with u = `used`, best-first, updating
  // `*best`. Returns false when no larger u can be reached either.
  bool TryUsed(int used, int guess, Choice* best);

  const double now_s_;
  const int64_t model_bytes_;
  const double bits_;
  // A delivery moves at least this many bits: a fill may end up to 1e-3 bit
  // early (Network's exact-fit tolerance).
  const double bits_floor_;
  const int server_;
  const std::vector<int> requesters_;
  const std::vector<int> distributors_;
  std::vector<double> up_peak_;   // per distributor
  std::vector<double> up_least_;  // per distributor (LeastRate)
  double server_peak_ = 0;
  Network state_;
  std::vector<int> position_;  // request position per host; |requesters| if none
  std::vector<char> is_used_;
  std::vector<RateSegment> scratch_;
  std::vector<int> room_;  // FanOut's per-u capacities
  // TryUsed's min-heap of (lower bound, -n): best-first, ties to the larger n.
  std::vector<std::pair<double, int>> heap_;
};

std::vector<int> DistributionSearch::RestFor(int used) {
  for (int j = 0; j < used; ++j) is_used_[distributors_[j]] = 1;
  std::vector<int> rest;
  rest.reserve(requesters_.size());
  for (int host : requesters_) {
    if (!is_used_[host]) rest.push_back(host);
  }
  for (int j = 0; j < used; ++j) is_used_[distributors_[j]] = 0;
  return rest;
}

double DistributionSearch::Send(int src, int dst, double t0, bool record, Candidate* c) {
  const Path path = state_.PathBetween(src, dst);
  if (!record) {
    const double end = state_.FillInto(path, t0, bits_, &scratch_);
    if (end == kInfinity) return kInfinity;
    state_.Reserve(path, scratch_);
    return end;
  }
  FillResult fill = state_.Fill(path, t0, bits_);
  if (!fill.feasible) return kInfinity;
  state_.Reserve(path, fill.segments);
  PlannedTransfer t;
  t.src = src;
  t.dst = dst;
  t.bytes = model_bytes_;
  t.start_s = fill.segments.front().from_s;
  t.end_s = fill.end_s;
  t.segments = std::move(fill.segments);
  c->transfers.push_back(std::move(t));
  return c->transfers.back().end_s;
}

Candidate DistributionSearch::Evaluate(int n, int used, double bound_s, bool record) {
  const std::vector<int> rest = RestFor(used);
  const size_t mark = state_.JournalMark();
  Candidate c;
  c.direct = n;
  c.used = used;
  auto send = [&](int src, int dst, double t0) { return Send(src, dst, t0, record, &c); };
  auto run = [&]() {
    std::vector<double> received(used, kInfinity);
    double server_done = now_s_;
    for (int j = used - 1; j >= 0; --j) {
      received[j] = send(server_, distributors_[j], now_s_);
      if (received[j] == kInfinity) return;
      if (j > 0 && received[j] > bound_s) return;
      server_done = std::max(server_done, received[j]);
    }
    std::vector<std::pair<int, double>> delivered;
    std::vector<int> via;
    for (int i = 0; i < n; ++i) {
      const double at = send(server_, rest[i], now_s_);
      if (at == kInfinity || at > bound_s) return;
      delivered.push_back({position_[rest[i]], at});
      via.push_back(server_);
      server_done = std::max(server_done, at);
    }
    int idx = n;
    for (int j = used - 1; j >= 0; --j) {
      const int host = distributors_[j];
      const bool last = j == 0;
      const bool requested = Requested(host);
      if (requested) {
        if (received[j] > bound_s) return;
        delivered.push_back({position_[host], received[j]});
        via.push_back(server_);
      }
      const int first = idx;
      while (idx < static_cast<int>(rest.size())) {
        const Path path = state_.PathBetween(host, rest[idx]);
        const double end = record ? state_.FillEnd(path, received[j], bits_)
                                  : state_.FillInto(path, received[j], bits_, &scratch_);
        if (end == kInfinity && last) return;
        if (!last && end > server_done) break;
        if (end > bound_s) return;
        if (record) {
          send(host, rest[idx], received[j]);
        } else {
          state_.Reserve(path, scratch_);
        }
        delivered.push_back({position_[rest[idx]], end});
        via.push_back(host);
        ++idx;
      }
      if (idx == first && !requested && !last) return;
    }
    if (idx < static_cast<int>(rest.size())) return;
    double total = now_s_;
    for (const auto& d : delivered) total = std::max(total, d.second);
    c.total_s = total;
    c.delivered = std::move(delivered);
    c.via = std::move(via);
  };
  run();
  state_.RollbackTo(mark);
  if (c.total_s == kInfinity) c.transfers.clear();
  return c;
}

Candidate DistributionSearch::ReferenceEarliest() {
  Candidate best;
  for (int used = 0; used <= num_distributors(); ++used) {
    const int max_n = static_cast<int>(RestFor(used).size());
    for (int n = used == 0 ? max_n : 0; n <= max_n; ++n) {
      Candidate c = Evaluate(n, used, kInfinity, true);
      if (c.total_s == kInfinity) continue;
      if (std::make_tuple(c.total_s, -c.direct, c.used) <
          std::make_tuple(best.total_s, -best.direct, best.used)) {
        best = std::move(c);
      }
    }
  }
  return best;
}

Candidate DistributionSearch::ReferenceFewestCopies(double deadline_s) {
  Candidate best;
  for (int used = 0; used <= num_distributors(); ++used) {
    const int max_n = static_cast<int>(RestFor(used).size());
    for (int n = used == 0 ? max_n : 0; n <= max_n; ++n) {
      Candidate c = Evaluate(n, used, kInfinity, true);
      if (c.total_s > deadline_s) continue;
      if (best.total_s == kInfinity ||
          std::make_tuple(c.used + c.direct, c.total_s, -c.direct, c.used) <
              std::make_tuple(best.used + best.direct, best.total_s, -best.direct, best.used)) {
        best = std::move(c);
      }
    }
  }
  return best;
}

bool DistributionSearch::CannotMeet(int used, int n, double limit_s) const {
  if (limit_s == kInfinity) return false;
  if (server_peak_ <= 0) return true;
  const int copies = std::max(0, used - 1) + n;
  if (copies == 0) return false;
  return CertainlyAfter(now_s_ + copies * bits_floor_ / server_peak_, limit_s);
}

ServerChain DistributionSearch::Chain(int used, double limit_s, int n_cap) {
  ServerChain chain;
  chain.used = used;
  chain.rest = RestFor(used);
  const int m = static_cast<int>(chain.rest.size());
  for (int host : chain.rest) {
    chain.down_peak.push_back(state_.PeakRate(state_.DownlinkOf(host)));
    const double least = LeastRate(state_, state_.DownlinkOf(host));
    chain.down_slowest_s.push_back(least > 0 ? bits_ / least : kInfinity);
  }
  chain.suffix_min_down.assign(m + 1, kInfinity);
  for (int i = m - 1; i >= 0; --i) {
    chain.suffix_min_down[i] = std::min(chain.suffix_min_down[i + 1], chain.down_peak[i]);
  }
  const size_t mark = state_.JournalMark();
  chain.received.assign(used, kInfinity);
  double done = now_s_;
  double waited = now_s_;
  chain.reachable = true;
  for (int j = used - 1; j >= 0; --j) {
    const Path path = state_.PathBetween(server_, distributors_[j]);
    const double end = state_.FillInto(path, now_s_, bits_, &scratch_);
    if (end == kInfinity) {
      chain.reachable = false;
      break;
    }
    state_.Reserve(path, scratch_);
    chain.received[j] = end;
    done = std::max(done, end);
    if (j > 0 || Requested(distributors_[j])) waited = std::max(waited, end);
  }
  if (chain.reachable) {
    chain.done.push_back(done);
    chain.waited.push_back(waited);
    // `waited` only grows with n, and so does the server's bound: once
    // either is past the limit, so is every larger n.
    for (int i = 0; i < m && !(waited > limit_s) && !CannotMeet(used, i + 1, limit_s); ++i) {
      if (i + 1 > n_cap) {
        chain.complete = false;
        break;
      }
      const Path path = state_.PathBetween(server_, chain.rest[i]);
      const double end = state_.FillInto(path, now_s_, bits_, &scratch_);
      if (end == kInfinity) break;  // and so is every larger n
      state_.Reserve(path, scratch_);
      done = std::max(done, end);
      waited = std::max(waited, end);
      chain.done.push_back(done);
      chain.waited.push_back(waited);
    }
  }
  state_.RollbackTo(mark);
  return chain;
}

int DistributionSearch::Capacity(const ServerChain& chain, int j, double limit_s) const {
  const int m = static_cast<int>(chain.rest.size());
  if (limit_s == kInfinity) return m;
  const double received = chain.received[j];
  const double window = (limit_s + Slack(limit_s)) - (received - Slack(received));
  if (!(window > 0) || !(up_peak_[j] > 0)) return 0;
  const double slots = window * up_peak_[j] / bits_floor_ * (1 + 1e-9) + 1e-9;
  return slots >= m ? m : static_cast<int>(slots);
}

int DistributionSearch::GroupEndLowerBound(const ServerChain& chain, int j, int pos,
                                           double limit_s) const {
  const int m = static_cast<int>(chain.rest.size());
  if (!(up_least_[j] > 0)) return pos;
  const double received = chain.received[j];
  const double copy_s = bits_ / up_least_[j];
  int i = pos;
  while (i < m && CertainlyBy(received + (i - pos + 1) * copy_s + chain.down_slowest_s[i],
                              limit_s)) {
    ++i;
  }
  return i;
}

int DistributionSearch::GroupEndBound(const ServerChain& chain, int j, int pos,
                                      double limit_s) const {
  const int end = static_cast<int>(
      std::min<int64_t>(chain.rest.size(), int64_t{pos} + Capacity(chain, j, limit_s)));
  if (limit_s == kInfinity || end == pos) return end;
  const double received = chain.received[j];
  auto stops = [&](double down_peak) {
    const double rate = std::min(up_peak_[j], down_peak);
    return !(rate > 0) || CertainlyAfter(received + bits_floor_ / rate, limit_s);
  };
  // `stops` is monotone in the rate: no stop anywhere after `pos` unless
  // the slowest NIC there stops it (the common case for wide windows).
  if (!stops(chain.suffix_min_down[pos])) return end;
  for (int i = pos; i < end; ++i) {
    if (stops(chain.down_peak[i])) return i;
  }
  return end;
}

double DistributionSearch::LastGroupBound(const ServerChain& chain, int n, double limit_s) const {
  const int m = static_cast<int>(chain.rest.size());
  if (chain.used == 0) return n == m ? -kInfinity : kInfinity;
  const double threshold = std::min(chain.done[n], limit_s);
  // A non-last distributor that did not ask for the model must serve
  // someone by the server's last send: infeasible if even at its uplink's
  // peak it cannot, or if the groups before it certainly take every
  // requester left (they end no earlier than GroupEndLowerBound says).
  int last_unrequested = chain.used;  // the lowest such j >= 1, if any
  for (int j = 1; j < chain.used; ++j) {
    if (Requested(distributors_[j])) continue;
    if (!(up_peak_[j] > 0) ||
        CertainlyAfter(chain.received[j] + bits_floor_ / up_peak_[j], threshold)) {
      return kInfinity;
    }
    last_unrequested = std::min(last_unrequested, j);
  }
  for (int j = chain.used - 1, low = n; j >= last_unrequested; --j) {
    if (low >= m && !Requested(distributors_[j])) return kInfinity;
    low = GroupEndLowerBound(chain, j, low, chain.done[n]);
  }
  int pos = n;
  for (int j = chain.used - 1; j >= 1 && pos < m; --j) {
    pos = GroupEndBound(chain, j, pos, threshold);
  }
  if (pos >= m) return -kInfinity;
  const double peak = std::min(up_peak_[0], chain.suffix_min_down[pos]);
  if (!(up_peak_[0] > 0) || !(peak > 0)) return kInfinity;
  const double received = chain.received[0];
  return std::max(received + (m - pos) * bits_floor_ / up_peak_[0],
                  received + bits_floor_ / peak);
}

double DistributionSearch::FanOut(const ServerChain& chain, int n, double bound_s) {
  const int m = static_cast<int>(chain.rest.size());
  double total = chain.waited[n];
  if (total > bound_s) return kInfinity;
  if (chain.used == 0) return n == m ? total : kInfinity;
  const double server_done = chain.done[n];
  // room_[j]: how many requesters distributors j ... 0 can still serve with
  // every delivery by the bound (each one's Capacity).
  room_.assign(chain.used, 0);
  int64_t room = 0;
  for (int j = 0; j < chain.used; ++j) {
    room += Capacity(chain, j, j == 0 ? bound_s : std::min(server_done, bound_s));
    room_[j] = static_cast<int>(std::min<int64_t>(room, m));
  }
  if (m - n > room_[chain.used - 1]) return kInfinity;
  int last_unrequested = chain.used;  // the lowest non-last j that did not ask
  for (int j = chain.used - 1; j >= 1; --j) {
    if (!Requested(distributors_[j])) last_unrequested = j;
  }
  const size_t mark = state_.JournalMark();
  int pos = n;
  bool feasible = true;
  for (int j = chain.used - 1; j >= 0 && feasible; --j) {
    const int host = distributors_[j];
    const bool last = j == 0;
    const int first = pos;
    while (pos < m) {
      const Path path = state_.PathBetween(host, chain.rest[pos]);
      const double end = state_.FillInto(path, chain.received[j], bits_, &scratch_);
      if (end == kInfinity && last) {
        feasible = false;
        break;
      }
      if (!last && end > server_done) break;
      if (end > bound_s) {
        feasible = false;
        break;
      }
      state_.Reserve(path, scratch_);
      total = std::max(total, end);
      ++pos;
    }
    if (!feasible || last) break;
    if ((pos == first && !Requested(host)) || m - pos > room_[j - 1]) {
      feasible = false;
      break;
    }
    // The groups still to come certainly take every requester left before
    // some distributor that must serve one (as in LastGroupBound).
    for (int i = j - 1, low = pos; i >= last_unrequested; --i) {
      if (low >= m && !Requested(distributors_[i])) {
        feasible = false;
        break;
      }
      low = GroupEndLowerBound(chain, i, low, server_done);
    }
  }
  state_.RollbackTo(mark);
  return feasible ? total : kInfinity;
}

bool DistributionSearch::RuledOut(const Choice& best, const ServerChain& chain, int n,
                                  double lower) const {
  if (best.total_s == kInfinity) return false;
  if (CertainlyAfter(lower, best.total_s)) return true;
  if (std::make_tuple(-n, chain.used) > std::make_tuple(-best.direct, best.used) &&
      (chain.waited[n] >= best.total_s || lower - Slack(lower) >= best.total_s)) {
    return true;  // at best a tie, which it loses
  }
  return CertainlyAfter(LastGroupBound(chain, n, best.total_s), best.total_s);
}

bool DistributionSearch::TryUsed(int used, int guess, Choice* best) {
  const auto heap_order = std::greater<std::pair<double, int>>();
  // The chain is extended (recomputed, doubling) only while its cases may
  // still come first; lower bounds are computed lazily in n, since the
  // chain's exact part of them only grows with n.
  int n_cap = std::min(num_requesters(), 2 * guess + 16);
  ServerChain chain = Chain(used, best->total_s, n_cap);
  // Residual capacity only shrinks as the server sends more, so a
  // distributor it cannot reach stays unreachable for every larger u.
  if (!chain.reachable) return false;
  const int m = static_cast<int>(chain.rest.size());
  heap_.clear();
  int next_n = used == 0 ? m : 0;
  for (;;) {
    // Bound every n that might come before the heap's best.
    for (;;) {
      if (next_n >= static_cast<int>(chain.done.size())) {
        if (chain.complete) break;
        n_cap = std::min(num_requesters(), 2 * n_cap);
        chain = Chain(used, best->total_s, n_cap);
        continue;
      }
      if (chain.waited[next_n] > best->total_s) break;  // and every larger n
      if (!heap_.empty() && chain.waited[next_n] > heap_.front().first) break;
      const int n = next_n++;
      const double lower = std::max(chain.waited[n], LastGroupBound(chain, n, kInfinity));
      if (lower == kInfinity || RuledOut(*best, chain, n, lower)) continue;  // infeasible or no win
      heap_.push_back({lower, -n});
      std::push_heap(heap_.begin(), heap_.end(), heap_order);
    }
    if (heap_.empty()) break;
    std::pop_heap(heap_.begin(), heap_.end(), heap_order);
    const auto [lower, neg_n] = heap_.back();
    heap_.pop_back();
    const int n = -neg_n;
    // Every case left has a lower bound at least this one's.
    if (best->total_s != kInfinity && CertainlyAfter(lower, best->total_s)) break;
    // A chain recomputed against a better total may stop before n: then
    // n certainly cannot meet it.
    if (n >= static_cast<int>(chain.done.size()) || RuledOut(*best, chain, n, lower)) continue;
    const double total = FanOut(chain, n, best->total_s);
    if (total != kInfinity && std::make_tuple(total, -n, used) <
                                  std::make_tuple(best->total_s, -best->direct, best->used)) {
      *best = {total, n, used};
    }
  }
  return true;
}

// Per-batch objective: the earliest total, ties to the larger n, then the
// smaller u. Values of u are taken outwards from a guess at the best one,
// and each u's cases best-first by a lower bound on their total, so that a
// good total is found early and the bounds then rule out the rest.
Choice DistributionSearch::Earliest() {
  Choice best;
  // The guess: u distributors and n direct copies take about (u + n) copy
  // times on the server's link, in which the non-last distributors serve
  // about u^2 / 2 + u n requesters; the last one about as many as the
  // server's link leaves time for. So few copies reach |requesters| when
  // u is near sqrt(2 |requesters|) and n is small.
  const int num_d = num_distributors();
  const int guess = std::min(
      num_d, static_cast<int>(std::lround(std::sqrt(2.0 * num_requesters()))));
  auto try_used = [&](int used) { return TryUsed(used, guess, &best); };
  int up = guess;        // next u to try upwards
  int down = guess - 1;  // and downwards
  auto try_up = [&]() {
    // The server's bound is monotone in u, and so is reachability.
    if (up > num_d || CannotMeet(up, 0, best.total_s) || !try_used(up)) {
      up = num_d + 1;
      return false;
    }
    ++up;
    return true;
  };
  // Alternate until some case is feasible (with no total to beat, every
  // case would be evaluated), then finish both directions.
  while (best.total_s == kInfinity && (up <= num_d || down >= 0)) {
    try_up();
    if (best.total_s == kInfinity && down >= 0) try_used(down--);
  }
  while (try_up()) {
  }
  for (; down >= 0; --down) try_used(down);
  return best;
}

// Deadline objective: the fewest server copies k = u + n among the cases
// done by the deadline, ties to the earlier total, the larger n, the
// smaller u. Cases are taken by k (and best-first within k) up to a cap on
// k that doubles while no case qualifies and larger k remain possible.
Choice DistributionSearch::FewestCopies(double deadline_s) {
  const int num_d = num_distributors();
  int k_cap = std::max(
      16, 2 * static_cast<int>(std::ceil(std::sqrt(static_cast<double>(num_requesters())))));
  for (;;) {
    std::vector<ServerChain> chains;
    std::vector<std::tuple<int, double, int, int>> candidates;  // (k, lower bound, -n, u)
    bool cut = false;  // some case beyond k_cap was not ruled out
    for (int used = 0; used <= num_d; ++used) {
      if (CannotMeet(used, 0, deadline_s)) break;
      if (used > k_cap) {
        cut = true;
        break;
      }
      chains.push_back(Chain(used, deadline_s, k_cap - used));
      const ServerChain& chain = chains.back();
      if (!chain.reachable) break;  // as in Earliest
      cut = cut || !chain.complete;
      const int m = static_cast<int>(chain.rest.size());
      for (int n = used == 0 ? m : 0; n < static_cast<int>(chain.done.size()); ++n) {
        if (chain.waited[n] > deadline_s) break;
        if (CertainlyAfter(LastGroupBound(chain, n, deadline_s), deadline_s)) continue;
        candidates.push_back({used + n,
                              std::max(chain.waited[n], LastGroupBound(chain, n, kInfinity)), -n,
                              used});
      }
    }
    std::sort(candidates.begin(), candidates.end());
    Choice best;
    for (const auto& [copies, lower, neg_n, used] : candidates) {
      const bool found = best.total_s != kInfinity;
      if (found && copies > best.used + best.direct) break;
      const double limit = found ? best.total_s : deadline_s;
      if (CertainlyAfter(lower, limit)) continue;
      const ServerChain& chain = chains[used];
      const int n = -neg_n;
      if (found && std::make_tuple(-n, used) > std::make_tuple(-best.direct, best.used) &&
          (chain.waited[n] >= limit || lower - Slack(lower) >= limit)) {
        continue;  // at best a tie, which it loses
      }
      if (CertainlyAfter(LastGroupBound(chain, n, limit), limit)) continue;
      const double total = FanOut(chain, n, limit);
      if (total == kInfinity) continue;
      if (!found || std::make_tuple(total, -n, used) <
                        std::make_tuple(best.total_s, -best.direct, best.used)) {
        best = {total, n, used};
      }
    }
    if (best.total_s != kInfinity || !cut) return best;
    k_cap *= 2;
  }
}

// The requesters' host indices, in request order; each must be a host other
// than the server and ask once.
absl::StatusOr<std::vector<int>> RequesterHosts(const DistributionRequest& request,
                                                const Network& net, int server) {
  std::vector<int> requesters;
  std::vector<char> is_requester(request.hosts.size(), 0);
  for (size_t i = 0; i < request.requesters.size(); ++i) {
    const int host = net.HostIndex(request.requesters[i]);
    if (host < 0) {
      return absl::InvalidArgumentError(absl::StrCat("requesters[", i, "]: '",
                                                     request.requesters[i], "' is not in hosts"));
    }
    if (host == server) {
      return absl::InvalidArgumentError(absl::StrCat("requesters[", i, "]: the server itself"));
    }
    if (is_requester[host]) {
      return absl::InvalidArgumentError(absl::StrCat("requesters[", i, "]: duplicate '",
                                                     request.requesters[i], "'"));
    }
    is_requester[host] = 1;
    requesters.push_back(host);
  }
  return requesters;
}

// The distributors' host indices in their seeded pre-assigned order (the
// server and repeats left out).
absl::StatusOr<std::vector<int>> DistributorHosts(const DistributionRequest& request,
                                                  const Network& net, int server) {
  std::vector<int> distributors;
  std::vector<char> is_distributor(request.hosts.size(), 0);
  for (size_t i = 0; i < request.distributors.size(); ++i) {
    const int host = net.HostIndex(request.distributors[i]);
    if (host < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "distributors[", i, "]: '", request.distributors[i], "' is not in hosts"));
    }
    if (host == server || is_distributor[host]) continue;
    is_distributor[host] = 1;
    distributors.push_back(host);
  }
  return ShuffleAggregators(std::move(distributors), request.seed);
}

// The winning case in full (total kInfinity when none reaches everyone).
Candidate BestCase(DistributionSearch* search, const DistributionOptions& options) {
  const bool by_deadline = options.deadline_s < DistributionOptions::kNoDeadline;
  Candidate best;
  if (options.reference) {
    if (by_deadline) best = search->ReferenceFewestCopies(options.deadline_s);
    // If no case meets the deadline, the per-batch objective decides.
    if (best.total_s == kInfinity) best = search->ReferenceEarliest();
  } else {
    Choice choice;
    if (by_deadline) choice = search->FewestCopies(options.deadline_s);
    if (choice.total_s == kInfinity) choice = search->Earliest();
    // The search ran without recording; replay the winner in full (the
    // same fills, so the same plan).
    if (choice.total_s != kInfinity) {
      best = search->Evaluate(choice.direct, choice.used, kInfinity, true);
    }
  }
  return best;
}

DistributionPlan ToDistributionPlan(const Candidate& best, const Network& net,
                                    const std::vector<int>& requesters) {
  DistributionPlan plan;
  plan.direct = best.direct;
  plan.distributors_used = best.used;
  plan.total_s = best.total_s;
  for (const PlannedTransfer& t : best.transfers) {
    Transfer out;
    out.update = "model";
    out.src = net.HostName(t.src);
    out.dst = net.HostName(t.dst);
    out.kind = TransferKind::kDirect;
    out.start_s = t.start_s;
    out.end_s = t.end_s;
    out.bytes = t.bytes;
    out.segments = t.segments;
    plan.transfers.push_back(std::move(out));
  }
  plan.deliveries.resize(requesters.size());
  for (size_t i = 0; i < best.delivered.size(); ++i) {
    const auto& [position, at] = best.delivered[i];
    plan.deliveries[position] = {net.HostName(requesters[position]), at,
                                 net.HostName(best.via[i])};
  }
  return plan;
}

}  // namespace

absl::StatusOr<DistributionPlan> PlanModelDistribution(const DistributionRequest& request,
                                                       const DistributionOptions& options) {
  if (request.model_bytes <= 0) {
    return absl::InvalidArgumentError("model_bytes: must be a positive integer");
  }
  ASSIGN_OR_RETURN(Batch batch, DistributionBatch(request));
  ASSIGN_OR_RETURN(Network net, Network::FromBatch(batch));
  const int server = net.HostIndex(request.server);
  ASSIGN_OR_RETURN(std::vector<int> requesters, RequesterHosts(request, net, server));
  ASSIGN_OR_RETURN(std::vector<int> distributors, DistributorHosts(request, net, server));
  DistributionSearch search(request, net, server, requesters, std::move(distributors));
  const Candidate best = BestCase(&search, options);
  if (best.total_s == kInfinity) {
    return absl::FailedPreconditionError(
        "no distribution reaches every requester: some path has no capacity");
  }
  return ToDistributionPlan(best, net, requesters);
}


}  // namespace mlfabric::core
