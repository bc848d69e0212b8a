#include "scheduler/core/plan_checker.h"

#include <catch2/catch.hpp>

#include "scheduler/core/internal/random_batch.h"
#include "scheduler/core/mlfabric_planner.h"

namespace mlfabric::core {
namespace {

// The checker is what the property tests rely on: it must catch broken plans.
struct Fixture {
  Batch batch;
  Plan plan;
  Fixture() {
    internal::RandomBatchOptions o;
    o.seed = 3;
    o.updates = 12;
    o.aggregators = 2;
    o.replica = true;
    batch = internal::RandomBatch(o);
    plan = MlfabricPlanner().PlanBatch(batch).value();
    REQUIRE(CheckPlan(batch, plan).empty());
    REQUIRE(plan.order.size() >= 3);
  }
};

bool Mentions(const std::vector<std::string>& problems, const std::string& what) {
  for (const std::string& p : problems) {
    if (p.find(what) != std::string::npos) return true;
  }
  return false;
}

TEST_CASE("Checker: over-capacity reservations") {
  Fixture f;
  for (RateSegment& s : f.plan.transfers[0].segments) s.rate_bps *= 3;
  const auto problems = CheckPlan(f.batch, f.plan);
  CHECK(Mentions(problems, "> available"));
  CHECK(Mentions(problems, "bytes"));  // and the bytes no longer match
}

TEST_CASE("Checker: missing, duplicated and unknown updates") {
  Fixture f;
  f.plan.order.push_back(f.plan.order[0]);
  CHECK(Mentions(CheckPlan(f.batch, f.plan), "appears 2 times"));
  Fixture g;
  g.plan.order.erase(g.plan.order.begin());
  CHECK(Mentions(CheckPlan(g.batch, g.plan), "appears 0 times"));
}

TEST_CASE("Checker: deadlines and commit order") {
  Fixture f;
  f.batch.v_init += 1000;  // every deadline is now in the past
  CHECK(Mentions(CheckPlan(f.batch, f.plan), "past its deadline"));
  Fixture g;
  std::swap(g.plan.commits[0].at_s, g.plan.commits[2].at_s);
  CHECK(Mentions(CheckPlan(g.batch, g.plan), "time goes back"));
  Fixture h;
  h.plan.commits[0].at_s = h.batch.now_s;
  CHECK(Mentions(CheckPlan(h.batch, h.plan), "before it arrives"));
}

TEST_CASE("Checker: replica divergence and prefix") {
  Fixture f;
  f.batch.replica->divergence_bound = 0;
  if (!f.plan.replica_commits.empty()) {
    f.plan.punted.insert(f.plan.punted.begin(), f.plan.replica_commits.back().update);
    f.plan.replica_commits.pop_back();
  }
  CHECK(Mentions(CheckPlan(f.batch, f.plan), "divergence bound"));
  Fixture g;
  if (g.plan.replica_commits.size() >= 2) {
    std::swap(g.plan.replica_commits[0], g.plan.replica_commits[1]);
    CHECK(Mentions(CheckPlan(g.batch, g.plan), "prefix"));
  }
}

// A model split across s0, s1, s2 (§10.2) whose 1 Gbit/s downlinks are
// saturated: the planner sends g1 direct and aggregates g2..g4 at a1.
struct ShardedFixture {
  Batch batch;
  Plan plan;
  ShardedFixture() {
    batch.server = "s0";
    batch.tau_max = 10;
    batch.hosts = {{"s0", 1e10, 1e9, {}, {}}, {"s1", 1e10, 1e9, {}, {}},
                   {"s2", 1e10, 1e9, {}, {}}, {"a1", 1e10, 1e10, {}, {}}};
    for (int i = 1; i <= 4; ++i) {
      const std::string w = "w" + std::to_string(i);
      batch.hosts.push_back({w, 1e10, 1e10, {}, {}});
      batch.updates.push_back({"g" + std::to_string(i), w, 125000000, 0, 1,
                               {{"s1", 100000000 + 5000000 * i}, {"s2", 125000000}}});
    }
    batch.aggregators = {"a1"};
    plan = MlfabricPlanner().PlanBatch(batch).value();
    REQUIRE(CheckPlan(batch, plan).empty());
    REQUIRE(Find(TransferKind::kAggregate, "s1") >= 0);
    REQUIRE(Find(TransferKind::kDirect, "s1") >= 0);
  }
  int Find(TransferKind kind, const std::string& dst) const {
    for (size_t k = 0; k < plan.transfers.size(); ++k) {
      if (plan.transfers[k].kind == kind && plan.transfers[k].dst == dst) return static_cast<int>(k);
    }
    return -1;
  }
};

TEST_CASE("Checker: a sharded aggregate of the wrong size") {
  ShardedFixture f;
  // The aggregate to s1 must be as large as its largest constituent's s1
  // part; s0's size (all parts for s0 are larger) is wrong there.
  Transfer& t = f.plan.transfers[f.Find(TransferKind::kAggregate, "s1")];
  t.bytes = 125000000;
  for (RateSegment& s : t.segments) s.rate_bps *= 125.0 / 120.0;  // bytes moved still match
  const auto problems = CheckPlan(f.batch, f.plan);
  CHECK(Mentions(problems, "size 125000000, expected 120000000"));
  CHECK(!Mentions(problems, "moves"));
}

TEST_CASE("Checker: a part of a sharded update that never reaches its host") {
  ShardedFixture f;
  f.plan.transfers.erase(f.plan.transfers.begin() + f.Find(TransferKind::kDirect, "s1"));
  CHECK(Mentions(CheckPlan(f.batch, f.plan), "0 of its parts delivered to s1, expected 1"));
  ShardedFixture g;  // an aggregate's parts
  const std::vector<std::string> members =
      g.plan.transfers[g.Find(TransferKind::kAggregate, "s2")].constituents;
  g.plan.transfers.erase(g.plan.transfers.begin() + g.Find(TransferKind::kAggregate, "s2"));
  const auto problems = CheckPlan(g.batch, g.plan);
  for (const std::string& id : members) {
    CHECK(Mentions(problems, id + ": 0 of its parts delivered to s2, expected 1"));
  }
  ShardedFixture h;  // twice: direct and in an aggregate
  Transfer twice = h.plan.transfers[h.Find(TransferKind::kAggregate, "s1")];
  twice.constituents.push_back(h.plan.order[0]);
  h.plan.transfers.push_back(twice);
  CHECK(Mentions(CheckPlan(h.batch, h.plan), h.plan.order[0] + ": 2 of its parts delivered to s1"));
}

TEST_CASE("Checker: a sharded update's transfers to its aggregator carry each part once") {
  ShardedFixture f;
  for (Transfer& t : f.plan.transfers) {
    if (t.kind == TransferKind::kToAggregator && t.bytes != 125000000) {
      // Its s1 part sent as a copy of its s0 part (the s1 part is missing).
      for (RateSegment& s : t.segments) s.rate_bps *= 125000000.0 / static_cast<double>(t.bytes);
      t.bytes = 125000000;
      break;
    }
  }
  CHECK(Mentions(CheckPlan(f.batch, f.plan), "do not carry its 3 parts one each"));
}

}  // namespace
}  // namespace mlfabric::core
