// The scheduler under many daemons (issue 18 item 3), briefly: the load
// generator (testing/loadgen) drives a real mlfabric-scheduler over real
// gRPC with 300 emulated hosts, two servers and 20 named aggregators for a
// few seconds, then waits for every outcome. Correctness only (the figures
// are the benchmark's, testing/loadgen/README.md): every push ended exactly
// once, every get was answered, no stream broke, the servers applied
// exactly the pushes reported applied, and the scheduler's own counts
// (GET /api/v1/cluster) agree. The second case checks that the load
// generator itself can fail: a job token the scheduler does not know.
#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "nlohmann/json.hpp"
#include "launch/cluster.h"
#include "testing/http_client.h"
#include "testing/loadgen/load_generator.h"

namespace mlfabric {
namespace {

constexpr char kToken[] = "load-test-token-0123456789";

std::unique_ptr<launch::Cluster> StartScheduler() {
  launch::ClusterOptions options;
  options.admin = true;
  auto cluster = launch::Cluster::Create(options);
  REQUIRE(cluster.ok());
  const std::string config = (*cluster)->dir() + "/load.json";
  nlohmann::json aggregators = nlohmann::json::array();
  for (int i = 0; i < 20; ++i) {
    char name[16];
    std::snprintf(name, sizeof(name), "h%04d", i * 15);
    aggregators.push_back(name);
  }
  std::ofstream(config) << nlohmann::json{
      {"jobs",
       {{{"name", "load"}, {"token", kToken}, {"mode", "async"}, {"tau_max", 30},
         {"aggregators", aggregators}}}}}.dump();
  const absl::Status started = (*cluster)->Start({"--config=" + config});
  INFO(started.message());
  REQUIRE(started.ok());
  return std::move(*cluster);
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

}  // namespace
}  // namespace mlfabric
