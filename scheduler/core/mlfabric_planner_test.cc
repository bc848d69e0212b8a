#include "scheduler/core/mlfabric_planner.h"

#include <algorithm>
#include <iostream>
#include <numeric>
#include <thread>

#include <catch2/catch.hpp>

#include "scheduler/core/fifo_planner.h"
#include "scheduler/core/internal/random_batch.h"
#include "scheduler/core/network.h"
#include "scheduler/core/plan_checker.h"
#include "scheduler/core/plan_json.h"

namespace mlfabric::core {
namespace {

using internal::RandomBatch;
using internal::RandomBatchOptions;

std::string Problems(const std::vector<std::string>& problems) {
  std::string out;
  for (size_t i = 0; i < problems.size() && i < 5; ++i) out += problems[i] + "\n";
  return out;
}

RandomBatchOptions OptionsForSeed(uint64_t seed) {
  RandomBatchOptions o;
  o.seed = seed;
  o.updates = 1 + static_cast<int>(seed % 40);
  o.aggregators = static_cast<int>(seed % 4);
  o.replica = seed % 3 == 0;
  o.replica_aggregators = static_cast<int>(seed % 2);
  o.profiles = seed % 2 == 1;
  o.sync = seed % 7 == 0;
  o.shards = seed % 11 == 0 ? 1 : 0;
  o.max_deadline = seed % 5 == 0 ? o.updates / 2 + 1 : 0;  // some batches with tight deadlines
  o.outages = seed % 13 == 0 || seed % 17 == 0;
  o.worker_aggregators = seed % 4 == 2;
  return o;
}

TEST_CASE("Random batches: every plan satisfies the invariants") {
  const MlfabricPlanner planner;
  int aggregated = 0, dropped = 0, punted = 0, delayed = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const Batch batch = RandomBatch(OptionsForSeed(seed));
    INFO("seed " << seed << " (RandomBatch(OptionsForSeed(seed)))");
    absl::StatusOr<Plan> plan = planner.PlanBatch(batch);
    REQUIRE(plan.ok());
    const std::vector<std::string> problems = CheckPlan(batch, *plan);
    INFO(Problems(problems));
    CHECK(problems.empty());
    aggregated += plan->aggregation_split >= 0 &&
                  plan->aggregation_split < static_cast<int>(plan->order.size());
    dropped += !plan->dropped.empty();
    punted += !plan->punted.empty();
  }
  // The generator must exercise the interesting paths, or the test proves little.
  CHECK(aggregated > 10);
  CHECK(dropped > 10);
  CHECK(punted > 5);
  (void)delayed;
}

// The optimised, threaded and reference planners give identical plans for
// the random batches of seeds 1..120 (`options_for(seed)`; every tenth
// batch has `large` updates, enough split points for two threads).
template <typename OptionsFor>
void CheckImplementationsAgree(OptionsFor options_for, int large) {
  PlannerOptions reference;
  reference.reference = true;
  PlannerOptions threaded;
  threaded.threads = 2;
  threaded.min_splits_per_thread = 1;  // take the threaded path whenever it exists
  const MlfabricPlanner fast, slow(reference), parallel(threaded);
  for (uint64_t seed = 1; seed <= 120; ++seed) {
    RandomBatchOptions options = options_for(seed);
    if (seed % 10 == 0) options.updates = large;
    const Batch batch = RandomBatch(options);
    INFO("seed " << seed);
    auto a = fast.PlanBatch(batch);
    auto b = slow.PlanBatch(batch);
    auto c = parallel.PlanBatch(batch);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    REQUIRE(c.ok());
    CHECK(PlanToJson(*a).dump() == PlanToJson(*b).dump());
    CHECK(PlanToJson(*a).dump() == PlanToJson(*c).dump());
  }
}

TEST_CASE("Optimised, threaded and reference implementations give identical plans") {
  CheckImplementationsAgree(OptionsForSeed, 150);
}

// §10.2 batches with aggregators (our extension: sharded updates are
// aggregated too): 2..4 servers, random sizes and NICs, aggregators on
// their own hosts or on workers, some updates with another part layout.
RandomBatchOptions ShardedOptionsForSeed(uint64_t seed) {
  RandomBatchOptions o;
  o.seed = seed;
  o.updates = 1 + static_cast<int>(seed % 30);
  o.shards = 1 + static_cast<int>(seed % 3);
  o.aggregators = 1 + static_cast<int>(seed % 4);
  o.worker_aggregators = seed % 4 == 2;
  o.profiles = seed % 2 == 1;
  o.sync = seed % 7 == 0;
  o.max_deadline = seed % 5 == 0 ? o.updates / 2 + 1 : 0;
  o.outages = seed % 13 == 0;
  o.mixed_shards = seed % 3 == 0;
  return o;
}

TEST_CASE("Multi-server batches: aggregated plans keep every invariant") {
  const MlfabricPlanner planner;
  int aggregated = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const Batch batch = RandomBatch(ShardedOptionsForSeed(seed));
    INFO("seed " << seed << " (RandomBatch(ShardedOptionsForSeed(seed)))");
    absl::StatusOr<Plan> plan = planner.PlanBatch(batch);
    REQUIRE(plan.ok());
    const std::vector<std::string> problems = CheckPlan(batch, *plan);
    INFO(Problems(problems));
    CHECK(problems.empty());
    aggregated += plan->aggregation_split < static_cast<int>(plan->order.size());
  }
  std::cout << "multi-server batches: " << aggregated << " of 300 aggregated\n";
  CHECK(aggregated > 30);
}

