#include "scheduler/core/plan_checker.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace mlfabric::core {

namespace {

// Available capacity of one link over time, written independently of the
// planner's network model (same documented semantics).
struct Capacity {
  double constant = 0;
  std::vector<ProfilePoint> profile;

  double At(double t) const {
    if (profile.empty()) return constant;
    double rate = constant > 0 ? constant : profile.front().second;
    for (const auto& [from, r] : profile) {
      if (from <= t) rate = r;
    }
    return rate;
  }
};

struct Use {
  double from, to, rate;
  std::string transfer;
};

// The sizes of `u`'s parts that go to `host` (part 0 to the batch's
// server, part j to shards[j-1].server, §10.2).
std::vector<int64_t> PartSizesTo(const UpdateRequest& u, const std::string& host,
                                 const std::string& server) {
  std::vector<int64_t> sizes;
  if (host == server) sizes.push_back(u.bytes);
  for (const ShardPart& s : u.shards) {
    if (s.server == host) sizes.push_back(s.bytes);
  }
  return sizes;
}

std::vector<int64_t> PartSizes(const UpdateRequest& u) {
  std::vector<int64_t> sizes = {u.bytes};
  for (const ShardPart& s : u.shards) sizes.push_back(s.bytes);
  return sizes;
}

}  // namespace

