#include "scheduler/core/plan_checker.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

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


// Walks a plan once, step by step, collecting the problems it finds in the
// order CheckPlan reports them (the transfers' shape and links, then what
// they add up to, then commits and the replica).
class Checker {
 public:
  Checker(const Batch& batch, const Plan& plan, const CheckOptions& options)
      : batch_(batch), plan_(plan), options_(options), tol_(options.relative_tolerance) {
    for (const UpdateRequest& u : batch.updates) updates_[u.id] = &u;
    // Replica-only updates (punted earlier, re-sent now): sized like updates.
    sized_ = updates_;
    if (batch.replica.has_value()) {
      for (const UpdateRequest& u : batch.replica->pending) sized_[u.id] = &u;
    }
  }

  std::vector<std::string> Run() {
    CheckOrderedOrDropped();
    CheckDeadlines();
    CheckTransfers();
    CheckAggregatorParts();
    CheckDeliveries();
    CheckChainHops();
    CheckLinkLoads();
    CheckCommits();
    CheckReplica();
    return std::move(problems_);
  }

 private:
  void CheckOrderedOrDropped();
  void CheckDeadlines();
  void IndexLinks();
  void CheckTransfers();
  void CheckSegments(const Transfer& t, const std::string& name);
  int64_t ExpectedSize(const Transfer& t, bool hop, const std::string& name);
  int64_t ExpectedAggregateSize(const Transfer& t, const std::string& name);
  void RecordLinkUses(const Transfer& t, const std::string& name);
  void RecordArrival(size_t k, const Transfer& t, bool hop, const std::string& name);
  void CheckAggregatorParts();
  void CheckDeliveries();
  void CheckChainHops();
  void CheckLinkLoads();
  void CheckLinkLoad(const std::string& link, const std::vector<Use>& list,
                     const Capacity& capacity);
  void CheckCommits();
  void CheckReplica();
  void CheckReplicaCommits(const std::vector<std::string>& stream);
  void CheckDivergence(const std::vector<double>& norms);

  const Batch& batch_;
  const Plan& plan_;
  const CheckOptions& options_;
  const double tol_;
  std::vector<std::string> problems_;
  std::unordered_map<std::string, const UpdateRequest*> updates_;
  std::unordered_map<std::string, const UpdateRequest*> sized_;
  std::unordered_map<std::string, int> position_;
  std::map<std::string, Capacity> capacity_;
  std::map<std::pair<std::string, std::string>, std::vector<std::string>> fixed_;
  std::map<std::string, std::vector<Use>> uses_;
  std::unordered_map<std::string, double> arrival_;  // update id -> at the server
  std::set<std::pair<std::string, std::string>> to_aggregator_;  // (update, aggregator host)
  std::vector<size_t> chain_hops_;                       // aggregates that feed another
  std::map<std::string, size_t> aggregate_names_;        // "agg:<n>" -> index
  std::set<std::string> server_hosts_;
  // (update, aggregator) -> sizes of the update's transfers to it: one per part.
  std::map<std::pair<std::string, std::string>, std::vector<int64_t>> to_aggregator_sizes_;
  // (update, host) -> parts delivered there, directly or in an aggregate.
  std::map<std::pair<std::string, std::string>, int> deliveries_;
};

// Every input update exactly once in order or dropped.
void Checker::CheckOrderedOrDropped() {
  std::map<std::string, int> seen;
  for (const std::string& id : plan_.order) ++seen[id];
  for (const Drop& d : plan_.dropped) ++seen[d.id];
  for (const UpdateRequest& u : batch_.updates) {
    if (seen[u.id] != 1) {
      problems_.push_back(absl::StrCat(u.id, ": appears ", seen[u.id], " times in order+dropped"));
    }
  }
  for (const auto& [id, count] : seen) {
    if (!updates_.count(id)) problems_.push_back(absl::StrCat(id, ": not an input update"));
  }
  for (size_t i = 0; i < plan_.order.size(); ++i) position_[plan_.order[i]] = static_cast<int>(i);
}