TEST_CASE("Multi-server batches: optimised, threaded and reference plans are identical") {
  CheckImplementationsAgree(ShardedOptionsForSeed, 100);
}

TEST_CASE("Plans are deterministic given the batch, including its seed") {
  RandomBatchOptions options = OptionsForSeed(4);
  options.aggregators = 3;
  options.updates = 30;
  const Batch batch = RandomBatch(options);
  const MlfabricPlanner planner;
  CHECK(PlanToJson(*planner.PlanBatch(batch)).dump() ==
        PlanToJson(*planner.PlanBatch(batch)).dump());
}

TEST_CASE("One planner serves several servers' batches concurrently") {
  PlannerOptions threaded;
  threaded.threads = 2;
  threaded.min_splits_per_thread = 1;
  const MlfabricPlanner planner(threaded);
  std::vector<Batch> batches;
  std::vector<std::string> expected;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    RandomBatchOptions o = OptionsForSeed(seed);
    o.updates = 80;
    batches.push_back(RandomBatch(o));
    expected.push_back(PlanToJson(*planner.PlanBatch(batches.back())).dump());
  }
  std::vector<std::string> got(batches.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < batches.size(); i += 4) got[i] = PlanToJson(*planner.PlanBatch(batches[i])).dump();
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(got == expected);
}

TEST_CASE("FIFO plans keep capacities, bytes and order (no deadline promise)") {
  CheckOptions options;
  options.check_deadlines = false;
  options.check_replica = false;
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    RandomBatchOptions o = OptionsForSeed(seed);
    o.shards = 0;
    const Batch batch = RandomBatch(o);
    INFO("seed " << seed);
    auto plan = FifoPlanner().PlanBatch(batch);
    REQUIRE(plan.ok());
    const auto problems = CheckPlan(batch, *plan, options);
    INFO(Problems(problems));
    CHECK(problems.empty());
  }
}

TEST_CASE("Synchronous mode aggregates the list and drops nothing") {
  RandomBatchOptions o;
  o.sync = true;
  o.updates = 12;
  o.aggregators = 3;
  o.max_deadline = 1;  // deadlines would drop almost everything in async mode
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    o.seed = seed;
    const Batch batch = RandomBatch(o);
    INFO("seed " << seed);
    auto plan = MlfabricPlanner().PlanBatch(batch);
    REQUIRE(plan.ok());
    CHECK(plan->dropped.empty());
    CHECK(plan->order.size() == 12);
    // The list order is kept.
    for (size_t i = 0; i < plan->order.size(); ++i) CHECK(plan->order[i] == batch.updates[i].id);
  }
}

