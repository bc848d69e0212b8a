#include "scheduler/core/aggregation.h"

#include <algorithm>

#include <catch2/catch.hpp>

#include "scheduler/core/internal/random_batch.h"
#include "scheduler/core/mlfabric_planner.h"
#include "scheduler/core/plan_checker.h"
#include "scheduler/core/plan_json.h"

namespace mlfabric::core {
namespace {

// Six equally sized updates from six 10 Gbit/s workers to a 10 Gbit/s
// server; aggregators A1 (9 Gbit/s downlink) and A2.
struct Fig6 {
  Batch batch;
  Network net;
  AggregationInput input;

  Fig6() : net(Make(&batch)) {
    input.now_s = 0;
    input.dst_host = net.HostIndex("S");
    for (int i = 1; i <= 6; ++i) {
      input.items.push_back({i - 1, net.HostIndex("w" + std::to_string(i)), 125000000});  // 1 Gbit
    }
    Network tentative = net;
    input.direct = SequentialDirect(input.items, input.dst_host, 0, TransferKind::kDirect,
                                    &tentative);
    input.aggregators = {net.HostIndex("A1"), net.HostIndex("A2")};
  }

  static Network Make(Batch* batch) {
    batch->server = "S";
    batch->hosts = {{"S", 1e10, 1e10, {}, {}}, {"A1", 1e10, 9e9, {}, {}},
                    {"A2", 1e10, 1e10, {}, {}}};
    for (int i = 1; i <= 6; ++i) batch->hosts.push_back({"w" + std::to_string(i), 1e10, 1e10, {}, {}});
    return Network::FromBatch(*batch).value();
  }
};

TEST_CASE("Fig. 6: u6 is not added to G2 (aggregating it would outlast G1)") {
  Fig6 f;
  Network net = f.net;
  AggregationResult r = AggregateWithSplit(f.input, 3, &net);
  // G1 = u1..u3 go directly and keep the server busy until 0.3 s.
  CHECK(f.input.direct[2].end_s == Approx(0.3));
  REQUIRE(r.groups.size() == 2);
  // u4, u5 reach A1 by 0.111 s and 0.222 s; u6 would arrive at 0.333 s > 0.3 s.
  CHECK(r.groups[0].aggregator == f.net.HostIndex("A1"));
  CHECK(r.groups[0].items == std::vector<int>{3, 4});
  CHECK(r.groups[0].to_aggregator[1].end_s == Approx(2.0 / 9.0));
  // A1's aggregate is ready at 0.222 s and follows G1 on the server link;
  // u6 forms the last group at A2.
  CHECK(r.groups[0].aggregate.start_s == Approx(0.3));
  CHECK(r.groups[0].aggregate.end_s == Approx(0.4));
  CHECK(r.groups[1].aggregator == f.net.HostIndex("A2"));
  CHECK(r.groups[1].items == std::vector<int>{5});
  CHECK(r.total_s == Approx(0.5));
  // Order is preserved: arrivals never decrease along the order.
  CHECK(std::is_sorted(r.arrival_s.begin(), r.arrival_s.end()));
}

TEST_CASE("Alg. 3 keeps the split with the least total time") {
  Fig6 f;
  PlannerOptions reference;
  reference.reference = true;
  Network a = f.net, b = f.net;
  AggregationResult best = Aggregate(f.input, &a, PlannerOptions{});
  AggregationResult ref = Aggregate(f.input, &b, reference);
  CHECK(best.split == ref.split);
  CHECK(best.total_s == ref.total_s);
  // Every split point, evaluated alone, is no better.
  for (int n = 0; n <= 6; ++n) {
    Network net = f.net;
    AggregationResult r = AggregateWithSplit(f.input, n, &net);
    INFO("split " << n << " total " << r.total_s);
    CHECK(r.total_s >= best.total_s);
  }
  // All direct would take 0.6 s: aggregation wins.
  CHECK(best.total_s < 0.6 - 1e-9);
}

// Fig. 2: g1, g2 direct; g3, g4 aggregated at A concurrently; the aggregate
// r arrives at t'_3 < t_4 (the all-direct completion).
TEST_CASE("Fig. 2: aggregating g3 and g4 commits all four earlier") {
  Batch batch;
  batch.server = "S";
  batch.tau_max = 10;
  batch.hosts = {{"S", 1e10, 1e10, {}, {}}, {"A", 1e10, 2e10, {}, {}}};
  for (int i = 1; i <= 4; ++i) {
    batch.hosts.push_back({"w" + std::to_string(i), 1e10, 1e10, {}, {}});
    batch.updates.push_back({"g" + std::to_string(i), "w" + std::to_string(i), 125000000, 0, 1, {}});
  }
  batch.aggregators = {"A"};
  auto plan = MlfabricPlanner().PlanBatch(batch);
  REQUIRE(plan.ok());
  CHECK(plan->aggregation_split == 2);
  CHECK(plan->commits.back().at_s == Approx(0.3));  // t_4 = 0.4 all direct
  bool found = false;
  for (const Transfer& t : plan->transfers) {
    if (t.kind == TransferKind::kAggregate) {
      found = true;
      CHECK(t.constituents == std::vector<std::string>{"g3", "g4"});
    }
  }
  CHECK(found);
}

// Four 1 Gbit updates from four workers that may aggregate, to a server
// whose 1 Gbit/s downlink is the bottleneck (every link is 1 Gbit/s).
Batch SaturatedServer() {
  Batch batch;
  batch.server = "S";
  batch.tau_max = 10;
  batch.hosts = {{"S", 1e9, 1e9, {}, {}}};
  for (int i = 1; i <= 4; ++i) {
    const std::string w = "w" + std::to_string(i);
    batch.hosts.push_back({w, 1e9, 1e9, {}, {}});
    batch.updates.push_back({"g" + std::to_string(i), w, 125000000, 0, 1, {}});
    batch.aggregators.push_back(w);
  }
  return batch;
}

int64_t BytesInto(const Plan& plan, const std::string& host) {
  int64_t bytes = 0;
  for (const Transfer& t : plan.transfers) bytes += t.dst == host ? t.bytes : 0;
  return bytes;
}

TEST_CASE("Streaming chain: the server's link carries one update for the whole batch") {
  const Batch batch = SaturatedServer();
  auto plan = MlfabricPlanner().PlanBatch(batch);
  REQUIRE(plan.ok());
  INFO(PlanToJson(*plan).dump(1));
  CHECK(CheckPlan(batch, *plan).empty());
  CHECK(BytesInto(*plan, "S") == 125000000);
  // Every hop moves at 1 Gbit/s in lock-step: all four arrive after 1 s,
  // where four direct transfers through the server's downlink take 4 s.
  for (const Commit& c : plan->commits) CHECK(c.at_s == Approx(1.0));
  int hops = 0, to_server = 0;
  for (const Transfer& t : plan->transfers) {
    if (t.kind != TransferKind::kAggregate) continue;
    ++hops;
    to_server += t.dst == "S";
    CHECK(t.into.empty() == (t.dst == "S"));
  }
  CHECK(hops == 3);
  CHECK(to_server == 1);

  // The paper's Alg. 3 on the same batch: more bytes into the server, later.
  Batch alg3 = batch;
  alg3.streaming_aggregation = false;
  auto per_batch = MlfabricPlanner().PlanBatch(alg3);
  REQUIRE(per_batch.ok());
  CHECK(CheckPlan(alg3, *per_batch).empty());
  CHECK(BytesInto(*per_batch, "S") > BytesInto(*plan, "S"));
  CHECK(per_batch->commits.back().at_s > plan->commits.back().at_s);
}

TEST_CASE("Streaming chain: a worker with a slow uplink stays out of the chain") {
  Batch batch = SaturatedServer();
  batch.hosts[3].uplink_bps = 1e8;  // w3: ten times slower
  auto plan = MlfabricPlanner().PlanBatch(batch);
  REQUIRE(plan.ok());
  INFO(PlanToJson(*plan).dump(1));
  CHECK(CheckPlan(batch, *plan).empty());
  // Alg. 2 puts g3 last; the others arrive together after 1 s.
  REQUIRE(plan->order.back() == "g3");
  for (size_t i = 0; i + 1 < plan->commits.size(); ++i) CHECK(plan->commits[i].at_s == Approx(1.0));
  for (const Transfer& t : plan->transfers) {
    if (t.kind == TransferKind::kAggregate) {
      CHECK(std::find(t.constituents.begin(), t.constituents.end(), "g3") == t.constituents.end());
    }
  }
}

TEST_CASE("Streaming chains: a host's second update is summed there; a non-aggregator never sums") {
  Batch batch = SaturatedServer();
  batch.updates.push_back({"g5", "w1", 125000000, 0, 1, {}});  // w1 twice
  batch.hosts.push_back({"x", 1e9, 1e9, {}, {}});
  batch.updates.push_back({"g6", "x", 125000000, 0, 1, {}});  // x may not aggregate
  auto plan = MlfabricPlanner().PlanBatch(batch);
  REQUIRE(plan.ok());
  INFO(PlanToJson(*plan).dump(1));
  CHECK(CheckPlan(batch, *plan).empty());
  CHECK(plan->order.size() == 6);
  bool g5_at_w1 = false;
  for (const Transfer& t : plan->transfers) {
    if (t.kind != TransferKind::kAggregate) continue;
    // x may not aggregate: no aggregate leaves it.
    CHECK(t.src != "x");
    // w1's second update has no transfer of its own: the aggregate leaving
    // w1 sums it.
    const bool has_g5 =
        std::find(t.constituents.begin(), t.constituents.end(), "g5") != t.constituents.end();
    if (t.src == "w1" && has_g5) g5_at_w1 = true;
  }
  for (const Transfer& t : plan->transfers) CHECK(t.update != "g5");
  CHECK(g5_at_w1);
}

TEST_CASE("Streaming chains: random batches with worker aggregators keep every invariant") {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    internal::RandomBatchOptions o;
    o.seed = seed;
    o.updates = 2 + static_cast<int>(seed % 30);
    o.aggregators = 2 + static_cast<int>(seed % 6);
    o.worker_aggregators = true;
    o.profiles = seed % 2 == 1;
    o.sync = seed % 5 == 0;
    o.max_deadline = seed % 3 == 0 ? o.updates / 2 + 1 : 0;
    o.outages = seed % 7 == 0;
    const Batch batch = internal::RandomBatch(o);
    INFO("seed " << seed);
    auto plan = MlfabricPlanner().PlanBatch(batch);
    REQUIRE(plan.ok());
    const std::vector<std::string> problems = CheckPlan(batch, *plan);
    INFO((problems.empty() ? std::string() : problems.front()));
    CHECK(problems.empty());
  }
}

TEST_CASE("Without aggregators everything goes direct") {
  Fig6 f;
  f.input.aggregators.clear();
  Network net = f.net;
  AggregationResult r = Aggregate(f.input, &net, PlannerOptions{});
  CHECK(r.split == 6);
  CHECK(r.groups.empty());
  CHECK(r.total_s == Approx(0.6));
}

TEST_CASE("The aggregator pre-assignment is a seeded permutation") {
  const std::vector<int> hosts = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int> a = ShuffleAggregators(hosts, 7);
  CHECK(a == ShuffleAggregators(hosts, 7));
  std::vector<int> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == hosts);
  bool differs = false;
  for (uint64_t seed = 1; seed < 10; ++seed) differs = differs || ShuffleAggregators(hosts, seed) != a;
  CHECK(differs);
}

}  // namespace
}  // namespace mlfabric::core