void Checker::CheckDeadlines() {
  if (!options_.check_deadlines || batch_.mode != Mode::kAsync) return;
  for (size_t i = 0; i < plan_.order.size(); ++i) {
    auto it = updates_.find(plan_.order[i]);
    if (it == updates_.end()) continue;
    const int64_t deadline = it->second->version + batch_.tau_max - batch_.v_init;
    if (static_cast<int64_t>(i + 1) > deadline) {
      problems_.push_back(absl::StrCat(plan_.order[i], ": position ", i + 1,
                                       " is past its deadline ", deadline));
    }
  }
}

// The links' capacities, the fixed paths and the hosts that hold a server's part.
void Checker::IndexLinks() {
  for (const HostLink& h : batch_.hosts) {
    capacity_["up:" + h.name] = {h.uplink_bps, h.uplink_profile};
    capacity_["down:" + h.name] = {h.downlink_bps, h.downlink_profile};
  }
  for (const TopologyLink& l : batch_.links) capacity_["link:" + l.name] = {l.bps, l.profile};
  for (const FixedPath& p : batch_.paths) fixed_[{p.src, p.dst}] = p.links;
  server_hosts_ = {batch_.server};
  for (const UpdateRequest& u : batch_.updates) {
    for (const ShardPart& s : u.shards) server_hosts_.insert(s.server);
  }
}

// Transfers: shape, bytes, link usage, arrivals at the server.
void Checker::CheckTransfers() {
  IndexLinks();
  for (size_t k = 0; k < plan_.transfers.size(); ++k) {
    const Transfer& t = plan_.transfers[k];
    const std::string name = absl::StrCat("transfers[", k, "] (", t.update, " ", t.src, "->",
                                          t.dst, ")");
    CheckSegments(t, name);
    // A hop of a streaming chain ends at the next aggregator; the last one
    // (and every Alg. 3 aggregate) at a server.
    const bool hop = t.kind == TransferKind::kAggregate &&
                     (!t.into.empty() || !server_hosts_.count(t.dst));
    const int64_t expected = ExpectedSize(t, hop, name);
    if (expected != t.bytes) {
      problems_.push_back(absl::StrCat(name, ": size ", t.bytes, ", expected ", expected));
    }
    if (t.kind == TransferKind::kDirect) {
      ++deliveries_[{t.update, t.dst}];
    } else if (t.kind == TransferKind::kAggregate && !hop) {
      for (const std::string& id : t.constituents) ++deliveries_[{id, t.dst}];
    }
    RecordLinkUses(t, name);
    RecordArrival(k, t, hop, name);
  }
}

// Times within the transfer, segments in order, and the bytes they move.
void Checker::CheckSegments(const Transfer& t, const std::string& name) {
  if (t.start_s < batch_.now_s - 1e-12) problems_.push_back(name + ": starts before now_s");
  if (t.end_s < t.start_s) problems_.push_back(name + ": ends before it starts");
  double bits = 0;
  double previous_end = t.start_s;
  for (const RateSegment& s : t.segments) {
    if (s.from_s < previous_end - 1e-12 || s.to_s < s.from_s || s.rate_bps <= 0 ||
        s.to_s > t.end_s + 1e-12) {
      problems_.push_back(name + ": segments out of order or outside [start_s, end_s]");
      break;
    }
    previous_end = s.to_s;
    bits += s.rate_bps * (s.to_s - s.from_s);
  }
  if (std::abs(bits / 8.0 - static_cast<double>(t.bytes)) >
      tol_ * static_cast<double>(t.bytes) + 1.0) {
    problems_.push_back(absl::StrCat(name, ": moves ", bits / 8.0, " bytes, size ", t.bytes));
  }
}

