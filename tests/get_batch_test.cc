// A server's daemon answers concurrent gets in batches that share one model
// snapshot (mlfabric.md §10.3, daemon/engine/get_batcher.h). Six workers on
// six daemons ask for the model at once; the server application is asked
// once, and every worker gets the same bytes and the same version. The
// server's snapshot callback holds its answer until the server's daemon has
// logged all six gets joining the batch, so the test is decided by the order
// of events, not by timing. A second wave takes the second snapshot, and the
// daemon's own counters (printed when it stops) say 12 gets from 2 snapshots.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <fstream>
#include <future>
#include <thread>
#include <vector>

#include "api/registration.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "tests/test_util.h"

namespace mlfabric {
namespace {

constexpr int kWorkers = 6;
constexpr size_t kModelBytes = 256 * 1024;  // 8 packets of 32 KiB

TEST_CASE("Concurrent gets share one snapshot: same bytes, same version") {
  const std::string dir = launch::MakeTempDir("get-batch");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789"}]})";
  std::vector<std::string> hosts = {"s1"};
  for (int w = 1; w <= kWorkers; ++w) hosts.push_back("w" + std::to_string(w));
  auto started = launch::Cluster::StartLoopback(hosts, {"--config=" + config}, {},
                                                 {{"s1", {"--log_level=debug"}}});
  INFO(started.status().ToString());
  REQUIRE(started.ok());
  launch::Cluster& c = **started;

  std::atomic<int> snapshots{0};
  std::atomic<bool> held_until_joined{true};
  auto snapshot_when_joined = [&]() -> absl::StatusOr<Server::Snapshot> {
    const int call = ++snapshots;
    // Answer once every get of this wave has joined the batch at s1.
    const int joined = call * kWorkers;
    held_until_joined = held_until_joined && launch::WaitUntil(
        [&] {
          return testing::CountOccurrences(c.daemon("s1").Log(), "joins model batch") >= joined;
        },
        60);
    Server::Snapshot snapshot;
    snapshot.version = 100 * call;
    snapshot.bytes.resize(kModelBytes);
    for (size_t i = 0; i < kModelBytes; ++i) {
      snapshot.bytes[i] = static_cast<uint8_t>((i * 131 + static_cast<size_t>(call) * 7) & 0xff);
    }
    return snapshot;
  };
  testing::InProcessServer server(c.Socket("s1"), "ps0", testing::NextVersion,
                                  snapshot_when_joined);
  REQUIRE(server.status().ok());

  std::vector<std::unique_ptr<Worker>> workers;
  for (int w = 1; w <= kWorkers; ++w) {
    ClientOptions options;
    options.daemon_socket = c.Socket("w" + std::to_string(w));
    options.name = "w" + std::to_string(w);
    auto worker = Worker::Connect(options);
    REQUIRE(worker.ok());
    workers.push_back(std::move(*worker));
  }

  for (int wave = 1; wave <= 2; ++wave) {
    INFO("wave " << wave);
    std::vector<std::future<absl::StatusOr<Model>>> gets;
    for (auto& worker : workers) {
      Worker* w = worker.get();
      gets.push_back(std::async(std::launch::async, [w] { return w->Get("ps0"); }));
    }
    std::vector<Model> models;
    for (auto& get : gets) {
      absl::StatusOr<Model> model = get.get();
      INFO(model.status().ToString());
      REQUIRE(model.ok());
      models.push_back(std::move(*model));
    }
    CHECK(snapshots.load() == wave);
    for (const Model& model : models) {
      CHECK(model.version == 100 * wave);
      REQUIRE(model.size() == kModelBytes);
      CHECK(std::memcmp(model.data(), models[0].data(), kModelBytes) == 0);
    }
    CHECK(models[0].data()[1] == static_cast<uint8_t>((131 + wave * 7) & 0xff));
  }
  CHECK(held_until_joined.load());
  const std::string log = c.daemon("s1").Log();
  CHECK(testing::CountOccurrences(log, "(takes its snapshot)") == 2);
  server.Stop();
  // The daemon's counters, printed as it stops.
  c.daemon("s1").Stop();
  CHECK(c.daemon("s1").Log().find("gets served 12 from 2 snapshots") != std::string::npos);
  std::remove(config.c_str());
}

}  // namespace
}  // namespace mlfabric
