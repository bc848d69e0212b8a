#include "scheduler/core/distribution.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <catch2/catch.hpp>

#include "common/sanitized_build.h"
#include "scheduler/core/network.h"

namespace mlfabric::core {
namespace {

// Under tools/test's sanitized builds the exhaustive reference runs many
// times slower than optimised: at -O0, with libFuzzer's coverage
// instrumentation in the asan build, 300 random batches took 287 s against
// a 300 s timeout. The asan build now compiles scheduler/core at -O1
// (.bazelrc), where 100 take about 20 s. A third of them still drives every
// path of both searches under the sanitizers; the optimised build runs all.
constexpr uint64_t kRandomBatches = kSanitizedBuild ? 100 : 300;

DistributionRequest Request(double server_uplink_bps, int distributors) {
  DistributionRequest r;
  r.server = "s";
  r.model_bytes = 125000000;  // 1 Gbit
  r.hosts.push_back({"s", server_uplink_bps, 1e10, {}, {}});
  for (int i = 0; i < 8; ++i) {
    const std::string w = "w" + std::to_string(i);
    r.hosts.push_back({w, 1e10, 1e10, {}, {}});
    r.requesters.push_back(w);
  }
  for (int d = 0; d < distributors; ++d) {
    const std::string name = "d" + std::to_string(d);
    r.hosts.push_back({name, 1e10, 1e10, {}, {}});
    r.distributors.push_back(name);
  }
  return r;
}

TEST_CASE("Without distributors the server's uplink sends every copy") {
  auto plan = PlanModelDistribution(Request(1e10, 0));
  REQUIRE(plan.ok());
  CHECK(plan->direct == 8);
  CHECK(plan->total_s == Approx(0.8));
  CHECK(plan->transfers.size() == 8);
}

TEST_CASE("A distribution tree relieves the server's uplink (§10.3)") {
  auto plan = PlanModelDistribution(Request(1e10, 2));
  REQUIRE(plan.ok());
  CHECK(plan->total_s < 0.8 - 1e-9);
  CHECK(plan->distributors_used >= 1);
  REQUIRE(plan->deliveries.size() == 8);
  int via_distributor = 0;
  for (const Delivery& d : plan->deliveries) {
    CHECK(d.at_s <= plan->total_s + 1e-12);
    via_distributor += d.via != "s";
  }
  CHECK(via_distributor > 0);
  // The server serves distributors first, the k°-th first ("then backwards").
  CHECK(plan->transfers[0].src == "s");
  CHECK(plan->transfers[0].dst.rfind("d", 0) == 0);
  // No host's uplink carries two transfers at once beyond its capacity.
  for (const Transfer& t : plan->transfers) {
    CHECK(SegmentBits(t.segments) == Approx(1e9));
    for (const RateSegment& s : t.segments) CHECK(s.rate_bps <= 1e10 + 1);
  }
}

TEST_CASE("Distribution is deterministic and errors name the field") {
  auto a = PlanModelDistribution(Request(5e9, 3));
  auto b = PlanModelDistribution(Request(5e9, 3));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->total_s == b->total_s);
  DistributionRequest bad = Request(1e10, 1);
  bad.requesters.push_back("ghost");
  auto plan = PlanModelDistribution(bad);
  REQUIRE_FALSE(plan.ok());
  CHECK(std::string(plan.status().message()).find("requesters[8]") == 0);
}

// Sum of reserved rates per link never exceeds its capacity (constant
// capacities here), every requester is served once, after its transfer ends.
TEST_CASE("Random distribution plans respect capacities and reach everyone") {
  uint64_t state = 99;
  auto next = [&]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  const double rates[] = {1e9, 2.5e9, 5e9, 1e10};
  for (int round = 0; round < 40; ++round) {
    INFO("round " << round);
    DistributionRequest r;
    r.server = "s";
    r.model_bytes = 1000000 + next() % 100000000;
    r.seed = round;
    r.hosts.push_back({"s", rates[next() % 4], 1e10, {}, {}});
    const int workers = 1 + next() % 12;
    for (int i = 0; i < workers; ++i) {
      const std::string w = "w" + std::to_string(i);
      r.hosts.push_back({w, rates[next() % 4], rates[next() % 4], {}, {}});
      r.requesters.push_back(w);
    }
    const int distributors = next() % 4;
    for (int d = 0; d < distributors; ++d) {
      // Sometimes a requester doubles as a distributor.
      r.distributors.push_back(next() % 2 ? "w" + std::to_string(next() % workers)
                                          : "d" + std::to_string(d));
      if (r.distributors.back()[0] == 'd') r.hosts.push_back({r.distributors.back(), 1e10, 1e10, {}, {}});
    }
    // The per-batch plan, then the deadline objective at 1.3x its total.
    auto per_batch = PlanModelDistribution(r);
    REQUIRE(per_batch.ok());
    DistributionOptions frugal;
    frugal.deadline_s = r.now_s + 1.3 * (per_batch->total_s - r.now_s);
    for (const bool spare : {false, true}) {
      INFO("deadline objective " << spare);
      auto plan = spare ? PlanModelDistribution(r, frugal) : per_batch;
      REQUIRE(plan.ok());
      REQUIRE(plan->deliveries.size() == r.requesters.size());
      if (spare) {
        CHECK(plan->total_s <= frugal.deadline_s);
        CHECK(plan->direct + plan->distributors_used <=
              per_batch->direct + per_batch->distributors_used);
      }
      std::map<std::string, double> up, down;
      for (const HostLink& h : r.hosts) {
        up[h.name] = h.uplink_bps;
        down[h.name] = h.downlink_bps;
      }
      std::map<std::string, double> received;  // host -> when the model arrived
      received["s"] = 0;
      for (const Transfer& t : plan->transfers) {
        CHECK(SegmentBits(t.segments) == Approx(8.0 * r.model_bytes));
        // A host forwards only what it already has.
        REQUIRE(received.count(t.src));
        CHECK(t.start_s >= received[t.src] - 1e-12);
        received[t.dst] = t.end_s;
      }
      for (size_t i = 0; i < r.requesters.size(); ++i) {
        CHECK(plan->deliveries[i].host == r.requesters[i]);
        CHECK(plan->deliveries[i].at_s == Approx(received.at(r.requesters[i])));
      }
      // Capacity: sweep every link.
      for (const auto* side : {&up, &down}) {
        for (const auto& [host, capacity] : *side) {
          std::vector<std::pair<double, double>> events;
          for (const Transfer& t : plan->transfers) {
            if ((side == &up ? t.src : t.dst) != host) continue;
            for (const RateSegment& s : t.segments) {
              events.push_back({s.from_s, s.rate_bps});
              events.push_back({s.to_s, -s.rate_bps});
            }
          }
          std::sort(events.begin(), events.end());
          double load = 0;
          for (const auto& [time, delta] : events) {
            load += delta;
            CHECK(load <= capacity * (1 + 1e-9) + 1);
          }
        }
      }
    }
  }
}

// The pruned search must give exactly the exhaustive search's plan: same
// (n, u), every transfer segment and delivery bit for bit. Batches up to 60
// requesters and 30 distributors (co-hosted or not, some NICs with profiles)
// so the pruning has many cases to skip.
TEST_CASE("Pruned distribution search gives the exhaustive search's plan") {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    INFO("seed " << seed);
    uint64_t state = seed;
    auto next = [&]() {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return state >> 33;
    };
    const double rates[] = {1e9, 2.5e9, 3.3e9, 5e9, 1e10, 1e10, 1e10};
    DistributionRequest r;
    r.server = "s";
    r.now_s = 0.5;
    r.model_bytes = 1000000 + next() % 100000000;
    r.seed = seed;
    r.hosts.push_back({"s", rates[next() % 7], 1e10, {}, {}});
    const int workers = 1 + next() % 60;
    for (int i = 0; i < workers; ++i) {
      const std::string w = "w" + std::to_string(i);
      HostLink h{w, rates[next() % 7], rates[next() % 7], {}, {}};
      if (next() % 8 == 0) h.uplink_profile = {{0.0, h.uplink_bps}, {0.6, 1e9}};
      r.hosts.push_back(h);
      r.requesters.push_back(w);
    }
    const int distributors = next() % 31;
    for (int d = 0; d < distributors; ++d) {
      if (next() % 2) {
        r.distributors.push_back("w" + std::to_string(next() % workers));
      } else {
        r.distributors.push_back("d" + std::to_string(d));
        r.hosts.push_back({r.distributors.back(), rates[next() % 7], 1e10, {}, {}});
      }
    }
    DistributionOptions reference;
    reference.reference = true;
    auto fast = PlanModelDistribution(r);
    auto slow = PlanModelDistribution(r, reference);
    REQUIRE(fast.ok());
    REQUIRE(slow.ok());
    CHECK(DistributionPlanToText(*fast) == DistributionPlanToText(*slow));
  }
}

