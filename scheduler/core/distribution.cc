#include "scheduler/core/distribution.h"

// Cost: O(k° x |requesters|) cases, each O(|requesters|) fills; cases share
// one network and undo their reservations through its journal.

#include <algorithm>
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

absl::StatusOr<DistributionPlan> PlanModelDistribution(const DistributionRequest& request) {
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
  auto position_of = [&](int host) {
    return static_cast<int>(std::find(requesters.begin(), requesters.end(), host) -
                            requesters.begin());
  };

  // One network for every case; each case's reservations are undone.
  Network state = net;
  state.BeginJournal();
  auto evaluate = [&](int n, int used, const std::vector<int>& rest) {
    Candidate c;
    c.direct = n;
    c.used = used;
    auto send = [&](int src, int dst, double t0) {
      const Path path = state.PathBetween(src, dst);
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
      server_done = std::max(server_done, received[j]);
    }
    std::vector<std::pair<int, double>> delivered;
    std::vector<int> via;
    for (int i = 0; i < n; ++i) {
      const double at = send(server, rest[i], request.now_s);
      if (at == kInfinity) return c;
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
        delivered.push_back({position_of(host), received[j]});
        via.push_back(server);
      }
      const int first = idx;
      while (idx < static_cast<int>(rest.size())) {
        const Path path = state.PathBetween(host, rest[idx]);
        const double end = state.FillEnd(path, received[j], bits);
        if (end == kInfinity && last) return c;
        if (!last && end > server_done) break;
        send(host, rest[idx], received[j]);
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

  Candidate best;
  for (int used = 0; used <= static_cast<int>(distributors.size()); ++used) {
    std::vector<int> rest;
    for (int host : requesters) {
      if (std::find(distributors.begin(), distributors.begin() + used, host) ==
          distributors.begin() + used) {
        rest.push_back(host);
      }
    }
    const int max_n = static_cast<int>(rest.size());
    for (int n = used == 0 ? max_n : 0; n <= max_n; ++n) {
      const size_t mark = state.JournalMark();
      Candidate c = evaluate(n, used, rest);
      state.RollbackTo(mark);
      if (c.total_s == kInfinity) continue;
      if (std::make_tuple(c.total_s, -c.direct, c.used) <
          std::make_tuple(best.total_s, -best.direct, best.used)) {
        best = std::move(c);
      }
    }
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

}  // namespace mlfabric::core
