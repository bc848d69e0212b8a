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
#include <chrono>
#include <map>
#include <thread>
#include <nlohmann/json.hpp>

#include "launch/cluster.h"
#include "launch/process.h"
#include "testing/http_client.h"
#include "tests/test_util.h"

namespace mlfabric {
namespace {

using launch::BinaryPath;
using launch::ReadFile;
using launch::Subprocess;
using launch::WaitUntil;

std::string AggregatingConfig() {
  char path[] = "/tmp/mlfabric-agg-config-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  std::ofstream(path) << R"({"planner": "mlfabric",
    "jobs": [{"name": "demo", "token": "demo-token-0123456789", "tau_max": 100000, "aggregators": ["a1"]}]})";
  return path;
}

// The server's downlink is 10x slower than everyone else's links, so
// sending several updates through a1 and one aggregate to s1 beats sending
// them one after the other.
std::map<std::string, std::vector<std::string>> SlowServer() {
  return {{"s1", {"--downlink_bps=1e9"}}};
}

const char* const kAggregateMark = "sum_server: aggregate of ";

// w1..w3 push 20 integer-valued 1 MiB updates each (8 in flight) to
// sum_server on s1; every push must end applied and the model must be the
// exact sum whatever was aggregated where. Returns the server's log.
std::string SumThreeWorkers(launch::Cluster& c, int seed) {
  const int kPushes = 20, kDim = 262144;
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
               "--name=" + name, "--seed=" + std::to_string(seed + w), "--dim=" + std::to_string(kDim),
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
  CHECK(testing::SumMismatches(model_path, c.dir(), {"w1", "w2", "w3"}, kDim) == 0);
  return (*server)->Log();
}

// How many updates each aggregate delivered to the server carried.
std::vector<int> AggregateSizes(const std::string& server_log) {
  std::vector<int> sizes;
  const std::string mark = kAggregateMark;
  for (size_t at = server_log.find(mark); at != std::string::npos;
       at = server_log.find(mark, at + 1)) {
    sizes.push_back(std::atoi(server_log.c_str() + at + mark.size()));
  }
  return sizes;
}

// SIGSTOPs `host`'s daemon and waits until the server (which applies in
// commit order) has delivered nothing for 1 s, so that an aggregate is
// waiting there, then kills it. If deliveries go on for 2.5 s, nothing
// was waiting there at that moment: it resumes the daemon and tries again.
void KillWhileHolding(launch::Cluster& c, Subprocess* server, const std::string& host) {
  for (int attempt = 0; attempt < 10; ++attempt) {
    c.daemon(host).Signal(SIGSTOP);
    std::string seen = server->Log();
    int quiet_polls = 0;
    const bool stalled = WaitUntil(
        [&] {
          const std::string now = server->Log();
          quiet_polls = now == seen ? quiet_polls + 1 : 0;
          seen = now;
          return quiet_polls >= 50;  // 50 polls of 20 ms
        },
        2.5);
    if (stalled) {
      c.daemon(host).Signal(SIGKILL);
      return;
    }
    c.daemon(host).Signal(SIGCONT);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  FAIL("the server never waited for " << host << " in 10 tries");
}

// A sum_server on s1 that logs every delivery, for the kill tests.
Subprocess* StartLoggingServer(launch::Cluster& c) {
  auto server = c.StartApp("server", {BinaryPath("testing/apps/sum_server"),
                                      "--socket=" + c.Socket("s1"), "--dim=262144",
                                      "--progress_every=1"});
  REQUIRE(server.ok());
  return *server;
}

// A worker on `host` that pushes 1 MiB updates (8 in flight) until the
// first push that does not end applied, or `pushes` of them.
Subprocess* StartPusher(launch::Cluster& c, const std::string& host, const std::string& name,
                        int pushes = 100000, int window = 8) {
  auto worker = c.StartApp(name, {BinaryPath("testing/apps/vector_worker"),
                                  "--socket=" + c.Socket(host), "--name=" + name,
                                  "--dim=262144", "--pushes=" + std::to_string(pushes),
                                  "--window=" + std::to_string(window), "--get=false"});
  REQUIRE(worker.ok());
  return *worker;
}

// s1 and three workers that may aggregate (streaming chains), the
// scheduler's admin endpoint on.
std::unique_ptr<launch::Cluster> StartChainCluster(
    const std::map<std::string, std::vector<std::string>>& host_flags) {
  launch::ClusterOptions options;
  options.hosts = {"s1", "w1", "w2", "w3"};
  options.admin = true;
  auto created = launch::Cluster::Create(options);
  INFO(created.status().ToString());
  REQUIRE(created.ok());
  const std::string config = (*created)->dir() + "/scheduler.json";
  std::ofstream(config) << R"({"planner": "mlfabric", "jobs": [{"name": "demo",
    "token": "demo-token-0123456789", "tau_max": 100000, "aggregators": ["w1", "w2", "w3"]}]})";
  const absl::Status started = (*created)->Start({"--config=" + config}, {}, host_flags);
  INFO(started.ToString());
  REQUIRE(started.ok());
  return std::move(*created);
}

// The first of `workers` to exit (a vector_worker stops at its first
// failed push), or nullptr after 30 s; the others are then stopped.
Subprocess* FirstToFail(const std::vector<Subprocess*>& workers) {
  Subprocess* failed = nullptr;
  for (int waited = 0; failed == nullptr && waited < 60; ++waited) {
    for (Subprocess* worker : workers) {
      if (worker->WaitFor(0.5).has_value()) failed = worker;
    }
  }
  for (Subprocess* worker : workers) {
    if (!worker->WaitFor(0).has_value()) worker->Signal(SIGTERM);
    CHECK(worker->WaitFor(30).has_value());
  }
  return failed;
}