// A random §10.3 batch for the equality checks below: up to `max_workers`
// requesters and `max_distributors` candidate distributors (co-hosted or
// not), NIC rates from a small set so that many cases tie exactly, sometimes
// every NIC equal, a saturated server link (slower than a worker's NIC),
// uplink and downlink profiles that dip or (rarely) end, so that some
// cases are infeasible.
DistributionRequest RandomRequest(uint64_t seed, int max_workers, int max_distributors) {
  uint64_t state = seed;
  auto next = [&]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  const double rates[] = {1e9, 2.5e9, 3.3e9, 5e9, 1e10, 1e10, 1e10};
  const bool uniform = next() % 4 == 0;
  auto rate = [&]() { return uniform ? 1e10 : rates[next() % 7]; };
  DistributionRequest r;
  r.server = "s";
  r.now_s = (next() % 3) * 0.25;
  r.model_bytes = next() % 4 == 0 ? 125000000 : 1000000 + next() % 100000000;
  r.seed = seed;
  const bool saturated = next() % 3 == 0;
  r.hosts.push_back({"s", saturated ? 2.5e9 : rate(), 1e10, {}, {}});
  const int workers = 1 + next() % max_workers;
  for (int i = 0; i < workers; ++i) {
    const std::string w = "w" + std::to_string(i);
    HostLink h{w, rate(), rate(), {}, {}};
    const int shape = uniform ? 9 : next() % 16;
    if (shape == 0) h.uplink_profile = {{0.0, h.uplink_bps}, {r.now_s + 0.6, 1e9}};
    if (shape == 1) h.downlink_profile = {{0.0, h.downlink_bps}, {r.now_s + 0.3, 2e9}};
    if (shape == 2) h.uplink_profile = {{0.0, h.uplink_bps}, {r.now_s + 2.0, 0.0}};
    r.hosts.push_back(h);
    r.requesters.push_back(w);
  }
  const int distributors = next() % (max_distributors + 1);
  for (int d = 0; d < distributors; ++d) {
    if (next() % 2) {
      r.distributors.push_back("w" + std::to_string(next() % workers));
    } else {
      r.distributors.push_back("d" + std::to_string(d));
      r.hosts.push_back({r.distributors.back(), rate(), rate(), {}, {}});
    }
  }
  return r;
}

