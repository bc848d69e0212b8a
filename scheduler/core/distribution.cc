#include "scheduler/core/distribution.h"

// Cases share one network and undo their reservations through its journal;
// the pruning that keeps the default search fast is described in
// distribution.h (Cost).

#include <algorithm>
#include <cmath>
#include <cstdio>
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

}  // namespace

absl::StatusOr<DistributionPlan> PlanModelDistribution(const DistributionRequest& request,
                                                       const DistributionOptions& options) {
  if (request.model_bytes <= 0) {
    return absl::InvalidArgumentError("model_bytes: must be a positive integer");
  }
  Batch batch;
  batch.now_s = request.now_s;
  batch.server = request.server;
  batch.hosts = request.hosts;
  RETURN_IF_ERROR(ValidateBatch(batch));
  ASSIGN_OR_RETURN(Network net, Network::FromBatch(batch));
  const int server = net.HostIndex(request.server);
  std::vector<int> requesters;
  for (size_t i = 0; i < request.requesters.size(); ++i) {
    const int host = net.HostIndex(request.requesters[i]);
    if (host < 0) {
      return absl::InvalidArgumentError(absl::StrCat("requesters[", i, "]: '",
                                                     request.requesters[i], "' is not in hosts"));
    }
    if (host == server) {
      return absl::InvalidArgumentError(absl::StrCat("requesters[", i, "]: the server itself"));
    }
    if (std::find(requesters.begin(), requesters.end(), host) != requesters.end()) {
      return absl::InvalidArgumentError(absl::StrCat("requesters[", i, "]: duplicate '",
                                                     request.requesters[i], "'"));
    }
    requesters.push_back(host);
  }
  std::vector<int> distributors;
  for (size_t i = 0; i < request.distributors.size(); ++i) {
    const int host = net.HostIndex(request.distributors[i]);
    if (host < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "distributors[", i, "]: '", request.distributors[i], "' is not in hosts"));
    }
    if (host == server ||
        std::find(distributors.begin(), distributors.end(), host) != distributors.end()) {
      continue;
    }
    distributors.push_back(host);
  }
  distributors = ShuffleAggregators(std::move(distributors), request.seed);
  const double bits = 8.0 * static_cast<double>(request.model_bytes);
  // Request position per host; |requesters| for hosts that did not ask.
  std::vector<int> position(request.hosts.size(), static_cast<int>(requesters.size()));
  for (size_t i = 0; i < requesters.size(); ++i) position[requesters[i]] = static_cast<int>(i);
  auto position_of = [&](int host) { return position[host]; };

  // Pruning (a) of distribution.h: the server's uplink carries u - 1 + n
  // copies that someone waits for (n when u = 0), so no case ends before
  // this. The margin keeps the test exact against
  // the rounding of the fills' sums.
  const double server_peak = net.PeakRate(net.UplinkOf(server));
  auto cannot_win = [&](int used, int n, double best_total) {
    if (best_total == kInfinity || server_peak <= 0) return false;
    const int copies = std::max(0, used - 1) + n;
    const double bound = request.now_s + copies * bits / server_peak;
    return bound * (1 - 1e-9) - 1e-12 > best_total;
  };

  // One network for every case; each case's reservations are undone.
  Network state = net;
  state.BeginJournal();
  // `bound`: a case with a delivery after it cannot win; it stops there.
  // `record`: keep the transfers (only the winning case needs them; the
  // search itself reuses one segment buffer).
  std::vector<RateSegment> scratch;
  auto evaluate = [&](int n, int used, const std::vector<int>& rest, double bound, bool record) {
    Candidate c;
    c.direct = n;
    c.used = used;
    auto send = [&](int src, int dst, double t0) {
      const Path path = state.PathBetween(src, dst);
      if (!record) {
        const double end = state.FillInto(path, t0, bits, &scratch);
        if (end == kInfinity) return kInfinity;
        state.Reserve(path, scratch);
        return end;
      }
      FillResult fill = state.Fill(path, t0, bits);
      if (!fill.feasible) return kInfinity;
      state.Reserve(path, fill.segments);
      PlannedTransfer t;
      t.src = src;
      t.dst = dst;
      t.bytes = request.model_bytes;
      t.start_s = fill.segments.front().from_s;
      t.end_s = fill.end_s;
      t.segments = std::move(fill.segments);
      c.transfers.push_back(std::move(t));
      return c.transfers.back().end_s;
    };
    std::vector<double> received(used, kInfinity);
    double server_done = request.now_s;
    for (int j = used - 1; j >= 0; --j) {
      received[j] = send(server, distributors[j], request.now_s);
      if (received[j] == kInfinity) return c;
      if (j > 0 && received[j] > bound) return c;
      server_done = std::max(server_done, received[j]);
    }
    std::vector<std::pair<int, double>> delivered;
    std::vector<int> via;
    for (int i = 0; i < n; ++i) {
      const double at = send(server, rest[i], request.now_s);
      if (at == kInfinity || at > bound) return c;
      delivered.push_back({position_of(rest[i]), at});
      via.push_back(server);
      server_done = std::max(server_done, at);
    }
    int idx = n;
    for (int j = used - 1; j >= 0; --j) {
      const int host = distributors[j];
      const bool last = j == 0;
      const bool requested = position_of(host) < static_cast<int>(requesters.size());
      if (requested) {
        if (received[j] > bound) return c;
        delivered.push_back({position_of(host), received[j]});
        via.push_back(server);
      }
      const int first = idx;
      while (idx < static_cast<int>(rest.size())) {
        const Path path = state.PathBetween(host, rest[idx]);
        const double end = record ? state.FillEnd(path, received[j], bits)
                                  : state.FillInto(path, received[j], bits, &scratch);
        if (end == kInfinity && last) return c;
        if (!last && end > server_done) break;
        if (end > bound) return c;
        if (record) {
          send(host, rest[idx], received[j]);
        } else {
          state.Reserve(path, scratch);
        }
        delivered.push_back({position_of(rest[idx]), end});
        via.push_back(host);
        ++idx;
      }
      if (idx == first && !requested && !last) return c;
    }
    if (idx < static_cast<int>(rest.size())) return c;
    double total = request.now_s;
    for (const auto& d : delivered) total = std::max(total, d.second);
    c.total_s = total;
    c.delivered = std::move(delivered);
    c.via = std::move(via);
    return c;
  };

  // Pruning (c) of distribution.h: distributor j's c-th delivery cannot end
  // before received_j + c x bits / its peak uplink, so by `best_total` the
  // u distributors can serve at most this many requesters (capped at `cap`);
  // a case leaving more to them cannot win. -1: some distributor is never
  // reached (every case with u fails).
  auto fan_out_capacity = [&](int used, double best_total, int cap) {
    const size_t mark = state.JournalMark();
    int64_t capacity = 0;
    for (int j = used - 1; j >= 0; --j) {
      const Path path = state.PathBetween(server, distributors[j]);
      FillResult fill = state.Fill(path, request.now_s, bits);
      if (!fill.feasible) {
        state.RollbackTo(mark);
        return -1;
      }
      state.Reserve(path, fill.segments);
      const double peak = state.PeakRate(state.UplinkOf(distributors[j]));
      const double slots = (best_total - fill.end_s) * peak / bits;
      if (slots > 0) {
        capacity += static_cast<int64_t>(std::min<double>(cap, slots * (1 + 1e-9) + 1e-9));
      }
      if (capacity >= cap) break;
    }
    state.RollbackTo(mark);
    return static_cast<int>(std::min<int64_t>(capacity, cap));
  };

  Candidate best;
  const int num_distributors = static_cast<int>(distributors.size());
  std::vector<char> is_used(position.size(), 0);
  auto try_used = [&](int used) {
    std::fill(is_used.begin(), is_used.end(), 0);
    for (int j = 0; j < used; ++j) is_used[distributors[j]] = 1;
    std::vector<int> rest;
    for (int host : requesters) {
      if (!is_used[host]) rest.push_back(host);
    }
    const int max_n = static_cast<int>(rest.size());
    int min_n = used == 0 ? max_n : 0;
    if (!options.reference && used > 0 && best.total_s != kInfinity) {
      const int groups = fan_out_capacity(used, best.total_s, max_n);
      if (groups < 0) return;
      min_n = std::max(min_n, max_n - groups);
    }
    // Pruning (d): the server's sends are the same prefix chain for every n
    // of this u, so one pass gives each n's server_done; non-last
    // distributors deliver only by server_done, the last one by the best
    // total, and together they must serve the max_n - n requesters left.
    std::vector<double> received, server_done, waited;
    double lead = request.now_s;  // the latest receipt every case of this u waits for
    if (!options.reference && used > 0 && best.total_s != kInfinity) {
      if (cannot_win(used, min_n, best.total_s)) return;
      const size_t mark = state.JournalMark();
      received.assign(used, kInfinity);
      double done = request.now_s;
      for (int j = used - 1; j >= 0; --j) {
        const Path path = state.PathBetween(server, distributors[j]);
        FillResult fill = state.Fill(path, request.now_s, bits);
        if (!fill.feasible) break;
        state.Reserve(path, fill.segments);
        received[j] = fill.end_s;
        done = std::max(done, fill.end_s);
        if (j > 0 || position_of(distributors[j]) < static_cast<int>(requesters.size())) {
          lead = std::max(lead, fill.end_s);
        }
      }
      server_done.push_back(done);
      waited.push_back(lead);
      for (int i = 0; i < max_n && waited.back() <= best.total_s; ++i) {
        const Path path = state.PathBetween(server, rest[i]);
        FillResult fill = state.Fill(path, request.now_s, bits);
        if (!fill.feasible) break;
        state.Reserve(path, fill.segments);
        done = std::max(done, fill.end_s);
        server_done.push_back(done);
        waited.push_back(std::max(waited.back(), fill.end_s));
      }
      state.RollbackTo(mark);
    }
    auto fan_out_short = [&](int n) {
      if (server_done.empty()) return false;
      if (n >= static_cast<int>(server_done.size())) return true;
      if (waited[n] > best.total_s) return true;
      int64_t slots = 0;
      for (int j = 0; j < used; ++j) {
        const double until = j == 0 ? best.total_s : server_done[n];
        const double peak = state.PeakRate(state.UplinkOf(distributors[j]));
        const double s = (until - received[j]) * peak / bits;
        if (s > 0) slots += static_cast<int64_t>(std::min<double>(max_n, s * (1 + 1e-9) + 1e-9));
        if (slots >= max_n - n) return false;
      }
      return true;
    };
    for (int n = min_n; n <= max_n; ++n) {
      if (!options.reference && cannot_win(used, n, best.total_s)) break;
      if (!options.reference && fan_out_short(n)) continue;
      const size_t mark = state.JournalMark();
      Candidate c = evaluate(n, used, rest, options.reference ? kInfinity : best.total_s,
                             options.reference);
      state.RollbackTo(mark);
      if (c.total_s == kInfinity) continue;
      if (std::make_tuple(c.total_s, -c.direct, c.used) <
          std::make_tuple(best.total_s, -best.direct, best.used)) {
        best = std::move(c);
      }
    }
  };
  if (options.deadline_s < DistributionOptions::kNoDeadline && options.reference) {
    // Every case in full, the fewest server copies among those done by the
    // deadline (ties: earlier total, larger n, smaller u).
    for (int used = 0; used <= num_distributors; ++used) {
      std::fill(is_used.begin(), is_used.end(), 0);
      for (int j = 0; j < used; ++j) is_used[distributors[j]] = 1;
      std::vector<int> rest;
      for (int host : requesters) {
        if (!is_used[host]) rest.push_back(host);
      }
      const int max_n = static_cast<int>(rest.size());
      for (int n = used == 0 ? max_n : 0; n <= max_n; ++n) {
        const size_t mark = state.JournalMark();
        Candidate c = evaluate(n, used, rest, kInfinity, true);
        state.RollbackTo(mark);
        if (c.total_s > options.deadline_s) continue;
        if (best.total_s == kInfinity ||
            std::make_tuple(c.used + c.direct, c.total_s, -c.direct, c.used) <
            std::make_tuple(best.used + best.direct, best.total_s, -best.direct, best.used)) {
          best = std::move(c);
        }
      }
    }
  } else if (options.deadline_s < DistributionOptions::kNoDeadline) {
    // Fewest server copies by the deadline: copies = u + n grow along both
    // loops, and the server-uplink bound against the deadline stops them.
    Candidate frugal;
    std::vector<int> frugal_rest;
    for (int used = 0; used <= num_distributors; ++used) {
      if (frugal.total_s != kInfinity && used > frugal.used + frugal.direct) break;
      if (cannot_win(used, 0, options.deadline_s)) break;
      std::fill(is_used.begin(), is_used.end(), 0);
      for (int j = 0; j < used; ++j) is_used[distributors[j]] = 1;
      std::vector<int> rest;
      for (int host : requesters) {
        if (!is_used[host]) rest.push_back(host);
      }
      const int max_n = static_cast<int>(rest.size());
      for (int n = used == 0 ? max_n : 0; n <= max_n; ++n) {
        if (cannot_win(used, n, options.deadline_s)) break;
        if (frugal.total_s != kInfinity && used + n > frugal.used + frugal.direct) break;
        const size_t mark = state.JournalMark();
        Candidate c = evaluate(n, used, rest, options.deadline_s, false);
        state.RollbackTo(mark);
        if (c.total_s > options.deadline_s) continue;
        if (frugal.total_s == kInfinity ||
            std::make_tuple(c.used + c.direct, c.total_s, -c.direct, c.used) <
            std::make_tuple(frugal.used + frugal.direct, frugal.total_s, -frugal.direct,
                            frugal.used)) {
          frugal = std::move(c);
        }
      }
    }
    if (frugal.total_s != kInfinity) best = std::move(frugal);
  }
  const bool met_deadline = best.total_s != kInfinity;
  if (met_deadline) {
    // The deadline objective decided; the per-batch search is not needed.
  } else if (options.reference) {
    for (int used = 0; used <= num_distributors; ++used) try_used(used);
  } else {
    // The best u balances the server's u copies against each group's
    // |requesters| / u: start near sqrt(|requesters|) and go outwards. Every
    // u is still tried unless its bound (monotone in u) rules it out.
    const int guess = std::min(
        num_distributors,
        static_cast<int>(std::lround(std::sqrt(static_cast<double>(requesters.size())))));
    for (int used = guess; used <= num_distributors; ++used) {
      if (cannot_win(used, 0, best.total_s)) break;
      try_used(used);
    }
    for (int used = guess - 1; used >= 0; --used) try_used(used);
  }
  if (!options.reference && best.total_s != kInfinity) {
    // The search ran without recording; replay the winner on the untouched
    // network (the same fills, so the same plan).
    std::fill(is_used.begin(), is_used.end(), 0);
    for (int j = 0; j < best.used; ++j) is_used[distributors[j]] = 1;
    std::vector<int> rest;
    for (int host : requesters) {
      if (!is_used[host]) rest.push_back(host);
    }
    best = evaluate(best.direct, best.used, rest, kInfinity, true);
  }
  if (best.total_s == kInfinity) {
    return absl::FailedPreconditionError(
        "no distribution reaches every requester: some path has no capacity");
  }
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

std::string DistributionPlanToText(const DistributionPlan& plan) {
  std::string out = absl::StrCat(plan.direct, " ", plan.distributors_used, " ");
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return std::string(buf);
  };
  absl::StrAppend(&out, num(plan.total_s), "\n");
  for (const Transfer& t : plan.transfers) {
    absl::StrAppend(&out, t.src, ">", t.dst, " ", t.bytes, " ", num(t.start_s), " ",
                    num(t.end_s));
    for (const RateSegment& seg : t.segments) {
      absl::StrAppend(&out, " [", num(seg.from_s), ",", num(seg.to_s), ",", num(seg.rate_bps),
                      "]");
    }
    absl::StrAppend(&out, "\n");
  }
  for (const Delivery& d : plan.deliveries) {
    absl::StrAppend(&out, d.host, "@", num(d.at_s), " via ", d.via, "\n");
  }
  return out;
}

}  // namespace mlfabric::core