std::vector<std::string> CheckPlan(const Batch& batch, const Plan& plan,
                                   const CheckOptions& options) {
  std::vector<std::string> problems;
  const double tol = options.relative_tolerance;
  std::unordered_map<std::string, const UpdateRequest*> updates;
  for (const UpdateRequest& u : batch.updates) updates[u.id] = &u;
  // Replica-only updates (punted earlier, re-sent now): sized like updates.
  std::unordered_map<std::string, const UpdateRequest*> sized = updates;
  if (batch.replica.has_value()) {
    for (const UpdateRequest& u : batch.replica->pending) sized[u.id] = &u;
  }

  // Every input update exactly once in order or dropped.
  std::map<std::string, int> seen;
  for (const std::string& id : plan.order) ++seen[id];
  for (const Drop& d : plan.dropped) ++seen[d.id];
  for (const UpdateRequest& u : batch.updates) {
    if (seen[u.id] != 1) {
      problems.push_back(absl::StrCat(u.id, ": appears ", seen[u.id], " times in order+dropped"));
    }
  }
  for (const auto& [id, count] : seen) {
    if (!updates.count(id)) problems.push_back(absl::StrCat(id, ": not an input update"));
  }
  std::unordered_map<std::string, int> position;
  for (size_t i = 0; i < plan.order.size(); ++i) position[plan.order[i]] = static_cast<int>(i);

  // Deadlines.
  if (options.check_deadlines && batch.mode == Mode::kAsync) {
    for (size_t i = 0; i < plan.order.size(); ++i) {
      auto it = updates.find(plan.order[i]);
      if (it == updates.end()) continue;
      const int64_t deadline = it->second->version + batch.tau_max - batch.v_init;
      if (static_cast<int64_t>(i + 1) > deadline) {
        problems.push_back(absl::StrCat(plan.order[i], ": position ", i + 1,
                                        " is past its deadline ", deadline));
      }
    }
  }

  // Transfers: shape, bytes, link usage, arrivals at the server.
  std::map<std::string, Capacity> capacity;
  for (const HostLink& h : batch.hosts) {
    capacity["up:" + h.name] = {h.uplink_bps, h.uplink_profile};
    capacity["down:" + h.name] = {h.downlink_bps, h.downlink_profile};
  }
  for (const TopologyLink& l : batch.links) capacity["link:" + l.name] = {l.bps, l.profile};
  std::map<std::pair<std::string, std::string>, std::vector<std::string>> fixed;
  for (const FixedPath& p : batch.paths) fixed[{p.src, p.dst}] = p.links;
  std::map<std::string, std::vector<Use>> uses;
  std::unordered_map<std::string, double> arrival;  // update id -> at the server
  std::set<std::pair<std::string, std::string>> to_aggregator;  // (update, aggregator host)
  std::vector<size_t> chain_hops;                       // aggregates that feed another
  std::map<std::string, size_t> aggregate_names;        // "agg:<n>" -> index
  std::set<std::string> server_hosts = {batch.server};
  for (const UpdateRequest& u : batch.updates) {
    for (const ShardPart& s : u.shards) server_hosts.insert(s.server);
  }
  // (update, aggregator) -> sizes of the update's transfers to it: one per part.
  std::map<std::pair<std::string, std::string>, std::vector<int64_t>> to_aggregator_sizes;
  // (update, host) -> parts delivered there, directly or in an aggregate.
  std::map<std::pair<std::string, std::string>, int> deliveries;
  for (size_t k = 0; k < plan.transfers.size(); ++k) {
    const Transfer& t = plan.transfers[k];
    const std::string name = absl::StrCat("transfers[", k, "] (", t.update, " ", t.src, "->",
                                          t.dst, ")");
    if (t.start_s < batch.now_s - 1e-12) problems.push_back(name + ": starts before now_s");
    if (t.end_s < t.start_s) problems.push_back(name + ": ends before it starts");
    double bits = 0;
    double previous_end = t.start_s;
    for (const RateSegment& s : t.segments) {
      if (s.from_s < previous_end - 1e-12 || s.to_s < s.from_s || s.rate_bps <= 0 ||
          s.to_s > t.end_s + 1e-12) {
        problems.push_back(name + ": segments out of order or outside [start_s, end_s]");
        break;
      }
      previous_end = s.to_s;
      bits += s.rate_bps * (s.to_s - s.from_s);
    }
    if (std::abs(bits / 8.0 - static_cast<double>(t.bytes)) >
        tol * static_cast<double>(t.bytes) + 1.0) {
      problems.push_back(absl::StrCat(name, ": moves ", bits / 8.0, " bytes, size ", t.bytes));
    }
    // A hop of a streaming chain ends at the next aggregator; the last one
    // (and every Alg. 3 aggregate) at a server.
    const bool hop = t.kind == TransferKind::kAggregate &&
                     (!t.into.empty() || !server_hosts.count(t.dst));
    // The size the transfer should have.
    int64_t expected = -1;
    if (t.kind == TransferKind::kAggregate && !hop) {
      // The largest of the constituents' parts for this host (when an
      // update has two parts for one host, either may be the one).
      bool fits = !t.constituents.empty();
      bool attained = false;
      expected = 0;
      for (const std::string& id : t.constituents) {
        auto it = updates.find(id);
        if (it == updates.end()) continue;
        const std::vector<int64_t> sizes = PartSizesTo(*it->second, t.dst, batch.server);
        if (sizes.empty()) {
          problems.push_back(absl::StrCat(name, ": constituent ", id, " has no part for ", t.dst));
          continue;
        }
        fits = fits && *std::min_element(sizes.begin(), sizes.end()) <= t.bytes;
        attained = attained || std::count(sizes.begin(), sizes.end(), t.bytes) > 0;
        expected = std::max(expected, *std::max_element(sizes.begin(), sizes.end()));
      }
      if (fits && attained) expected = t.bytes;
    } else if (t.kind == TransferKind::kAggregate || t.kind == TransferKind::kReplicaAggregate) {
      expected = 0;
      for (const std::string& id : t.constituents) {
        auto it = sized.find(id);
        if (it != sized.end()) expected = std::max(expected, it->second->bytes);
      }
    } else if (t.kind == TransferKind::kToAggregator) {
      // Checked per (update, aggregator) below: one transfer per part.
      to_aggregator_sizes[{t.update, t.dst}].push_back(t.bytes);
      expected = t.bytes;
    } else if (auto it = sized.find(t.update); it != sized.end()) {
      expected = it->second->bytes;
      if (t.kind == TransferKind::kDirect) {
        const std::vector<int64_t> sizes = PartSizesTo(*it->second, t.dst, batch.server);
        if (!sizes.empty()) expected = sizes.front();
        if (std::count(sizes.begin(), sizes.end(), t.bytes) > 0) expected = t.bytes;
      }
    }
    if (expected != t.bytes) {
      problems.push_back(absl::StrCat(name, ": size ", t.bytes, ", expected ", expected));
    }
    if (t.kind == TransferKind::kDirect) {
      ++deliveries[{t.update, t.dst}];
    } else if (t.kind == TransferKind::kAggregate && !hop) {
      for (const std::string& id : t.constituents) ++deliveries[{id, t.dst}];
    }
    // A same-host transfer crosses no link (network.h, DESIGN.md §5).
    std::vector<std::string> links;
    if (auto it = fixed.find({t.src, t.dst}); it != fixed.end()) {
      links.push_back("up:" + t.src);
      for (const std::string& l : it->second) links.push_back("link:" + l);
      links.push_back("down:" + t.dst);
    } else if (t.src != t.dst) {
      links = {"up:" + t.src, "down:" + t.dst};
    }
    for (const std::string& l : links) {
      for (const RateSegment& s : t.segments) uses[l].push_back({s.from_s, s.to_s, s.rate_bps, name});
    }
    if (t.kind == TransferKind::kDirect && t.dst == batch.server) {
      arrival[t.update] = std::max(arrival[t.update], t.end_s);
    } else if (t.kind == TransferKind::kDirect && server_hosts.count(t.dst)) {
      arrival[t.update] = std::max(arrival[t.update], t.end_s);
    } else if (t.kind == TransferKind::kToAggregator) {
      to_aggregator.insert({t.update, t.dst});
    } else if (t.kind == TransferKind::kAggregate) {
      if (hop) chain_hops.push_back(k);
      aggregate_names[t.update] = k;
      int last = -2;
      for (const std::string& id : t.constituents) {
        auto p = position.find(id);
        if (p == position.end()) {
          problems.push_back(name + ": constituent " + id + " is not in order");
          continue;
        }
        if (!hop && last != -2 && p->second != last + 1) {
          problems.push_back(name + ": constituents not consecutive in order");
        }
        last = p->second;
        // Reached it by a transfer, a previous hop of its chain, or is
        // this host's own update.
        auto own = sized.find(id);
        const bool local = own != sized.end() && own->second->worker == t.src;
        if (!local && !to_aggregator.count({id, t.src})) {
          problems.push_back(name + ": " + id + " never reached aggregator " + t.src);
        }
        if (hop) {
          to_aggregator.insert({id, t.dst});
        } else {
          arrival[id] = std::max(arrival[id], t.end_s);
        }
      }
    }
  }
  for (const auto& [key, sizes] : to_aggregator_sizes) {
    auto it = updates.find(key.first);
    if (it == updates.end()) {
      problems.push_back(absl::StrCat(key.first, ": sent to aggregator ", key.second,
                                      " but not an input update"));
      continue;
    }
    std::vector<int64_t> got = sizes, parts = PartSizes(*it->second);
    std::sort(got.begin(), got.end());
    std::sort(parts.begin(), parts.end());
    if (got != parts) {
      problems.push_back(absl::StrCat(key.first, ": ", got.size(), " transfers to aggregator ",
                                      key.second, " do not carry its ", parts.size(),
                                      " parts one each"));
    }
  }
  // Every part of every ordered update reaches its host exactly once (a
  // dropped update's none).
  std::set<std::string> ordered(plan.order.begin(), plan.order.end());
  for (const UpdateRequest& u : batch.updates) {
    std::map<std::string, int> expected;
    if (ordered.count(u.id)) {
      ++expected[batch.server];
      for (const ShardPart& s : u.shards) ++expected[s.server];
    }
    for (auto it = deliveries.lower_bound({u.id, std::string()});
         it != deliveries.end() && it->first.first == u.id; ++it) {
      expected.emplace(it->first.second, 0);
    }
    for (const auto& [host, parts] : expected) {
      auto it = deliveries.find({u.id, host});
      const int delivered = it == deliveries.end() ? 0 : it->second;
      if (delivered != parts) {
        problems.push_back(absl::StrCat(u.id, ": ", delivered, " of its parts delivered to ",
                                        host, ", expected ", parts));
      }
    }
  }
  for (size_t k : chain_hops) {
    const Transfer& t = plan.transfers[k];
    auto next = aggregate_names.find(t.into);
    if (t.into.empty() || next == aggregate_names.end() || next->second < k ||
        plan.transfers[next->second].src != t.dst) {
      problems.push_back(absl::StrCat("transfers[", k, "] (", t.update, "): feeds '", t.into,
                                      "', which is no later aggregate at ", t.dst));
    }
  }
  for (auto& [link, list] : uses) {
    auto cap = capacity.find(link);
    if (cap == capacity.end()) {
      problems.push_back("unknown link " + link);
      continue;
    }
    std::vector<double> times;
    for (const Use& u : list) {
      times.push_back(u.from);
      times.push_back(u.to);
    }
    for (const auto& [from, r] : cap->second.profile) times.push_back(from);
    std::sort(times.begin(), times.end());
    times.erase(std::unique(times.begin(), times.end()), times.end());
    // Sweep with a sorted event list: load on [times[i], times[i+1]).
    std::vector<std::pair<double, double>> events;
    for (const Use& u : list) {
      events.push_back({u.from, u.rate});
      events.push_back({u.to, -u.rate});
    }
    std::sort(events.begin(), events.end());
    double load = 0;
    size_t e = 0;
    for (size_t i = 0; i + 1 < times.size(); ++i) {
      while (e < events.size() && events[e].first <= times[i]) load += events[e++].second;
      if (times[i + 1] - times[i] <= 1e-12) continue;
      const double available = cap->second.At(times[i]);
      if (load > available + tol * std::max(available, 1.0) + 1.0) {
        problems.push_back(absl::StrCat(link, ": reserved ", load, " bps > available ",
                                        available, " at t=", times[i]));
        break;
      }
    }
  }

  // Commits.
  if (plan.commits.size() != plan.order.size()) {
    problems.push_back(absl::StrCat("commits: ", plan.commits.size(), " entries for ",
                                    plan.order.size(), " ordered updates"));
  } else {
    double previous = -1e300;
    for (size_t i = 0; i < plan.commits.size(); ++i) {
      const Commit& c = plan.commits[i];
      if (c.update != plan.order[i] || c.position != static_cast<int>(i + 1)) {
        problems.push_back(absl::StrCat("commits[", i, "]: does not match order position ", i + 1));
      }
      if (c.at_s < previous) problems.push_back(absl::StrCat("commits[", i, "]: time goes back"));
      previous = c.at_s;
      auto a = arrival.find(c.update);
      if (a == arrival.end()) {
        problems.push_back(absl::StrCat("commits[", i, "]: ", c.update, " never reaches the server"));
      } else if (c.at_s < a->second - 1e-9) {
        problems.push_back(absl::StrCat("commits[", i, "]: ", c.update, " commits at ", c.at_s,
                                        " before it arrives at ", a->second));
      }
    }
  }

  // Replica.
  // (With nothing committed the server is where the batch found it: a lead
  // that already broke the bound is not this plan's doing.)
  // The replica's stream is pending ++ order (replication.h).
  if (options.check_replica && batch.replica.has_value() &&
      (!plan.commits.empty() || !batch.replica->pending.empty())) {
    const ReplicaSpec& r = *batch.replica;
    // The replica's stream: pending (re-sent) updates, then the order.
    std::vector<std::string> stream;
    std::vector<double> norms = r.lead;
    for (const UpdateRequest& u : r.pending) {
      stream.push_back(u.id);
      norms.push_back(u.norm);
    }
    for (const std::string& id : plan.order) {
      stream.push_back(id);
      norms.push_back(updates.count(id) ? updates.at(id)->norm : 0);
    }
    const double t_last = plan.commits.empty() ? 1e300 : plan.commits.back().at_s;
    double previous = -1e300;
    for (size_t i = 0; i < plan.replica_commits.size(); ++i) {
      const Commit& c = plan.replica_commits[i];
      if (i >= stream.size() || c.update != stream[i] || c.position != static_cast<int>(i + 1)) {
        problems.push_back(absl::StrCat("replica_commits[", i, "]: not the stream's prefix"));
        break;
      }
      if (c.at_s < previous || c.at_s > t_last + 1e-9) {
        problems.push_back(absl::StrCat("replica_commits[", i, "]: after T_last or out of order"));
      }
      previous = c.at_s;
    }
    if (plan.replica_commits.size() + plan.punted.size() != stream.size()) {
      problems.push_back("replica: committed + punted != pending + ordered");
    }
    // H_0 = |h_0|, H_m = gamma H_{m-1} + |u_m|; bound = sum_{m=R+1..S} H_m.
    const size_t applied =
        plan.replica_commits.empty() ? 0 : r.lead.size() + plan.replica_commits.size();
    double h = r.history_norm;
    double bound = 0, before = 0;  // before: what the batch found (no server commit)
    for (size_t m = 1; m <= norms.size(); ++m) {
      h = r.momentum * h + norms[m - 1];
      if (m > applied) bound += h;
      if (m <= r.lead.size() + r.pending.size()) before += h;
    }
    const double allowed = plan.commits.empty() ? std::max(r.divergence_bound, before)
                                                : r.divergence_bound;
    if (bound > allowed * (1 + 1e-12) + 1e-12) {
      problems.push_back(absl::StrCat("replica: divergence bound ", bound, " > ",
                                      r.divergence_bound, " at T_last"));
    }
  }
  return problems;
}

}  // namespace mlfabric::core