// The default search must choose exactly what the exhaustive one chooses,
// for both objectives: deadlines before, at and after the per-batch total
// (at it, only cases finishing exactly then qualify: ties decide).
TEST_CASE("Fast distribution search equals the exhaustive one for both objectives") {
  DistributionOptions reference;
  reference.reference = true;
  int compared = 0, fewer_copies = 0;
  for (uint64_t seed = 1; seed <= kRandomBatches; ++seed) {
    INFO("seed " << seed);
    const DistributionRequest r = RandomRequest(1000 + seed, seed % 10 == 0 ? 60 : 24,
                                                seed % 10 == 0 ? 30 : 12);
    auto fast = PlanModelDistribution(r);
    auto slow = PlanModelDistribution(r, reference);
    REQUIRE(fast.ok() == slow.ok());
    if (!fast.ok()) continue;
    CHECK(DistributionPlanToText(*fast) == DistributionPlanToText(*slow));
    for (const double factor : {0.9, 1.0, 1.2, 2.0, 5.0}) {
      INFO("deadline at " << factor << "x the per-batch total");
      DistributionOptions frugal;
      frugal.deadline_s = r.now_s + factor * (slow->total_s - r.now_s);
      DistributionOptions frugal_reference = frugal;
      frugal_reference.reference = true;
      auto fast_frugal = PlanModelDistribution(r, frugal);
      auto slow_frugal = PlanModelDistribution(r, frugal_reference);
      REQUIRE(fast_frugal.ok());
      REQUIRE(slow_frugal.ok());
      CHECK(DistributionPlanToText(*fast_frugal) == DistributionPlanToText(*slow_frugal));
      ++compared;
      fewer_copies += slow_frugal->direct + slow_frugal->distributors_used <
                      slow->direct + slow->distributors_used;
    }
  }
  // The deadline objective must have had something to choose.
  CHECK(fewer_copies > compared / 10);
}

