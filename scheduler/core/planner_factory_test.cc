#include "scheduler/core/planner_factory.h"

#include <catch2/catch.hpp>

namespace mlfabric::core {
namespace {

TEST_CASE("The factory knows fifo and mlfabric") {
  for (const std::string& name : KnownPlannerNames()) {
    auto planner = MakePlanner(name);
    REQUIRE(planner.ok());
    CHECK((*planner)->Name() == name);
  }
  CHECK(KnownPlannerNames() == std::vector<std::string>{"fifo", "mlfabric"});
}

TEST_CASE("Unknown planner names are an error that lists the known ones") {
  auto planner = MakePlanner("sjf");
  REQUIRE_FALSE(planner.ok());
  CHECK(planner.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(planner.status().message()) ==
        "unknown planner 'sjf'; known planners: fifo, mlfabric");
}

TEST_CASE("Both planners reject an invalid batch naming the field") {
  Batch batch;
  batch.server = "s";
  batch.hosts = {{"s", 1e9, 1e9, {}, {}}};
  batch.updates = {{"g", "nowhere", 10, 0, 1, {}}};
  for (const std::string& name : KnownPlannerNames()) {
    auto plan = MakePlanner(name).value()->PlanBatch(batch);
    REQUIRE_FALSE(plan.ok());
    CHECK(std::string(plan.status().message()).find("updates[0].worker") == 0);
  }
}

}  // namespace
}  // namespace mlfabric::core
