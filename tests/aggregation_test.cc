// In-network aggregation across real processes (mlfabric.md §5.2): with a
// slow server link and an aggregator host, the MLfabric planner routes
// updates through the aggregator's daemon, which sums them and forwards one
// aggregate; the server must still end with the exact sum, every push
// applied. Killing the aggregator fails its in-flight pushes in bounded
// time, and later pushes go direct.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "testing/cluster.h"
#include "testing/http_client.h"
#include "tests/test_util.h"
#include "tools/launch/process.h"

namespace mlfabric {
namespace {

using launch::BinaryPath;
using launch::ReadFile;
using launch::Subprocess;
using launch::WaitUntil;
using testing::ReadVector;

std::string AggregatingConfig() {
  char path[] = "/tmp/mlfabric-agg-config-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  std::ofstream(path) << R"({"planner": "mlfabric",
    "jobs": [{"name": "demo", "token": "demo-token", "tau_max": 100000, "aggregators": ["a1"]}]})";
  return path;
}

// The server's downlink is 10x slower than everyone else's links, so
// sending several updates through a1 and one aggregate to s1 beats sending
// them one after the other.
std::map<std::string, std::vector<std::string>> SlowServer() {
  return {{"s1", {"--downlink_bps=1e9"}}};
}

TEST_CASE("Aggregated updates sum exactly at the server, all applied") {
  const std::string config = AggregatingConfig();
  auto cluster = testing::Cluster::StartLoopback(
      {"s1", "a1", "w1", "w2", "w3"}, {"--config=" + config}, {}, SlowServer());
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  testing::Cluster& c = **cluster;
  const int kPushes = 20, kDim = 262144;  // 1 MiB updates
  const std::string model_path = c.dir() + "/model.txt";
  auto server = c.StartApp("server", {BinaryPath("testing/apps/sum_server"),
                                      "--socket=" + c.Socket("s1"), "--dim=" + std::to_string(kDim),
                                      "--expect_updates=" + std::to_string(3 * kPushes),
                                      "--out=" + model_path});
  REQUIRE(server.ok());
  std::vector<Subprocess*> workers;
  for (int w = 1; w <= 3; ++w) {
    const std::string name = "w" + std::to_string(w);
    auto worker = c.StartApp(
        name, {BinaryPath("testing/apps/vector_worker"), "--socket=" + c.Socket(name),
               "--name=" + name, "--seed=" + std::to_string(10 + w), "--dim=" + std::to_string(kDim),
               "--pushes=" + std::to_string(kPushes), "--window=8",
               "--out=" + c.dir() + "/sum" + name + ".txt"});
    REQUIRE(worker.ok());
    workers.push_back(*worker);
  }
  for (Subprocess* worker : workers) {
    auto code = worker->WaitFor(120);
    INFO(worker->Log());
    REQUIRE(code.has_value());
    CHECK(*code == 0);
  }
  REQUIRE(WaitUntil([&] { return !ReadFile(model_path).empty(); }, 30));
  std::vector<double> expected(kDim, 0.0);
  for (int w = 1; w <= 3; ++w) {
    auto sum = ReadVector(c.dir() + "/sumw" + std::to_string(w) + ".txt");
    REQUIRE(sum.size() == static_cast<size_t>(kDim));
    for (int i = 0; i < kDim; ++i) expected[i] += sum[i];
  }
  auto model = ReadVector(model_path);
  REQUIRE(model.size() == static_cast<size_t>(kDim));
  int mismatches = 0;
  for (int i = 0; i < kDim; ++i) mismatches += model[i] != expected[i];
  CHECK(mismatches == 0);
  // Some deliveries really were aggregates summed by a1's daemon.
  const int aggregates = testing::CountOccurrences((*server)->Log(), "sum_server: aggregate of");
  INFO((*server)->Log());
  CHECK(aggregates > 0);
  std::printf("aggregation_test: %d of the server's deliveries were in-network aggregates\n",
              aggregates);
  std::remove(config.c_str());
}

// Streaming chains (core/aggregation.h): the workers themselves may
// aggregate, so a batch of updates from w1..w3 goes w_a -> w_b -> w_c -> s1,
// each worker's daemon adding its own update to the partial sum streaming
// through it. Integer-valued updates make the sum exact whatever the
// grouping; the server applies in commit order (the daemon's sequencer)
// and every push ends applied.
TEST_CASE("Streaming chains: updates through multi-hop partial sums sum exactly at the server") {
  testing::ClusterOptions options;
  options.hosts = {"s1", "w1", "w2", "w3"};
  options.admin = true;  // the chain hops are counted there
  auto created = testing::Cluster::Create(options);
  INFO(created.status().ToString());
  REQUIRE(created.ok());
  testing::Cluster& c = **created;
  const std::string config = c.dir() + "/scheduler.json";
  std::ofstream(config) << R"({"planner": "mlfabric", "jobs": [{"name": "demo",
    "token": "demo-token", "tau_max": 100000, "aggregators": ["w1", "w2", "w3"]}]})";
  const absl::Status started = c.Start({"--config=" + config}, {}, SlowServer());
  INFO(started.ToString());
  REQUIRE(started.ok());
  const int kPushes = 20, kDim = 262144;  // 1 MiB updates
  const std::string model_path = c.dir() + "/model.txt";
  auto server = c.StartApp("server", {BinaryPath("testing/apps/sum_server"),
                                      "--socket=" + c.Socket("s1"), "--dim=" + std::to_string(kDim),
                                      "--expect_updates=" + std::to_string(3 * kPushes),
                                      "--out=" + model_path});
  REQUIRE(server.ok());
  std::vector<Subprocess*> workers;
  for (int w = 1; w <= 3; ++w) {
    const std::string name = "w" + std::to_string(w);
    auto worker = c.StartApp(
        name, {BinaryPath("testing/apps/vector_worker"), "--socket=" + c.Socket(name),
               "--name=" + name, "--seed=" + std::to_string(20 + w), "--dim=" + std::to_string(kDim),
               "--pushes=" + std::to_string(kPushes), "--window=8",
               "--out=" + c.dir() + "/sum" + name + ".txt"});
    REQUIRE(worker.ok());
    workers.push_back(*worker);
  }
  for (Subprocess* worker : workers) {
    auto code = worker->WaitFor(120);
    INFO(worker->Log());
    REQUIRE(code.has_value());
    CHECK(*code == 0);  // every push applied
  }
  REQUIRE(WaitUntil([&] { return !ReadFile(model_path).empty(); }, 30));
  std::vector<double> expected(kDim, 0.0);
  for (int w = 1; w <= 3; ++w) {
    auto sum = ReadVector(c.dir() + "/sumw" + std::to_string(w) + ".txt");
    REQUIRE(sum.size() == static_cast<size_t>(kDim));
    for (int i = 0; i < kDim; ++i) expected[i] += sum[i];
  }
  auto model = ReadVector(model_path);
  REQUIRE(model.size() == static_cast<size_t>(kDim));
  int mismatches = 0;
  for (int i = 0; i < kDim; ++i) mismatches += model[i] != expected[i];
  CHECK(mismatches == 0);
  // Partial sums did stream from worker to worker: chain hops were
  // dispatched, and the server received aggregates of more updates than
  // one worker has in flight (8), so of several workers' updates.
  const testing::HttpResult stats = testing::Http(c.admin_port(), "GET", "/api/v1/cluster");
  REQUIRE(stats.status == 200);
  const nlohmann::json json = nlohmann::json::parse(stats.body);
  INFO(stats.body);
  const int64_t hops = json["stats"]["chain_hops"].get<int64_t>();
  CHECK(hops > 0);
  const std::string log = (*server)->Log();
  INFO(log);
  int deliveries = 0, largest = 0;
  const std::string mark = "sum_server: aggregate of ";
  for (size_t at = log.find(mark); at != std::string::npos; at = log.find(mark, at + 1)) {
    ++deliveries;
    largest = std::max(largest, std::atoi(log.c_str() + at + mark.size()));
  }
  CHECK(largest > 8);
  std::printf("aggregation_test: %lld chain hops; %d aggregates delivered, the largest of %d updates\n",
              static_cast<long long>(hops), deliveries, largest);
}