// When the server's uplink is the bottleneck, a deadline a little
// later than the per-batch optimum buys fewer server copies (the next batch
// finds the server's link free sooner).
TEST_CASE("The deadline objective spends fewer server copies on a saturated server link") {
  DistributionRequest r = Request(5e9, 4);  // the server's uplink: half a worker's NIC
  auto per_batch = PlanModelDistribution(r);
  REQUIRE(per_batch.ok());
  DistributionOptions frugal;
  frugal.deadline_s = r.now_s + 1.5 * (per_batch->total_s - r.now_s);
  auto spare = PlanModelDistribution(r, frugal);
  REQUIRE(spare.ok());
  const int per_batch_copies = per_batch->direct + per_batch->distributors_used;
  const int spare_copies = spare->direct + spare->distributors_used;
  INFO("per-batch " << per_batch_copies << " copies by " << per_batch->total_s << " s, frugal "
                    << spare_copies << " by " << spare->total_s << " s");
  CHECK(spare_copies < per_batch_copies);
  CHECK(spare->total_s <= frugal.deadline_s);
  int server_sends = 0;
  for (const Transfer& t : spare->transfers) server_sends += t.src == "s";
  CHECK(server_sends == spare_copies);
  REQUIRE(spare->deliveries.size() == r.requesters.size());
  for (const Delivery& d : spare->deliveries) CHECK(d.at_s <= frugal.deadline_s);
  // An unreachable deadline falls back to the per-batch plan.
  frugal.deadline_s = r.now_s + 0.5 * (per_batch->total_s - r.now_s);
  auto fallback = PlanModelDistribution(r, frugal);
  REQUIRE(fallback.ok());
  CHECK(DistributionPlanToText(*fallback) == DistributionPlanToText(*per_batch));
}