// The size the transfer should have.
int64_t Checker::ExpectedSize(const Transfer& t, bool hop, const std::string& name) {
  int64_t expected = -1;
  if (t.kind == TransferKind::kAggregate && !hop) {
    expected = ExpectedAggregateSize(t, name);
  } else if (t.kind == TransferKind::kAggregate || t.kind == TransferKind::kReplicaAggregate) {
    expected = 0;
    for (const std::string& id : t.constituents) {
      auto it = sized_.find(id);
      if (it != sized_.end()) expected = std::max(expected, it->second->bytes);
    }
  } else if (t.kind == TransferKind::kToAggregator) {
    // Checked per (update, aggregator) later: one transfer per part.
    to_aggregator_sizes_[{t.update, t.dst}].push_back(t.bytes);
    expected = t.bytes;
  } else if (auto it = sized_.find(t.update); it != sized_.end()) {
    expected = it->second->bytes;
    if (t.kind == TransferKind::kDirect) {
      const std::vector<int64_t> sizes = PartSizesTo(*it->second, t.dst, batch_.server);
      if (!sizes.empty()) expected = sizes.front();
      if (std::count(sizes.begin(), sizes.end(), t.bytes) > 0) expected = t.bytes;
    }
  }
  return expected;
}

// An aggregate to a server: the largest of the constituents' parts for this
// host (when an update has two parts for one host, either may be the one).
int64_t Checker::ExpectedAggregateSize(const Transfer& t, const std::string& name) {
  bool fits = !t.constituents.empty();
  bool attained = false;
  int64_t expected = 0;
  for (const std::string& id : t.constituents) {
    auto it = updates_.find(id);
    if (it == updates_.end()) continue;
    const std::vector<int64_t> sizes = PartSizesTo(*it->second, t.dst, batch_.server);
    if (sizes.empty()) {
      problems_.push_back(absl::StrCat(name, ": constituent ", id, " has no part for ", t.dst));
      continue;
    }
    fits = fits && *std::min_element(sizes.begin(), sizes.end()) <= t.bytes;
    attained = attained || std::count(sizes.begin(), sizes.end(), t.bytes) > 0;
    expected = std::max(expected, *std::max_element(sizes.begin(), sizes.end()));
  }
  if (fits && attained) expected = t.bytes;
  return expected;
}

void Checker::RecordLinkUses(const Transfer& t, const std::string& name) {
  // A same-host transfer crosses no link (network.h, docs/architecture.md §5).
  std::vector<std::string> links;
  if (auto it = fixed_.find({t.src, t.dst}); it != fixed_.end()) {
    links.push_back("up:" + t.src);
    for (const std::string& l : it->second) links.push_back("link:" + l);
    links.push_back("down:" + t.dst);
  } else if (t.src != t.dst) {
    links = {"up:" + t.src, "down:" + t.dst};
  }
  for (const std::string& l : links) {
    for (const RateSegment& s : t.segments) {
      uses_[l].push_back({s.from_s, s.to_s, s.rate_bps, name});
    }
  }
}

// When each update arrives at the server, which reached which aggregator,
// and (aggregates) whether their constituents got there in order.
void Checker::RecordArrival(size_t k, const Transfer& t, bool hop, const std::string& name) {
  if (t.kind == TransferKind::kDirect && t.dst == batch_.server) {
    arrival_[t.update] = std::max(arrival_[t.update], t.end_s);
  } else if (t.kind == TransferKind::kDirect && server_hosts_.count(t.dst)) {
    arrival_[t.update] = std::max(arrival_[t.update], t.end_s);
  } else if (t.kind == TransferKind::kToAggregator) {
    to_aggregator_.insert({t.update, t.dst});
  } else if (t.kind == TransferKind::kAggregate) {
    if (hop) chain_hops_.push_back(k);
    aggregate_names_[t.update] = k;
    int last = -2;
    for (const std::string& id : t.constituents) {
      auto p = position_.find(id);
      if (p == position_.end()) {
        problems_.push_back(name + ": constituent " + id + " is not in order");
        continue;
      }
      if (!hop && last != -2 && p->second != last + 1) {
        problems_.push_back(name + ": constituents not consecutive in order");
      }
      last = p->second;
      // Reached it by a transfer, a previous hop of its chain, or is
      // this host's own update.
      auto own = sized_.find(id);
      const bool local = own != sized_.end() && own->second->worker == t.src;
      if (!local && !to_aggregator_.count({id, t.src})) {
        problems_.push_back(name + ": " + id + " never reached aggregator " + t.src);
      }
      if (hop) {
        to_aggregator_.insert({id, t.dst});
      } else {
        arrival_[id] = std::max(arrival_[id], t.end_s);
      }
    }
  }
}