TEST_CASE("Killing the aggregator fails its pushes; later pushes go direct") {
  const std::string config = AggregatingConfig();
  auto cluster = testing::Cluster::StartLoopback(
      {"s1", "a1", "w1", "w2"}, {"--config=" + config}, {}, SlowServer());
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  testing::Cluster& c = **cluster;
  auto server = c.StartApp("server", {BinaryPath("testing/apps/sum_server"),
                                      "--socket=" + c.Socket("s1"), "--dim=262144",
                                      "--progress_every=1"});
  REQUIRE(server.ok());
  std::vector<Subprocess*> workers;
  for (const std::string name : {"w1", "w2"}) {
    auto worker = c.StartApp(name, {BinaryPath("testing/apps/vector_worker"),
                                    "--socket=" + c.Socket(name), "--name=" + name,
                                    "--dim=262144", "--pushes=100000", "--window=8",
                                    "--get=false"});
    REQUIRE(worker.ok());
    workers.push_back(*worker);
  }
  REQUIRE(WaitUntil(
      [&] { return (*server)->Log().find("sum_server: aggregate of") != std::string::npos; }, 60));
  // The kill must find an aggregate in flight at a1 (one that completed
  // before it would fail nothing). Stopped, a1 keeps the next aggregate
  // the planner gives it; the server applies updates strictly in commit
  // order, so it stalls at that aggregate's position: once its log stops
  // growing, an aggregate is waiting at a1.
  c.daemon("a1").Signal(SIGSTOP);
  std::string seen = (*server)->Log();
  int quiet_polls = 0;
  const bool stalled = WaitUntil(
      [&] {
        const std::string now = (*server)->Log();
        quiet_polls = now == seen ? quiet_polls + 1 : 0;
        seen = now;
        return quiet_polls >= 50;  // 50 polls of 20 ms: 1 s without a delivery
      },
      60);
  REQUIRE(stalled);
  c.daemon("a1").Signal(SIGKILL);
  // A worker with pushes routed through a1 sees them fail (it stops at the
  // first) instead of hanging. Which workers had pushes there is the
  // planner's choice; a worker whose pushes all went direct keeps going.
  Subprocess* failed = nullptr;
  for (int waited = 0; failed == nullptr && waited < 60; ++waited) {
    for (Subprocess* worker : workers) {
      if (worker->WaitFor(0.5).has_value()) failed = worker;
    }
  }
  REQUIRE(failed != nullptr);
  INFO(failed->Log());
  CHECK(failed->WaitFor(0).value_or(-1) == 3);
  CHECK(failed->Log().find("push failed") != std::string::npos);
  for (Subprocess* worker : workers) {
    if (!worker->WaitFor(0).has_value()) worker->Signal(SIGTERM);
    CHECK(worker->WaitFor(30).has_value());
  }
  // With a1 gone, new pushes are planned direct and apply.
  auto later = c.StartApp("w1-later", {BinaryPath("testing/apps/vector_worker"),
                                       "--socket=" + c.Socket("w1"), "--name=w1b",
                                       "--dim=262144", "--pushes=5"});
  REQUIRE(later.ok());
  auto code = (*later)->WaitFor(60);
  INFO((*later)->Log());
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  std::remove(config.c_str());
}

}  // namespace
}  // namespace mlfabric