// Cut-through trees (the live data plane forwards packet by
// packet): checks that hold for any plan, on random links.
void CheckCutThroughPlan(const DistributionRequest& r, const DistributionPlan& plan) {
  REQUIRE(plan.deliveries.size() == r.requesters.size());
  std::map<std::string, const Delivery*> by_host;
  for (size_t i = 0; i < plan.deliveries.size(); ++i) {
    const Delivery& d = plan.deliveries[i];
    CHECK(d.host == r.requesters[i]);  // request order
    CHECK(d.at_s > r.now_s);
    CHECK(d.at_s <= plan.total_s);
    by_host[d.host] = &d;
  }
  int from_server = 0;
  std::map<std::string, int> children;
  for (const Delivery& d : plan.deliveries) {
    if (d.via == r.server) {
      ++from_server;
      continue;
    }
    ++children[d.via];
    // Fed by another requester that has the model no later, never itself,
    // and the chain leads back to the server (no cycle).
    REQUIRE(by_host.count(d.via) == 1);
    CHECK(d.via != d.host);
    CHECK(by_host[d.via]->at_s <= d.at_s);
    std::string up = d.via;
    for (size_t steps = 0; up != r.server; ++steps) {
      REQUIRE(steps <= r.requesters.size());
      up = by_host[up]->via;
    }
  }
  CHECK(from_server == plan.direct);
  CHECK(plan.distributors_used == 0);
  for (const auto& [host, n] : children) CHECK(n <= from_server);  // one fanout for all
  // The rates a daemon places later gets by: each stream no faster than its
  // parent's, nor than the parent's uplink shared by its children; the
  // children counted as planned; copy_bps the slowest server copy.
  double slowest_copy = 0;
  for (const Delivery& d : plan.deliveries) {
    CHECK(d.rate_bps > 0);
    CHECK(d.uplink_bps > 0);
    CHECK(d.children == children[d.host]);
    if (d.via == r.server) {
      slowest_copy = slowest_copy > 0 ? std::min(slowest_copy, d.rate_bps) : d.rate_bps;
    } else {
      const Delivery& parent = *by_host[d.via];
      CHECK(d.rate_bps <= parent.rate_bps);
      CHECK(d.rate_bps <= parent.uplink_bps / parent.children * (1 + 1e-12));
    }
  }
  CHECK(plan.copy_bps == slowest_copy);
}

TEST_CASE("Cut-through trees: one server copy on equal links, slow uplinks as leaves") {
  DistributionRequest r = Request(1e10, 0);
  auto chain = PlanCutThroughDistribution(r);
  REQUIRE(chain.ok());
  CheckCutThroughPlan(r, *chain);
  // Equal links: a chain (fanout 1) costs one copy's time plus a packet and
  // a hop per level; any wider tree halves the rates.
  CHECK(chain->direct == 1);
  CHECK(chain->total_s < 0.1 * 1.2);
  // The per-batch store-and-forward planner spends more server copies here.
  auto per_batch = PlanModelDistribution(Request(1e10, 2));
  REQUIRE(per_batch.ok());
  CHECK(per_batch->direct + per_batch->distributors_used > chain->direct);

  // A requester with a slow uplink (N3) forwards to nobody.
  r.hosts[1].uplink_bps = 1e8;  // w0
  auto avoid = PlanCutThroughDistribution(r);
  REQUIRE(avoid.ok());
  CheckCutThroughPlan(r, *avoid);
  for (const Delivery& d : avoid->deliveries) CHECK(d.via != "w0");
  // The residual profile, not the capacity, decides: w1 is busy now.
  r.hosts[2].uplink_profile = {{0.0, 1e7}, {5.0, 1e10}};
  auto busy = PlanCutThroughDistribution(r);
  REQUIRE(busy.ok());
  for (const Delivery& d : busy->deliveries) CHECK(d.via != "w1");
  // Every requester's uplink far slower than the server's: no tree beats
  // the server sending every copy itself (the star), so that is the plan.
  DistributionRequest slow = Request(1e10, 0);
  for (size_t i = 1; i < slow.hosts.size(); ++i) slow.hosts[i].uplink_bps = 1e8;
  auto star = PlanCutThroughDistribution(slow);
  REQUIRE(star.ok());
  CheckCutThroughPlan(slow, *star);
  CHECK(star->direct == static_cast<int>(slow.requesters.size()));
  CHECK(star->server_bound);  // 8 copies share the server's 1e10
  CHECK(chain->server_bound);

  // Two requesters whose downlinks (6e9) are a little faster than half the
  // server's uplink (5e9 each in the star): a chain ends about 17 % sooner,
  // less than min_saving (20 %), so the server sends both copies; with
  // min_saving 0 the chain wins.
  DistributionRequest two;
  two.server = "s";
  two.model_bytes = 125000000;
  two.hosts = {{"s", 1e10, 1e10, {}, {}}, {"a", 1e10, 6e9, {}, {}}, {"b", 1e10, 6e9, {}, {}}};
  two.requesters = {"a", "b"};
  auto direct = PlanCutThroughDistribution(two);
  REQUIRE(direct.ok());
  CHECK(direct->direct == 2);
  CHECK(direct->total_s == Approx(0.2));
  CHECK(direct->server_bound);  // 5e9 each, the uplink's share
  // Downlinks at a tenth of the uplink's share: they, not the server, are
  // what is slow (N3).
  two.hosts[1].downlink_bps = two.hosts[2].downlink_bps = 5e8;
  auto receiver_bound = PlanCutThroughDistribution(two);
  REQUIRE(receiver_bound.ok());
  CHECK(receiver_bound->direct == 2);
  CHECK_FALSE(receiver_bound->server_bound);
  two.hosts[1].downlink_bps = two.hosts[2].downlink_bps = 6e9;
  CutThroughOptions eager;
  eager.min_saving = 0;
  auto chained = PlanCutThroughDistribution(two, eager);
  REQUIRE(chained.ok());
  CHECK(chained->direct == 1);
  CHECK(chained->total_s < 0.2 * 0.9);
  eager.min_saving = 1;
  CHECK(PlanCutThroughDistribution(two, eager).status().message().find("min_saving") !=
        std::string::npos);
}

