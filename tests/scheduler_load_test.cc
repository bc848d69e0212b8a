// The scheduler under many daemons, briefly: the load
// generator (testing/loadgen) drives a real mlfabric-scheduler over real
// gRPC with 300 emulated hosts, two servers and 20 named aggregators for a
// few seconds, then waits for every outcome: every push ended exactly
// once, every get was answered, no stream broke, the servers applied
// exactly the pushes reported applied, and the scheduler's own counts
// (GET /api/v1/cluster) agree. The second case checks that the load
// generator itself can fail: a job token the scheduler does not know.
// The third offers two jobs (one on a 4-shard server group) a quarter of
// what their links carry, and checks that most pushes are applied; the
// fourth that a scheduler that falls behind (batches every 2 s) drops
// enough of them as stale to fail that bound (the figures at 1000 workers
// are the benchmark's, testing/loadgen/README.md).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>
#include <thread>

#include "nlohmann/json.hpp"
#include "launch/cluster.h"
#include "testing/http_client.h"
#include "testing/loadgen/load_generator.h"

namespace mlfabric {
namespace {

constexpr char kToken[] = "load-test-token-0123456789";

std::unique_ptr<launch::Cluster> StartScheduler(const nlohmann::json& jobs,
                                                const std::vector<std::string>& flags = {}) {
  launch::ClusterOptions options;
  options.admin = true;
  auto cluster = launch::Cluster::Create(options);
  REQUIRE(cluster.ok());
  const std::string config = (*cluster)->dir() + "/load.json";
  std::ofstream(config) << nlohmann::json{{"jobs", jobs}}.dump();
  std::vector<std::string> all_flags = {"--config=" + config};
  all_flags.insert(all_flags.end(), flags.begin(), flags.end());
  const absl::Status started = (*cluster)->Start(all_flags);
  INFO(started.message());
  REQUIRE(started.ok());
  return std::move(*cluster);
}

// Job "load": 20 named aggregators among 300 hosts, tau_max 30.
std::unique_ptr<launch::Cluster> StartScheduler() {
  nlohmann::json aggregators = nlohmann::json::array();
  for (int i = 0; i < 20; ++i) {
    char name[16];
    std::snprintf(name, sizeof(name), "h%04d", i * 15);
    aggregators.push_back(name);
  }
  return StartScheduler({{{"name", "load"}, {"token", kToken}, {"mode", "async"},
                          {"tau_max", 30}, {"aggregators", aggregators}}});
}

testing::LoadOptions Options(launch::Cluster& cluster) {
  testing::LoadOptions options;
  options.scheduler_address = cluster.scheduler_address();
  std::ifstream(cluster.dir() + "/cluster.secret") >> options.cluster_secret;
  options.job = "load";
  options.job_token = kToken;
  options.workers = 300;
  options.servers = 2;
  options.update_bytes = 10'000'000;
  options.driver_threads = 4;
  return options;
}

TEST_CASE("300 emulated daemons: every push ends once, every get is answered") {
  std::unique_ptr<launch::Cluster> cluster = StartScheduler();
  testing::LoadGenerator load(Options(*cluster));
  const absl::Status started = load.Start();
  INFO(started.message());
  REQUIRE(started.ok());
  std::this_thread::sleep_for(std::chrono::seconds(5));
  const testing::LoadReport report = load.Drain(120);
  for (const std::string& problem : report.Problems()) UNSCOPED_INFO(problem);
  CHECK(report.Consistent());
  CHECK(report.hosts == 302);
  CHECK(report.pushes > 300);
  CHECK(report.applied > 0);
  CHECK(report.applied + report.dropped + report.failed == report.pushes);
  CHECK(report.distributions > 0);
  CHECK(report.commands > report.pushes);  // every push has at least its outcome

  const testing::HttpResult r = testing::Http(cluster->admin_port(), "GET", "/api/v1/cluster");
  REQUIRE(r.status == 200);
  const nlohmann::json stats = nlohmann::json::parse(r.body)["stats"];
  CHECK(stats["applied"].get<int64_t>() == report.applied);
  CHECK(stats["dropped"].get<int64_t>() + stats["failed"].get<int64_t>() ==
        report.dropped + report.failed);
  CHECK(stats["outcome_contradicted"].get<int64_t>() == 0);
  const testing::HttpResult cycles = testing::Http(cluster->admin_port(), "GET", "/api/v1/cycles");
  REQUIRE(cycles.status == 200);
  const nlohmann::json body = nlohmann::json::parse(cycles.body);
  CHECK(!body["cycles"].empty());
  CHECK(body["p99_ms"].get<double>() >= body["p50_ms"].get<double>());
}

TEST_CASE("The load generator reports what the scheduler refused") {
  std::unique_ptr<launch::Cluster> cluster = StartScheduler();
  testing::LoadOptions options = Options(*cluster);
  options.workers = 4;
  options.job_token = "not-the-token";
  testing::LoadGenerator load(options);
  const absl::Status started = load.Start();
  CHECK(started.code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(started.message()).find("server ps0: RegisterEntity") != std::string::npos);
}

// The update size at which the busiest link (a shard's downlink, or a
// worker's uplink) carries `load` of its rate when each of a target's
// `workers` pushes once per period: 8 * bytes / shards * workers / period
// = load * link_bps. Whole float32 elements.
int64_t UpdateBytesFor(double load, const testing::LoadOptions& o, int workers_per_target) {
  const double per_period = o.link_bps * o.period_s / 8;
  const double bytes = load * std::min(per_period * o.shards / workers_per_target, per_period);
  return static_cast<int64_t>(bytes / 4) * 4;
}

// Job "group": 40 workers on one 4-shard server group; job "plain": 40
// workers on two servers; updates sized so that the busiest links carry a
// quarter of their rate. tau_max follows the load generator's rule
// (testing/loadgen/main.cc, ChooseDefaults): a push's delay is about the
// pushes its target applies while it computes and waits for a batch,
// W * (period + batch interval) / period = 2 W here, and tau_max is twice
// that. Runs `seconds` of load, then waits for every outcome.
constexpr int kWorkers = 40;
constexpr double kLoad = 0.25;

testing::LoadReport RunTwoJobs(const std::vector<std::string>& scheduler_flags, int seconds) {
  std::unique_ptr<launch::Cluster> cluster = StartScheduler(
      {{{"name", "group"}, {"token", kToken}, {"mode", "async"}, {"tau_max", 4 * kWorkers}},
       {{"name", "plain"}, {"token", kToken}, {"mode", "async"}, {"tau_max", 4 * kWorkers / 2}}},
      scheduler_flags);
  testing::LoadOptions group = Options(*cluster);
  group.job = "group";
  group.host_prefix = "g-";
  group.workers = kWorkers;
  group.servers = 1;
  group.shards = 4;
  group.update_bytes = UpdateBytesFor(kLoad, group, kWorkers);
  testing::LoadOptions plain = Options(*cluster);
  plain.job = "plain";
  plain.host_prefix = "p-";
  plain.workers = kWorkers;
  plain.servers = 2;
  plain.update_bytes = UpdateBytesFor(kLoad, plain, kWorkers / 2);
  testing::LoadGenerator group_load(group), plain_load(plain);
  for (testing::LoadGenerator* load : {&group_load, &plain_load}) {
    const absl::Status started = load->Start();
    INFO(started.message());
    REQUIRE(started.ok());
  }
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  group_load.StopLoad();
  plain_load.StopLoad();
  testing::LoadReport report = group_load.Drain(120);
  report.Add(plain_load.Drain(120));
  return report;
}

// Every push ended: applied, dropped with a reason, or failed; none lost.
void CheckEveryPushEnded(const testing::LoadReport& report) {
  for (const std::string& problem : report.Problems()) UNSCOPED_INFO(problem);
  CHECK(report.Consistent());  // none lost, none twice, every shard applied the same
  REQUIRE(report.pushes > 2 * kWorkers);
  CHECK(report.without_outcome == 0);
  CHECK(report.applied + report.dropped + report.failed == report.pushes);
  int64_t with_reason = 0;
  for (const auto& [reason, count] : report.reasons) {
    CHECK(!reason.empty());
    with_reason += count;
  }
  CHECK(with_reason == report.dropped + report.failed);
}

double AppliedFraction(const testing::LoadReport& report) {
  for (const auto& [reason, count] : report.reasons) UNSCOPED_INFO(reason << ": " << count);
  UNSCOPED_INFO("pushes " << report.pushes << ", applied " << report.applied << ", dropped "
                          << report.dropped << ", failed " << report.failed);
  const double fraction = static_cast<double>(report.applied) / static_cast<double>(report.pushes);
  std::cout << "applied " << report.applied << " of " << report.pushes << " pushes: " << fraction
            << std::endl;
  return fraction;
}

// The links carry four times the offered load and tau_max twice the
// expected delay, so a scheduler that keeps up applies nearly every push
// (1.000 on an idle 2-core machine, and with three busy loops beside it).
// One that falls behind drops pushes as stale: planning every 2 s instead
// of every 100 ms applies about 0.26 (next case; 0.26 with the busy loops
// too), planning once a second about 0.43 (0.61 once on a machine loaded
// by a build, which is why the case plans every 2 s), and updates 40
// times larger than here (the links ten times over capacity) about 0.37.
// (Far larger updates do not go lower in a run this short: workers wait
// so long for the model that they push rarely.) The bound sits between.
constexpr double kMinAppliedFraction = 0.6;
constexpr int kBehindIntervalMs = 2000;

TEST_CASE("Two jobs at a quarter of their links' capacity: most pushes are applied") {
  const testing::LoadReport report = RunTwoJobs({}, 4);
  CheckEveryPushEnded(report);
  CHECK(AppliedFraction(report) > kMinAppliedFraction);
}

TEST_CASE("A scheduler that falls behind applies fewer pushes than the bound") {
  // Batches every 2 s, as if every cycle took 2 s: about twenty periods
  // of every worker's pushes wait for one batch, of which at most tau_max
  // (four periods' worth) have positions before their deadlines (§5.1).
  const testing::LoadReport report =
      RunTwoJobs({"--batch_interval_ms=" + std::to_string(kBehindIntervalMs)}, 4);
  CheckEveryPushEnded(report);
  CHECK(report.reasons.count("stale") > 0);
  CHECK(AppliedFraction(report) < kMinAppliedFraction);
}

}  // namespace
}  // namespace mlfabric