void Checker::CheckAggregatorParts() {
  for (const auto& [key, sizes] : to_aggregator_sizes_) {
    auto it = updates_.find(key.first);
    if (it == updates_.end()) {
      problems_.push_back(absl::StrCat(key.first, ": sent to aggregator ", key.second,
                                       " but not an input update"));
      continue;
    }
    std::vector<int64_t> got = sizes, parts = PartSizes(*it->second);
    std::sort(got.begin(), got.end());
    std::sort(parts.begin(), parts.end());
    if (got != parts) {
      problems_.push_back(absl::StrCat(key.first, ": ", got.size(), " transfers to aggregator ",
                                       key.second, " do not carry its ", parts.size(),
                                       " parts one each"));
    }
  }
}

// Every part of every ordered update reaches its host exactly once (a
// dropped update's none).
void Checker::CheckDeliveries() {
  std::set<std::string> ordered(plan_.order.begin(), plan_.order.end());
  for (const UpdateRequest& u : batch_.updates) {
    std::map<std::string, int> expected;
    if (ordered.count(u.id)) {
      ++expected[batch_.server];
      for (const ShardPart& s : u.shards) ++expected[s.server];
    }
    for (auto it = deliveries_.lower_bound({u.id, std::string()});
         it != deliveries_.end() && it->first.first == u.id; ++it) {
      expected.emplace(it->first.second, 0);
    }
    for (const auto& [host, parts] : expected) {
      auto it = deliveries_.find({u.id, host});
      const int delivered = it == deliveries_.end() ? 0 : it->second;
      if (delivered != parts) {
        problems_.push_back(absl::StrCat(u.id, ": ", delivered, " of its parts delivered to ",
                                         host, ", expected ", parts));
      }
    }
  }
}

void Checker::CheckChainHops() {
  for (size_t k : chain_hops_) {
    const Transfer& t = plan_.transfers[k];
    auto next = aggregate_names_.find(t.into);
    if (t.into.empty() || next == aggregate_names_.end() || next->second < k ||
        plan_.transfers[next->second].src != t.dst) {
      problems_.push_back(absl::StrCat("transfers[", k, "] (", t.update, "): feeds '", t.into,
                                       "', which is no later aggregate at ", t.dst));
    }
  }
}

void Checker::CheckLinkLoads() {
  for (auto& [link, list] : uses_) {
    auto cap = capacity_.find(link);
    if (cap == capacity_.end()) {
      problems_.push_back("unknown link " + link);
      continue;
    }
    CheckLinkLoad(link, list, cap->second);
  }
}

// The first time the link's reservations exceed what it has, if any.
void Checker::CheckLinkLoad(const std::string& link, const std::vector<Use>& list,
                            const Capacity& capacity) {
  std::vector<double> times;
  for (const Use& u : list) {
    times.push_back(u.from);
    times.push_back(u.to);
  }
  for (const auto& [from, r] : capacity.profile) times.push_back(from);
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
    const double available = capacity.At(times[i]);
    if (load > available + tol_ * std::max(available, 1.0) + 1.0) {
      problems_.push_back(absl::StrCat(link, ": reserved ", load, " bps > available ",
                                       available, " at t=", times[i]));
      break;
    }
  }
}