TEST_CASE("Cut-through trees: a link reserved for a moment is slow, not unusable") {
  // w0's downlink is fully reserved for 0.1 s (an aggregator receiving its
  // constituents), then free: its copy ends after the reservation, not
  // never (the rate at `now` alone, 0, made the plan's total infinite).
  DistributionRequest r = Request(1e10, 0);
  r.hosts[1].downlink_profile = {{0.0, 0.0}, {r.now_s + 0.1, 1e10}};
  auto plan = PlanCutThroughDistribution(r);
  REQUIRE(plan.ok());
  CHECK(std::isfinite(plan->total_s));
  CHECK(plan->total_s - r.now_s > 0.1);
  CHECK(plan->total_s - r.now_s < 0.1 + 0.1 * 1.5);
  // A link whose residual ends at 0 for good never carries the model.
  r.hosts[1].downlink_profile = {{0.0, 1e10}, {r.now_s + 1e-6, 0.0}};
  auto never = PlanCutThroughDistribution(r);
  REQUIRE(never.ok());
  CHECK(std::isinf(never->total_s));
}

TEST_CASE("Cut-through trees on random links respect their invariants; errors name the field") {
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53);
  };
  for (int trial = 0; trial < 200; ++trial) {
    DistributionRequest r;
    r.server = "s";
    r.now_s = 10 * next();
    r.model_bytes = 1 + static_cast<int64_t>(next() * 2e8);
    r.hosts.push_back({"s", 1e8 + next() * 1e10, 1e10, {}, {}});
    const int n = 1 + static_cast<int>(next() * 40);
    for (int i = 0; i < n; ++i) {
      const std::string w = "w" + std::to_string(i);
      r.hosts.push_back({w, 1e7 + next() * 1e10, 1e7 + next() * 1e10, {}, {}});
      r.requesters.push_back(w);
    }
    CutThroughOptions options;
    options.max_fanout = 1 + static_cast<int>(next() * 6);
    auto plan = PlanCutThroughDistribution(r, options);
    REQUIRE(plan.ok());
    CheckCutThroughPlan(r, *plan);
    CHECK((plan->direct <= options.max_fanout || plan->direct == n));  // a tree or the star
  }
  DistributionRequest r = Request(1e10, 0);
  CutThroughOptions bad;
  bad.max_fanout = 0;
  CHECK(PlanCutThroughDistribution(r, bad).status().message().find("max_fanout") !=
        std::string::npos);
  r.requesters.push_back("nowhere");
  CHECK(PlanCutThroughDistribution(r).status().message().find("requesters[8]") !=
        std::string::npos);
}

}  // namespace
}  // namespace mlfabric::core