TEST_CASE("A round root's own contribution stays on its host (no NIC, no detour)") {
  // A synchronous AllReduce of two ranks, its root on h0: h0's update is a
  // copy in memory; routing it through h1's aggregator and back (three NIC
  // crossings) must never look better, whichever hosts may aggregate.
  for (const std::vector<std::string>& aggregators :
       std::vector<std::vector<std::string>>{{}, {"h1"}, {"h0", "h1"}}) {
    Batch batch;
    batch.mode = Mode::kSync;
    batch.server = "h0";
    batch.aggregators = aggregators;
    batch.hosts = {{"h0", 1e10, 1e10, {}, {}}, {"h1", 1e10, 1e10, {}, {}}};
    batch.updates = {{"g0", "h0", 4 << 20, 0, 1.0, {}}, {"g1", "h1", 4 << 20, 0, 1.0, {}}};
    INFO("aggregators " << aggregators.size());
    auto plan = MlfabricPlanner().PlanBatch(batch);
    REQUIRE(plan.ok());
    CHECK(Problems(CheckPlan(batch, *plan)).empty());
    int crossings = 0;
    for (const Transfer& t : plan->transfers) {
      INFO(t.update << " " << t.src << " -> " << t.dst);
      CHECK_FALSE((t.src == "h0" && t.dst == "h1"));
      crossings += t.src != t.dst;
    }
    CHECK(crossings == 1);  // h1's update, once
    // h0's own is in after a copy in memory, h1's once its 4 MiB crossed
    // at 10 Gbit/s.
    REQUIRE(plan->commits.size() == 2);
    CHECK(plan->commits[0].at_s == Approx(8.0 * (4 << 20) / kLocalCopyBps));
    CHECK(plan->commits[1].at_s == Approx(8.0 * (4 << 20) / 1e10));
  }
}

// Mean commit time (relative to now) of `order` scheduled one after another
// on the network, as Alg. 2 schedules a fixed order.
double MeanCommitOfOrder(const Batch& batch, const std::vector<int>& order) {
  Network net = Network::FromBatch(batch).value();
  const int server = net.HostIndex(batch.server);
  double commit = batch.now_s, sum = 0;
  for (int u : order) {
    const Path path = net.PathBetween(net.HostIndex(batch.updates[u].worker), server);
    FillResult fill = net.Fill(path, batch.now_s, 8.0 * batch.updates[u].bytes);
    net.Reserve(path, fill.segments);
    commit = std::max(commit, fill.end_s);
    sum += commit - batch.now_s;
  }
  return order.empty() ? 0 : sum / order.size();
}

TEST_CASE("Brute force: Alg. 2's order against the best order of the same updates") {
  const MlfabricPlanner planner;
  double ratio_sum = 0, worst = 1;
  uint64_t worst_seed = 0;
  int cases = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    RandomBatchOptions o;
    o.seed = seed;
    o.updates = 2 + static_cast<int>(seed % 6);  // 2..7
    o.workers = o.updates;
    o.profiles = seed % 2 == 0;
    const Batch batch = RandomBatch(o);
    INFO("seed " << seed);
    auto plan = planner.PlanBatch(batch);
    REQUIRE(plan.ok());
    std::vector<int> kept;
    for (const std::string& id : plan->order) {
      for (size_t u = 0; u < batch.updates.size(); ++u) {
        if (batch.updates[u].id == id) kept.push_back(static_cast<int>(u));
      }
    }
    if (kept.empty()) continue;
    const double mine = MeanCommitOfOrder(batch, kept);
    double plan_mean = 0;
    for (const Commit& c : plan->commits) plan_mean += c.at_s - batch.now_s;
    plan_mean /= plan->commits.size();
    // The plan's commits are exactly its order scheduled in turn.
    CHECK(plan_mean == Approx(mine).epsilon(1e-12));
    std::vector<int> perm = kept;
    std::sort(perm.begin(), perm.end());
    double best = mine;
    do {
      bool meets = true;
      for (size_t i = 0; i < perm.size(); ++i) {
        const UpdateRequest& u = batch.updates[perm[i]];
        meets = meets && static_cast<int64_t>(i + 1) <= u.version + batch.tau_max - batch.v_init;
      }
      if (meets) best = std::min(best, MeanCommitOfOrder(batch, perm));
    } while (std::next_permutation(perm.begin(), perm.end()));
    const double ratio = mine / best;
    CHECK(ratio >= 1.0 - 1e-12);
    ratio_sum += ratio;
    if (ratio > worst) {
      worst = ratio;
      worst_seed = seed;
    }
    ++cases;
  }
  std::cout << "brute force (<= 7 updates, " << cases << " batches): mean ratio "
            << ratio_sum / cases << ", worst " << worst << " (seed " << worst_seed << ")\n";
  CHECK(cases > 250);
}

}  // namespace
}  // namespace mlfabric::core
