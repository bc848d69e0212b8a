// Smoke tests of the simulated systems (tiny, seconds long): structure and
// sanity, not speed.
#include "eval/sim/systems.h"

#include <cmath>
#include <string>

#include "catch2/catch.hpp"
#include "eval/sim/experiments.h"

namespace mlfabric::sim {
namespace {

SimConfig Tiny() {
  SimConfig config;
  config.workers = 6;
  config.aggregators = 2;
  config.max_sim_s = 4;
  config.target_accuracy = 0.99;  // unreachable: every run lasts max_sim_s
  config.network = NetworkSettingByName("N2").value();
  config.compute = ComputeSettingByName("C2").value();
  config.trace_period_s = 1;
  config.sgd.test_samples = 200;
  return config;
}

TEST_CASE("every system runs and accounts for every pushed gradient") {
  const SimConfig config = Tiny();
  for (const std::string name :
       {"mlfabric-a-30", "mlfabric-a-2", "mlfabric-s", "async", "rr-sync", "tr-sync"}) {
    INFO("system " << name);
    const SystemResult r = RunSystem(config, ParseSystem(name).value()).value();
    CHECK(r.system == name);
    CHECK(r.pushed > 0);
    CHECK(r.applied > 0);
    CHECK(r.applied + r.dropped + r.in_flight == r.pushed);
    CHECK(r.sim_end_s == Approx(config.max_sim_s));
    CHECK_FALSE(r.reached_target);
    CHECK(r.time_to_target_s == -1);
    CHECK(r.fluid.max_link_load <= 1 + 1e-9);
    CHECK(r.fluid.flows_started >= r.fluid.flows_completed);
    for (const auto& [t, accuracy] : r.accuracy_curve) {
      CHECK(t >= 0);
      CHECK(accuracy >= 0);
      CHECK(accuracy <= 1);
    }
    for (const auto& [delay, count] : r.delay_histogram) CHECK(delay >= 0);
    CHECK(r.final_accuracy > 0.2);  // real SGD learned something (10 classes)
  }
}

TEST_CASE("MLfabric-A uses the real planner, bounds delays and may drop") {
  SimConfig config = Tiny();
  const SystemResult r = RunSystem(config, ParseSystem("mlfabric-a-2").value()).value();
  CHECK(r.planner_calls > 0);
  CHECK(r.planner_mean_batch >= 1);
  CHECK(r.dropped > 0);  // a bound of 2 versions with 6 workers must drop
  int64_t dropped = 0;
  for (const auto& [reason, n] : r.drop_reasons) dropped += n;
  CHECK(dropped == r.dropped);
}

TEST_CASE("a run is deterministic for a seed") {
  const SimConfig config = Tiny();
  // The measured planning time varies from run to run; a fixed one does not.
  const PlanningTimeFn fixed = [](const PlanningSample&) { return 0.002; };
  for (const std::string name : {"mlfabric-a-30", "async", "rr-sync"}) {
    INFO("system " << name);
    nlohmann::json a =
        ResultToJson(RunSystem(config, ParseSystem(name).value(), nullptr, fixed).value());
    nlohmann::json b =
        ResultToJson(RunSystem(config, ParseSystem(name).value(), nullptr, fixed).value());
    for (const char* wall : {"wall_s", "planner_ms_mean", "planner_ms_max"}) {
      a.erase(wall);
      b.erase(wall);
    }
    CHECK(a.dump() == b.dump());
  }
  SimConfig other = config;
  other.seed = 2;
  const nlohmann::json x = ResultToJson(RunSystem(config, ParseSystem("async").value()).value());
  const nlohmann::json y = ResultToJson(RunSystem(other, ParseSystem("async").value()).value());
  CHECK(x["accuracy_curve"] != y["accuracy_curve"]);  // the seed matters
}

TEST_CASE("RR-Sync on a constant network matches the closed form") {
  SimConfig config = Tiny();
  config.workers = 5;
  config.compute = ComputeSettingByName("C0").value();
  config.network = NetworkSettingByName("N0").value();  // all 10 Gbit/s
  config.max_sim_s = 10;
  // compute + 2(N-1) steps of M/N bytes at 10 Gbit/s.
  const double round_s = config.compute_s + 2.0 * (config.workers - 1) *
                                                (8.0 * config.model_bytes / config.workers) / 10e9;
  const SystemResult r = RunSystem(config, ParseSystem("rr-sync").value()).value();
  CHECK(r.model_versions == static_cast<int64_t>(std::floor(config.max_sim_s / round_s)));
  CHECK(r.rounds_per_s == Approx(static_cast<double>(r.model_versions) / config.max_sim_s));
  // Same closed form with the slowest ring link at 1 Gbit/s (N3 forced to 1G).
  config.network.probabilities = {1, 0, 0, 0, 0};
  const double slow_round_s = config.compute_s + 2.0 * (config.workers - 1) *
                                                     (8.0 * config.model_bytes / config.workers) /
                                                     1e9;
  const SystemResult slow = RunSystem(config, ParseSystem("rr-sync").value()).value();
  CHECK(slow.model_versions == static_cast<int64_t>(std::floor(config.max_sim_s / slow_round_s)));
}

TEST_CASE("stragglers: a synchronous round waits for the slowest worker") {
  SimConfig config = Tiny();
  config.workers = 4;
  config.network = NetworkSettingByName("N0").value();
  config.compute = ComputeSettingByName("C0").value();
  config.max_sim_s = 20;
  const SystemResult fast = RunSystem(config, ParseSystem("rr-sync").value()).value();
  config.compute.straggler_probability = 1;  // every worker slowed by s = 2
  config.compute.slowdown = 2;
  const SystemResult slow = RunSystem(config, ParseSystem("rr-sync").value()).value();
  CHECK(slow.model_versions < fast.model_versions);
}

TEST_CASE("time to accuracy is reported when the target is reached") {
  SimConfig config = Tiny();
  config.target_accuracy = 0.3;
  config.max_sim_s = 60;
  const SystemResult r = RunSystem(config, ParseSystem("rr-sync").value()).value();
  REQUIRE(r.reached_target);
  CHECK(r.time_to_target_s > 0);
  CHECK(r.time_to_target_s == Approx(r.sim_end_s));
  CHECK(r.final_accuracy >= 0.3);
}

TEST_CASE("the Table 2 grid and the overhead mode have their shape") {
  SimConfig config = Tiny();
  config.max_sim_s = 1;
  const std::vector<Table2Cell> cells = RunTable2(config, "mlfabric-a-30").value();
  REQUIRE(cells.size() == 9);
  CHECK(cells[0].compute == "C1");
  CHECK(cells[0].network == "N1");
  CHECK(cells[3].paper == 2.96);
  CHECK(cells[8].compute == "C3");
  CHECK(cells[8].network == "N3");
  CHECK(Table2Report(cells).find("C2-N1") != std::string::npos);
  const std::vector<OverheadRow> rows = MeasureOverhead({10, 20}, 2, 1).value();
  REQUIRE(rows.size() == 2);
  CHECK(rows[1].hosts == 10);
  CHECK(rows[1].ms_mean >= 0);
}

TEST_CASE("calibration rows carry the paper's figures and the exact ring time") {
  // Tiny cluster: 6 workers on 3 machines; on C0-N0 a ring round is exactly
  // compute + 2(N-1) steps of (8M/N bits) at 10 Gbit/s.
  SimConfig config = Tiny();
  config.workers_per_host = 2;
  const std::vector<CalibrationRow> rows = RunCalibration(config).value();
  REQUIRE(rows.size() == 5);
  CHECK(rows[0].section == "§2");
  CHECK(rows[0].paper == 160);
  CHECK(rows[2].paper == 8);
  CHECK(rows[3].paper == 1300);
  CHECK(rows[4].paper == 30);
  const double comm_ms = 1000 * 2.0 * 5 * (8e8 / 6) / 10e9;
  CHECK(rows[0].sim == Approx(comm_ms));
  CHECK(rows[1].sim == Approx(1000 * config.compute_s + comm_ms));
  CHECK(rows[2].sim > 1);  // stragglers and slower links make rounds longer
  CHECK(CalibrationReport(rows).find("RR-Sync") != std::string::npos);
  CHECK(CalibrationToJson(rows).size() == 5);
}

TEST_CASE("pipelined async workers fill MLfabric-A batches with several updates") {
  // Stated config: 12 workers on 6 machines (2 per machine), aggregators on
  // every worker machine, no stragglers, all NICs 10 Gbit/s, 100 ms
  // batches, at most 2 outstanding pushes per worker, 3 simulated seconds.
  SimConfig config = Tiny();
  config.workers = 12;
  config.workers_per_host = 2;
  config.aggregators = -1;
  config.compute = ComputeSettingByName("C0").value();
  config.network = NetworkSettingByName("N0").value();
  config.max_outstanding_pushes = 2;
  config.max_sim_s = 3;
  const SystemResult r = RunSystem(config, ParseSystem("mlfabric-a-30").value()).value();
  CHECK(r.planner_calls > 0);
  CHECK(r.planner_mean_batch > 1.0);
  CHECK(r.applied + r.dropped + r.in_flight == r.pushed);
  CHECK(r.mean_get_s > 0);
  // Workers of one machine share it: some get answers and ring hops are
  // intra-host copies, and no NIC is ever overloaded.
  CHECK(r.fluid.max_link_load <= 1 + 1e-9);
  const SystemResult ring = RunSystem(config, ParseSystem("rr-sync").value()).value();
  CHECK(ring.fluid.intra_host_copies > 0);
  // Pipelining lets a worker push more gradients than the unpipelined bound 1.
  SimConfig unpipelined = config;
  unpipelined.max_outstanding_pushes = 1;
  const SystemResult one =
      RunSystem(unpipelined, ParseSystem("mlfabric-a-30").value()).value();
  CHECK(r.pushed >= one.pushed);
}

TEST_CASE("gets batched at the server form larger distribution batches than per tick") {
  // Stated config: 12 workers on 6 machines, k = 6 distributors, no
  // stragglers, all NICs 10 Gbit/s, 100 ms batches, 3 simulated seconds.
  // With 12 workers asking every ~0.2 s for a 100 MB model, the server's
  // 10 Gbit/s uplink (12.5 copies/s) is the bottleneck, so requests queue.
  SimConfig config = Tiny();
  config.workers = 12;
  config.workers_per_host = 2;
  config.aggregators = -1;
  config.compute = ComputeSettingByName("C0").value();
  config.network = NetworkSettingByName("N0").value();
  config.max_sim_s = 3;
  // Get batching alone: push plans take effect at their cut, so that the
  // planner's measured CPU time (planning_test.cc) neither shifts the
  // comparison nor makes it vary from run to run.
  config.instant_planning = true;
  config.get_batching = SimConfig::GetBatching::kTick;
  const SystemResult tick = RunSystem(config, ParseSystem("mlfabric-a-30").value()).value();
  config.get_batching = SimConfig::GetBatching::kServer;
  const SystemResult server = RunSystem(config, ParseSystem("mlfabric-a-30").value()).value();
  for (const SystemResult* r : {&tick, &server}) {
    REQUIRE(r->get_batches > 0);
    CHECK(r->get_server_sends >= r->get_batches);  // every batch leaves the server at least once
    CHECK(r->applied + r->dropped + r->in_flight == r->pushed);
    CHECK(r->fluid.max_link_load <= 1 + 1e-9);
  }
  // Requests that waited at the server are answered together: fewer, larger
  // batches, and fewer server copies per requesting machine.
  CHECK(server.get_batches < tick.get_batches);
  CHECK(server.get_batch_mean_machines > tick.get_batch_mean_machines);
  const double tick_copies =
      tick.get_server_sends / (tick.get_batch_mean_machines * tick.get_batches);
  const double server_copies =
      server.get_server_sends / (server.get_batch_mean_machines * server.get_batches);
  CHECK(server_copies < tick_copies);
  // Without distributors (k° = 0) every requesting machine gets its own
  // copy from the server.
  config.distributors = 0;
  const SystemResult direct = RunSystem(config, ParseSystem("mlfabric-a-30").value()).value();
  REQUIRE(direct.get_batches > 0);
  CHECK(direct.get_server_sends ==
        static_cast<int64_t>(std::llround(direct.get_batch_mean_machines * direct.get_batches)));
  CHECK(direct.applied + direct.dropped + direct.in_flight == direct.pushed);
}

TEST_CASE("host layout: workers share machines, aggregators on worker machines") {
  SimConfig config;  // the paper's 30 workers on 15 machines
  const HostLayout l = MakeLayout(config);
  CHECK(l.machines == 15);
  CHECK(l.server == 15);
  CHECK(l.aggregators == 15);
  CHECK(l.hosts == 16);
  CHECK(l.HostOf(0) == 0);
  CHECK(l.HostOf(1) == 0);
  CHECK(l.HostOf(29) == 14);
  config.aggregators_on_workers = false;
  config.aggregators = 4;
  const HostLayout d = MakeLayout(config);
  CHECK(d.hosts == 20);
  CHECK(d.aggregator_hosts.front() == 16);
  config.aggregators_on_workers = true;
  config.aggregators = 16;  // more than the 15 worker machines
  CHECK_FALSE(ValidateConfig(config).ok());
}

TEST_CASE("a model split over S servers: every part planned, applied and fetched together") {
  // 12 workers whose updates are bound by one server's slow NIC (1 Gbit/s,
  // no trace): with 3 shards on their own NICs each update is a third at
  // each, so MLfabric-A applies more gradients per second (§10.2). Without
  // aggregators, so that the shards alone make the difference (the next
  // case aggregates).
  SimConfig config = Tiny();
  config.workers = 12;
  config.aggregators = 0;
  config.network = NetworkSettingByName("N0").value();
  config.compute = ComputeSettingByName("C0").value();
  config.server_bps = 1e9;
  config.model_bytes = 10'000'001;  // not divisible by 3: parts differ by a byte
  const SystemResult one = RunSystem(config, ParseSystem("mlfabric-a-30").value()).value();
  config.servers = 3;
  const HostLayout l = MakeLayout(config);
  CHECK(l.server == 6);
  CHECK(l.hosts == 9);  // 6 machines, 3 servers (aggregators on the machines)
  for (const std::string name : {"mlfabric-a-30", "mlfabric-s"}) {
    INFO("system " << name);
    const SystemResult r = RunSystem(config, ParseSystem(name).value()).value();
    CHECK(r.applied > 0);
    CHECK(r.applied + r.dropped + r.in_flight == r.pushed);
    CHECK(r.fluid.max_link_load <= 1 + 1e-9);
    CHECK(r.aggregates == 0);
    CHECK(r.get_batches > 0);
    CHECK(r.get_server_sends >= 3 * r.get_batches);  // each shard sends its part
    CHECK(r.final_accuracy > 0.2);
  }
  const SystemResult three = RunSystem(config, ParseSystem("mlfabric-a-30").value()).value();
  CHECK(three.gradients_per_s > 1.5 * one.gradients_per_s);
  config.servers = 0;
  CHECK(ValidateConfig(config).message().find("servers") != std::string::npos);
}

TEST_CASE("a model split over S servers: aggregates deliver every constituent's part") {
  // The same slow shards (1 Gbit/s each), now with two aggregators on
  // worker machines: an aggregator sends each shard one aggregate of its
  // part for a whole group, which applies more than every part direct.
  SimConfig config = Tiny();
  config.workers = 12;
  config.network = NetworkSettingByName("N0").value();
  config.compute = ComputeSettingByName("C0").value();
  config.server_bps = 1e9;
  config.model_bytes = 10'000'001;
  config.servers = 3;
  config.aggregators = 0;
  const SystemResult direct = RunSystem(config, ParseSystem("mlfabric-a-30").value()).value();
  CHECK(direct.aggregates == 0);
  config.aggregators = 2;
  for (const bool streaming : {true, false}) {  // no chains for sharded updates either way
    config.streaming_aggregation = streaming;
    for (const std::string name : {"mlfabric-a-30", "mlfabric-s"}) {
      INFO("system " << name << (streaming ? "" : ", alg3"));
      const SystemResult r = RunSystem(config, ParseSystem(name).value()).value();
      CHECK(r.applied > 0);
      CHECK(r.applied + r.dropped + r.in_flight == r.pushed);
      CHECK(r.fluid.max_link_load <= 1 + 1e-9);
      CHECK(r.aggregates > 0);
      CHECK(r.aggregates % 3 == 0);  // one per shard for every group
      CHECK(r.empty_segments == 0);
      CHECK(r.final_accuracy > 0.2);
      if (name == "mlfabric-a-30") CHECK(r.gradients_per_s > 1.2 * direct.gradients_per_s);
    }
  }
}

TEST_CASE("bad names and configs are errors") {
  CHECK_FALSE(ParseSystem("sgd").ok());
  CHECK_FALSE(ParseSystem("mlfabric-a-x").ok());
  CHECK_FALSE(ComputeSettingByName("C9").ok());
  SimConfig config = Tiny();
  config.workers = 1;
  CHECK_FALSE(RunSystem(config, ParseSystem("async").value()).ok());
}

}  // namespace
}  // namespace mlfabric::sim
