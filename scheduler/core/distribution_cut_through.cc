// PlanCutThroughDistribution (distribution.h): the §10.3 tree planned for
// daemons that forward each packet as it arrives, on the residual rates
// of the hosts' links; and what both planners share (the request's batch,
// a plan's text form). The store-and-forward search is distribution.cc.
#include "scheduler/core/distribution.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/core/network.h"
#include "scheduler/core/planner.h"

namespace mlfabric::core {

absl::StatusOr<Batch> DistributionBatch(const DistributionRequest& request) {
  Batch batch;
  batch.now_s = request.now_s;
  batch.server = request.server;
  batch.hosts = request.hosts;
  RETURN_IF_ERROR(ValidateBatch(batch));
  return batch;
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

namespace {

// The mean rate at which `bits` leave (or arrive) from `now_s` on a link
// whose residual after reservations is `profile` (piecewise constant: the
// capacity before its first point, its last point's rate after it): what a
// stream started now gets. The rate at `now_s` alone would call a link that
// is fully reserved for a moment (an aggregator receiving its constituents)
// unusable for good; the load generator (testing/loadgen) found plans whose
// total time was infinite that way. 0 only if the profile ends at 0 first.
double MeanRate(const std::vector<ProfilePoint>& profile, double capacity_bps, double now_s,
                double bits) {
  double rate = capacity_bps;
  size_t next = 0;
  for (; next < profile.size() && profile[next].first <= now_s; ++next) {
    rate = profile[next].second;
  }
  double t = now_s, left = bits;
  while (true) {
    const double until = next < profile.size() ? profile[next].first : kInfinity;
    if (rate > 0) {
      const double can = (until - t) * rate;
      if (can >= left) return bits / (t + left / rate - now_s);
      left -= can;
    }
    if (next >= profile.size()) return 0;
    t = until;
    rate = profile[next++].second;
  }
}

absl::Status CheckCutThroughOptions(const DistributionRequest& request,
                                   const CutThroughOptions& options) {
  if (request.model_bytes <= 0) {
    return absl::InvalidArgumentError("model_bytes: must be a positive integer");
  }
  if (options.max_fanout < 1) {
    return absl::InvalidArgumentError("max_fanout: must be at least 1");
  }
  if (options.packet_bytes < 1) {
    return absl::InvalidArgumentError("packet_bytes: must be positive");
  }
  if (!(options.hop_s >= 0)) return absl::InvalidArgumentError("hop_s: must be >= 0");
  if (!(options.min_saving >= 0 && options.min_saving < 1)) {
    return absl::InvalidArgumentError("min_saving: must be in [0, 1)");
  }
  return absl::OkStatus();
}

// The rates a stream of the model gets on the request's hosts' links.
class LinkRates {
 public:
  explicit LinkRates(const DistributionRequest& request)
      : now_s_(request.now_s), bits_(8.0 * static_cast<double>(request.model_bytes)) {
    for (const HostLink& h : request.hosts) links_[h.name] = &h;
  }

  bool Has(const std::string& name) const { return links_.count(name) > 0; }

  // Each of `copies` streams' rate when a host's uplink sends them together.
  double Up(const std::string& name, size_t copies = 1) const {
    const HostLink& h = *links_.at(name);
    const double n = static_cast<double>(std::max<size_t>(copies, 1));
    return MeanRate(h.uplink_profile, h.uplink_bps, now_s_, n * bits_) / n;
  }

  // A host's downlink's rate for one copy.
  double Down(const std::string& name) const {
    const HostLink& h = *links_.at(name);
    return MeanRate(h.downlink_profile, h.downlink_bps, now_s_, bits_);
  }

 private:
  double now_s_;
  double bits_;
  std::map<std::string, const HostLink*> links_;
};

// The server and every requester are hosts; no requester is the server or
// asks twice.
absl::Status CheckRequesters(const DistributionRequest& request, const LinkRates& rates) {
  if (!rates.Has(request.server)) {
    return absl::InvalidArgumentError(absl::StrCat("server: '", request.server, "' is not in hosts"));
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < request.requesters.size(); ++i) {
    const std::string& name = request.requesters[i];
    if (!rates.Has(name)) {
      return absl::InvalidArgumentError(absl::StrCat("requesters[", i, "]: '", name,
                                                     "' is not in hosts"));
    }
    if (name == request.server) {
      return absl::InvalidArgumentError(absl::StrCat("requesters[", i, "]: the server itself"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("requesters[", i, "]: duplicate '", name, "'"));
    }
  }
  return absl::OkStatus();
}

// The F-ary tree over the requesters in `order` (fastest uplinks first):
// each one's stream rate, depth and arrival, and the plan's total.
DistributionPlan PlanTree(const DistributionRequest& request, const CutThroughOptions& options,
                          const LinkRates& rates, const std::vector<size_t>& order,
                          size_t fanout) {
  const double bits = 8.0 * static_cast<double>(request.model_bytes);
  const double packet_bits =
      8.0 * static_cast<double>(std::min<int64_t>(options.packet_bytes, request.model_bytes));
  const size_t n = order.size();
  auto parent = [&](size_t k) -> long {
    return k < fanout ? -1 : static_cast<long>((k - fanout) / fanout);
  };
  auto children = [&](long node) -> size_t {  // node -1 = the server
    const size_t first = node < 0 ? 0 : fanout + static_cast<size_t>(node) * fanout;
    return first >= n ? 0 : std::min(fanout, n - first);
  };
  std::vector<double> rate(n), at(n);
  std::vector<int> depth(n);
  DistributionPlan plan;
  plan.deliveries.resize(n);
  for (size_t k = 0; k < n; ++k) {  // parents come first
    const std::string& host = request.requesters[order[k]];
    const long p = parent(k);
    const std::string& from =
        p < 0 ? request.server : request.requesters[order[static_cast<size_t>(p)]];
    double r = std::min(rates.Up(from, children(p)), rates.Down(host));
    int d = 1;
    if (p >= 0) {
      r = std::min(r, rate[static_cast<size_t>(p)]);
      d = depth[static_cast<size_t>(p)] + 1;
    }
    rate[k] = r;
    depth[k] = d;
    at[k] = r > 0 ? request.now_s + bits / r + (d - 1) * (packet_bits / r + options.hop_s)
                  : kInfinity;
    plan.deliveries[order[k]] = {host, at[k], from, r, rates.Up(host),
                                 static_cast<int>(children(static_cast<long>(k)))};
    plan.total_s = std::max(plan.total_s, at[k]);
    if (p < 0) plan.copy_bps = plan.copy_bps > 0 ? std::min(plan.copy_bps, r) : r;
  }
  plan.direct = static_cast<int>(children(-1));
  plan.distributors_used = 0;  // every copy past the server's is forwarded by a requester
  return plan;
}

}  // namespace

absl::StatusOr<DistributionPlan> PlanCutThroughDistribution(const DistributionRequest& request,
                                                            const CutThroughOptions& options) {
  RETURN_IF_ERROR(CheckCutThroughOptions(request, options));
  ASSIGN_OR_RETURN(Batch batch, DistributionBatch(request));
  const LinkRates rates(request);
  RETURN_IF_ERROR(CheckRequesters(request, rates));
  // Fastest uplinks first (they become the inner nodes); ties keep request order.
  std::vector<size_t> order(request.requesters.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return rates.Up(request.requesters[a]) > rates.Up(request.requesters[b]);
  });
  const size_t n = order.size();
  DistributionPlan best;
  best.total_s = n == 0 ? request.now_s : kInfinity;
  // The star first (every copy from the server), then F = 1 .. max_fanout:
  // a tree must end min_saving of the star's time sooner to be taken (the
  // server's copies are the better way where the requesters' links are
  // what limits the batch, N3).
  std::vector<size_t> fanouts = {std::max<size_t>(n, 1)};
  for (size_t f = 1; f <= static_cast<size_t>(options.max_fanout) && f < n; ++f) {
    fanouts.push_back(f);
  }
  double star_s = 0;
  for (const size_t fanout : fanouts) {
    DistributionPlan plan = PlanTree(request, options, rates, order, fanout);
    if (fanout == fanouts.front()) {  // the star
      star_s = plan.total_s - request.now_s;
      const double share = rates.Up(request.server, n);
      const bool bound = n > 0 && plan.copy_bps >= (1 - options.min_saving) * share;
      best = std::move(plan);
      best.server_bound = bound;
    } else if (plan.total_s < best.total_s &&
               plan.total_s - request.now_s <= (1 - options.min_saving) * star_s) {
      plan.server_bound = best.server_bound;
      best = std::move(plan);
    }
  }
  return best;
}

}  // namespace mlfabric::core