void Checker::CheckCommits() {
  if (plan_.commits.size() != plan_.order.size()) {
    problems_.push_back(absl::StrCat("commits: ", plan_.commits.size(), " entries for ",
                                     plan_.order.size(), " ordered updates"));
    return;
  }
  double previous = -1e300;
  for (size_t i = 0; i < plan_.commits.size(); ++i) {
    const Commit& c = plan_.commits[i];
    if (c.update != plan_.order[i] || c.position != static_cast<int>(i + 1)) {
      problems_.push_back(absl::StrCat("commits[", i, "]: does not match order position ", i + 1));
    }
    if (c.at_s < previous) problems_.push_back(absl::StrCat("commits[", i, "]: time goes back"));
    previous = c.at_s;
    auto a = arrival_.find(c.update);
    if (a == arrival_.end()) {
      problems_.push_back(
          absl::StrCat("commits[", i, "]: ", c.update, " never reaches the server"));
    } else if (c.at_s < a->second - 1e-9) {
      problems_.push_back(absl::StrCat("commits[", i, "]: ", c.update, " commits at ", c.at_s,
                                       " before it arrives at ", a->second));
    }
  }
}

// (With nothing committed the server is where the batch found it: a lead
// that already broke the bound is not this plan's doing.)
// The replica's stream is pending ++ order (replication.h).
void Checker::CheckReplica() {
  if (!options_.check_replica || !batch_.replica.has_value() ||
      (plan_.commits.empty() && batch_.replica->pending.empty())) {
    return;
  }
  const ReplicaSpec& r = *batch_.replica;
  // The replica's stream: pending (re-sent) updates, then the order.
  std::vector<std::string> stream;
  std::vector<double> norms = r.lead;
  for (const UpdateRequest& u : r.pending) {
    stream.push_back(u.id);
    norms.push_back(u.norm);
  }
  for (const std::string& id : plan_.order) {
    stream.push_back(id);
    norms.push_back(updates_.count(id) ? updates_.at(id)->norm : 0);
  }
  CheckReplicaCommits(stream);
  CheckDivergence(norms);
}

void Checker::CheckReplicaCommits(const std::vector<std::string>& stream) {
  const double t_last = plan_.commits.empty() ? 1e300 : plan_.commits.back().at_s;
  double previous = -1e300;
  for (size_t i = 0; i < plan_.replica_commits.size(); ++i) {
    const Commit& c = plan_.replica_commits[i];
    if (i >= stream.size() || c.update != stream[i] || c.position != static_cast<int>(i + 1)) {
      problems_.push_back(absl::StrCat("replica_commits[", i, "]: not the stream's prefix"));
      break;
    }
    if (c.at_s < previous || c.at_s > t_last + 1e-9) {
      problems_.push_back(absl::StrCat("replica_commits[", i, "]: after T_last or out of order"));
    }
    previous = c.at_s;
  }
  if (plan_.replica_commits.size() + plan_.punted.size() != stream.size()) {
    problems_.push_back("replica: committed + punted != pending + ordered");
  }
}

// H_0 = |h_0|, H_m = gamma H_{m-1} + |u_m|; bound = sum_{m=R+1..S} H_m.
void Checker::CheckDivergence(const std::vector<double>& norms) {
  const ReplicaSpec& r = *batch_.replica;
  const size_t applied =
      plan_.replica_commits.empty() ? 0 : r.lead.size() + plan_.replica_commits.size();
  double h = r.history_norm;
  double bound = 0, before = 0;  // before: what the batch found (no server commit)
  for (size_t m = 1; m <= norms.size(); ++m) {
    h = r.momentum * h + norms[m - 1];
    if (m > applied) bound += h;
    if (m <= r.lead.size() + r.pending.size()) before += h;
  }
  const double allowed = plan_.commits.empty() ? std::max(r.divergence_bound, before)
                                               : r.divergence_bound;
  if (bound > allowed * (1 + 1e-12) + 1e-12) {
    problems_.push_back(absl::StrCat("replica: divergence bound ", bound, " > ",
                                     r.divergence_bound, " at T_last"));
  }
}

}  // namespace

std::vector<std::string> CheckPlan(const Batch& batch, const Plan& plan,
                                   const CheckOptions& options) {
  return Checker(batch, plan, options).Run();
}

}  // namespace mlfabric::core
