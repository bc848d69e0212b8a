// Planning time charged to simulated time (mlfabric §7.4's scheduler
// overhead): MLfabric-A/S plans take effect at their cut plus the planning
// time, one batch at a time, unless SimConfig::instant_planning. A fake
// planner clock (PlanningTimeFn) makes the planning times known.
#include <cmath>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "eval/sim/systems.h"

namespace mlfabric::sim {
namespace {

constexpr double kSlowS = 0.35;  // the first batch's planning: over 3 intervals

SimConfig Small() {
  SimConfig config;
  config.workers = 6;
  config.aggregators = 2;
  config.max_sim_s = 3;
  config.target_accuracy = 0.99;  // unreachable: every run lasts max_sim_s
  config.network = NetworkSettingByName("N0").value();
  config.compute = ComputeSettingByName("C0").value();
  config.sgd.test_samples = 200;
  return config;
}

// A run with the fake clock: batch 0 plans for kSlowS, the others for 1 ms.
// `samples` gets every batch as the planner was handed it; `changes` the
// simulated times at which the sampled test accuracy changed.
struct Observed {
  SystemResult result;
  std::vector<PlanningSample> samples;
  std::vector<double> changes;
};
Observed RunWithFakeClock(const SimConfig& config, const std::string& system) {
  Observed o;
  auto clock = [&o](const PlanningSample& s) {
    o.samples.push_back(s);
    return s.batch == 0 ? kSlowS : 0.001;
  };
  double last_accuracy = -1;
  auto progress = [&](const std::string&, double sim_s, double accuracy) {
    if (last_accuracy >= 0 && accuracy != last_accuracy) o.changes.push_back(sim_s);
    last_accuracy = accuracy;
  };
  o.result = RunSystem(config, ParseSystem(system).value(), progress, clock).value();
  return o;
}

// Every gradient pushed ends applied or dropped or is still in flight, and
// every batch handed to the planner held pushes the run counted.
void CheckAccounting(const Observed& o, const SimConfig& config) {
  const SystemResult& r = o.result;
  CHECK(r.pushed > 0);
  CHECK(r.applied > 0);
  CHECK(r.applied + r.dropped + r.in_flight == r.pushed);
  int64_t batched = 0;
  for (const PlanningSample& s : o.samples) batched += s.updates;
  CHECK(batched <= r.pushed);
  // Not yet cut at the end: at most max_outstanding_pushes per worker.
  CHECK(r.pushed - batched <= 2 * config.workers);
  CHECK(r.planner_calls == static_cast<int64_t>(o.samples.size()));
  CHECK(r.fluid.max_link_load <= 1 + 1e-9);
}

TEST_CASE("a plan slower than the interval delays the next cut and its own effect") {
  const SimConfig config = Small();
  for (const std::string system : {"mlfabric-a-30", "mlfabric-s"}) {
    INFO("system " << system);
    const Observed o = RunWithFakeClock(config, system);
    REQUIRE(o.samples.size() >= 3);
    const double ready_s = o.samples[0].cut_s + kSlowS;
    // The planner is busy until ready_s: the next batch is cut at the first
    // tick after it, and the pushes that came meanwhile wait for that cut.
    CHECK(o.samples[1].cut_s >= ready_s);
    if (system == "mlfabric-a-30") {
      CHECK(o.samples[1].cut_s < ready_s + config.batch_interval_s);
    }
    CHECK(o.result.late_plans == 1);  // only batch 0 outlasted a tick
    // One batch at a time: no cut before the previous plan is ready.
    for (size_t i = 1; i < o.samples.size(); ++i) {
      const double previous = o.samples[i - 1].batch == 0 ? kSlowS : 0.001;
      CHECK(o.samples[i].cut_s >= o.samples[i - 1].cut_s + previous - 1e-9);
    }
    // Batch 0's plan (the first one) starts no transfer before ready_s, so
    // the server's model, and with it the sampled accuracy, is unchanged
    // until then.
    REQUIRE_FALSE(o.changes.empty());
    CHECK(o.changes.front() > ready_s);
    CHECK(o.result.planning_ms_max == Approx(1e3 * kSlowS));
    CHECK(o.result.planning_ms_p99 <= o.result.planning_ms_max);
    CHECK(o.result.planning_ms_mean < o.result.planning_ms_max);
    CheckAccounting(o, config);
  }
}

TEST_CASE("with instant planning the same planning times delay nothing") {
  SimConfig config = Small();
  config.instant_planning = true;
  const Observed o = RunWithFakeClock(config, "mlfabric-a-30");
  REQUIRE(o.samples.size() >= 3);
  const double ready_s = o.samples[0].cut_s + kSlowS;
  // Batches are cut while batch 0 would still be planned, and its plan
  // changed the model before it would have been ready.
  CHECK(o.samples[1].cut_s < ready_s);
  REQUIRE_FALSE(o.changes.empty());
  CHECK(o.changes.front() < ready_s);
  CHECK(o.result.late_plans == 0);
  // The planning times are reported all the same.
  CHECK(o.result.planning_ms_max == Approx(1e3 * kSlowS));
  CheckAccounting(o, config);
  // Instant planning is the earlier simulator: the planning-time source
  // does not matter.
  const SystemResult measured =
      RunSystem(config, ParseSystem("mlfabric-a-30").value()).value();
  CHECK(measured.pushed == o.result.pushed);
  CHECK(measured.applied == o.result.applied);
  CHECK(measured.model_versions == o.result.model_versions);
  CHECK(measured.accuracy_curve == o.result.accuracy_curve);
}

TEST_CASE("a plan lead covering the planning time keeps the plans' transfers on time") {
  // Every batch plans for 4 ms. Planned for its cut, a plan's first
  // transfers start 4 ms late and need a best-effort tail; planned for its
  // cut plus a lead of at least that, they start on their segments.
  auto run = [](double lead_ms) {
    SimConfig config = Small();
    config.plan_lead_ms = lead_ms;
    const auto clock = [](const PlanningSample&) { return 0.004; };
    return RunSystem(config, ParseSystem("mlfabric-a-30").value(), nullptr, clock).value();
  };
  const SystemResult at_cut = run(0), fixed = run(4), estimated = run(-1);
  INFO("late flows: " << at_cut.fluid.reserved_flows_late << " at the cut, "
                      << fixed.fluid.reserved_flows_late << " with 4 ms, "
                      << estimated.fluid.reserved_flows_late << " estimated");
  CHECK(at_cut.plan_lead_ms_mean == 0);
  CHECK(fixed.plan_lead_ms_mean == Approx(4));
  // The estimate is the longest of the last planning times: 0 before the
  // first plan, 4 ms after.
  CHECK(estimated.plan_lead_ms_mean < 4);
  CHECK(estimated.plan_lead_ms_mean > 3);
  CHECK(at_cut.fluid.reserved_flows_late > 0);
  CHECK(fixed.fluid.reserved_flows_late < at_cut.fluid.reserved_flows_late);
  CHECK(estimated.fluid.reserved_flows_late < at_cut.fluid.reserved_flows_late);
  for (const SystemResult* r : {&at_cut, &fixed, &estimated}) {
    CHECK(r->applied + r->dropped + r->in_flight == r->pushed);
  }
}

TEST_CASE("the measured planning time is charged and reported by default") {
  const SimConfig config = Small();
  const SystemResult r = RunSystem(config, ParseSystem("mlfabric-a-30").value()).value();
  CHECK(r.planner_calls > 0);
  CHECK(r.planning_ms_max > 0);  // CPU time of real planner calls
  CHECK(r.planning_ms_mean <= r.planning_ms_p99);
  CHECK(r.planning_ms_p99 <= r.planning_ms_max);
  CHECK(r.applied + r.dropped + r.in_flight == r.pushed);
}

TEST_CASE("a plan still being planned at the end is late and its pushes in flight") {
  // As at 1000 workers and 96 shards, where the first batch (~900 updates)
  // plans for longer than a short run lasts.
  const SimConfig config = Small();
  std::vector<PlanningSample> samples;
  const SystemResult r =
      RunSystem(config, ParseSystem("mlfabric-a-30").value(), nullptr,
                [&samples, &config](const PlanningSample& s) {
                  samples.push_back(s);
                  return 10 * config.max_sim_s;
                })
          .value();
  CHECK(samples.size() == 1);  // the planner never became free again
  CHECK(r.late_plans == 1);
  CHECK(r.applied == 0);
  CHECK(r.dropped == 0);
  CHECK(r.in_flight == r.pushed);
}

TEST_CASE("a negative planning time fails the run") {
  const SimConfig config = Small();
  const absl::StatusOr<SystemResult> r =
      RunSystem(config, ParseSystem("mlfabric-a-30").value(), nullptr,
                [](const PlanningSample&) { return -1.0; });
  CHECK_FALSE(r.ok());
}

}  // namespace
}  // namespace mlfabric::sim