TEST_CASE("Aggregated updates sum exactly at the server, all applied") {
  const std::string config = AggregatingConfig();
  auto cluster = launch::Cluster::StartLoopback(
      {"s1", "a1", "w1", "w2", "w3"}, {"--config=" + config}, {}, SlowServer());
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  launch::Cluster& c = **cluster;
  const std::string log = SumThreeWorkers(c, 10);
  // Some deliveries really were aggregates summed by a1's daemon.
  const int aggregates = testing::CountOccurrences(log, kAggregateMark);
  INFO(log);
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
  std::unique_ptr<launch::Cluster> cluster = StartChainCluster(SlowServer());
  launch::Cluster& c = *cluster;
  const std::string log = SumThreeWorkers(c, 20);
  // Partial sums did stream from worker to worker: chain hops were
  // dispatched, and the server received aggregates of more updates than
  // one worker has in flight (8), so of several workers' updates.
  const testing::HttpResult stats = testing::Http(c.admin_port(), "GET", "/api/v1/cluster");
  REQUIRE(stats.status == 200);
  const nlohmann::json json = nlohmann::json::parse(stats.body);
  INFO(stats.body);
  const int64_t hops = json["stats"]["chain_hops"].get<int64_t>();
  CHECK(hops > 0);
  INFO(log);
  const std::vector<int> sizes = AggregateSizes(log);
  const int deliveries = static_cast<int>(sizes.size());
  const int largest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  CHECK(largest > 8);
  std::printf("aggregation_test: %lld chain hops; %d aggregates delivered, the largest of %d updates\n",
              static_cast<long long>(hops), deliveries, largest);
}

TEST_CASE("Streaming chains: killing a chain's middle host fails that chain's pushes; later ones apply") {
  // A 100 Mbit/s server downlink keeps chains queued for it, so that one
  // through w2 is waiting when w2 stops.
  std::unique_ptr<launch::Cluster> cluster =
      StartChainCluster({{"s1", {"--downlink_bps=1e8"}}});
  launch::Cluster& c = *cluster;
  Subprocess* server = StartLoggingServer(c);
  // One push in flight per worker: each waits for its last outcome, so the
  // three stay in step and every batch is one chain through all three.
  const std::vector<Subprocess*> workers = {StartPusher(c, "w1", "w1", 100000, 1),
                                            StartPusher(c, "w3", "w3", 100000, 1)};
  StartPusher(c, "w2", "w2", 100000, 1);
  REQUIRE(WaitUntil(
      [&] {
        const std::vector<int> sizes = AggregateSizes(server->Log());
        return std::count(sizes.begin(), sizes.end(), 3) >= 5;
      },
      60));
  // Stopped, w2 holds the partial sums streaming through it.
  KillWhileHolding(c, server, "w2");
  // w1's and w3's pushes in a chain through w2 fail, naming it, instead of
  // hanging.
  Subprocess* failed = FirstToFail(workers);
  REQUIRE(failed != nullptr);
  INFO(failed->Log());
  CHECK(failed->WaitFor(0).value_or(-1) == 3);
  CHECK(failed->Log().find("push failed") != std::string::npos);
  CHECK(failed->Log().find("w2") != std::string::npos);
  // Without w2, new pushes chain through w1 and w3 (or go direct) and apply
  // (once the scheduler has noticed w2 is gone).
  REQUIRE(WaitUntil([&] { return c.scheduler().Log().find("host w2 is down") != std::string::npos; },
                    30));
  for (const std::string host : {"w1", "w3"}) {
    Subprocess* later = StartPusher(c, host, host + "-later", 5);
    auto code = later->WaitFor(60);
    INFO(later->Log());
    REQUIRE(code.has_value());
    CHECK(*code == 0);
  }
}

TEST_CASE("Killing the aggregator fails its pushes; later pushes go direct") {
  const std::string config = AggregatingConfig();
  auto cluster = launch::Cluster::StartLoopback(
      {"s1", "a1", "w1", "w2"}, {"--config=" + config}, {}, SlowServer());
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  launch::Cluster& c = **cluster;
  Subprocess* server = StartLoggingServer(c);
  const std::vector<Subprocess*> workers = {StartPusher(c, "w1", "w1"), StartPusher(c, "w2", "w2")};
  REQUIRE(WaitUntil([&] { return server->Log().find(kAggregateMark) != std::string::npos; }, 60));
  // The kill must find an aggregate in flight at a1 (one that completed
  // before it would fail nothing): stopped, a1 keeps the next aggregate the
  // planner gives it, and the server stalls at that aggregate's position.
  KillWhileHolding(c, server, "a1");
  // A worker with pushes routed through a1 sees them fail (it stops at the
  // first) instead of hanging. Which workers had pushes there is the
  // planner's choice; a worker whose pushes all went direct keeps going.
  Subprocess* failed = FirstToFail(workers);
  REQUIRE(failed != nullptr);
  INFO(failed->Log());
  CHECK(failed->WaitFor(0).value_or(-1) == 3);
  CHECK(failed->Log().find("push failed") != std::string::npos);
  // With a1 gone, new pushes are planned direct and apply (once the
  // scheduler has noticed: until then a1 may still be planned, and such a
  // push fails, with its reason).
  REQUIRE(WaitUntil([&] { return c.scheduler().Log().find("host a1 is down") != std::string::npos; },
                    30));
  Subprocess* later = StartPusher(c, "w1", "w1-later", 5);
  auto code = later->WaitFor(60);
  INFO(later->Log());
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  std::remove(config.c_str());
}

}  // namespace
}  // namespace mlfabric
