#include "scheduler/core/fifo_planner.h"

#include <catch2/catch.hpp>

namespace mlfabric::core {
namespace {

Batch TwoWorkerBatch() {
  Batch batch;
  batch.now_s = 10.0;
  batch.server = "s1";
  batch.hosts = {{"s1", 1e9, 1e9, {}, {}}, {"w1", 1e8, 1e8, {}, {}}, {"w2", 1e9, 1e9, {}, {}}};
  batch.updates = {{"g1", "w1", 1000000, 5, 1.0}, {"g2", "w2", 1000000, 5, 1.0}};
  return batch;
}

TEST_CASE("FIFO keeps arrival order and serialises the server link") {
  auto plan = FifoPlanner().PlanBatch(TwoWorkerBatch());
  REQUIRE(plan.ok());
  REQUIRE(plan->order == std::vector<std::string>{"g1", "g2"});
  REQUIRE(plan->transfers.size() == 2);
  // g1 is limited by w1's 100 Mbit/s uplink: 8 Mbit take 80 ms.
  CHECK(plan->transfers[0].start_s == Approx(10.0));
  CHECK(plan->transfers[0].end_s == Approx(10.08));
  // g2 starts when the server link frees and runs at 1 Gbit/s.
  CHECK(plan->transfers[1].start_s == Approx(10.08));
  CHECK(plan->transfers[1].end_s == Approx(10.088));
  CHECK(plan->commits[1].position == 2);
  CHECK(plan->dropped.empty());
}

TEST_CASE("FIFO holds the lowest rate a profile offers") {
  Batch batch = TwoWorkerBatch();
  batch.hosts[1].uplink_profile = {{0.0, 1e8}, {10.05, 5e7}};
  auto plan = FifoPlanner().PlanBatch(batch);
  REQUIRE(plan.ok());
  CHECK(plan->transfers[0].segments[0].rate_bps == Approx(5e7));
}

TEST_CASE("Invalid batches name the offending field") {
  Batch batch = TwoWorkerBatch();
  batch.updates[1].bytes = -3;
  auto plan = FifoPlanner().PlanBatch(batch);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.status().message().find("updates[1].bytes") != std::string::npos);

  batch = TwoWorkerBatch();
  batch.updates[0].worker = "nowhere";
  plan = FifoPlanner().PlanBatch(batch);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.status().message().find("updates[0].worker") != std::string::npos);
}

}  // namespace
}  // namespace mlfabric::core
