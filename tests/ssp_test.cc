// Stale-synchronous parallel (mlfabric.md §6; Ho et al., 2013)
// across real processes: a scheduler with an "ssp" job (K = 2), a server
// and two workers on their own daemons. A worker's clock is its number of
// pushes; a worker more than K ahead of the slowest live worker waits at
// its get. Checked without timing: whenever the fast worker's get returns,
// the slow worker has started at least (fast's pushes - K) pushes. The
// wait is visible in the admin endpoint while it lasts; a slowest worker
// that stops holds others back only ssp_max_wait_s per get, and one whose
// daemon died not at all.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "api/registration.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "testing/http_client.h"

namespace mlfabric {
namespace {

using nlohmann::json;

constexpr int64_t kStaleness = 2;
constexpr size_t kDim = 1024;

std::unique_ptr<launch::Cluster> StartCluster(double max_wait_s) {
  const std::string dir = launch::MakeTempDir("ssp");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789", "mode": "ssp",)"
                        << R"( "staleness_k": )" << kStaleness << "}]}";
  auto cluster = launch::Cluster::StartLoopback(
      {"s1", "w1", "w2"},
      {"--config=" + config, "--planner=mlfabric", "--admin_port=0",
       "--admin_port_file={dir}/admin.port",
       "--ssp_max_wait_s=" + std::to_string(max_wait_s)});
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  REQUIRE(launch::WaitUntil(
      [&] { return !launch::ReadFile((*cluster)->dir() + "/admin.port").empty(); }, 10));
  return std::move(*cluster);
}

json Jobs(const launch::Cluster& c) {
  const int port = std::atoi(launch::ReadFile(c.dir() + "/admin.port").c_str());
  testing::HttpResult r = testing::Http(port, "GET", "/api/v1/jobs");
  REQUIRE(r.status == 200);
  return json::parse(r.body)["jobs"][0];
}

ClientOptions Options(const launch::Cluster& c, const std::string& host, const std::string& name) {
  ClientOptions options;
  options.daemon_socket = c.Socket(host);
  options.name = name;
  return options;
}

// A parameter server holding kDim floats, model += update.
struct SumServer {
  std::mutex mu;
  std::vector<float> model = std::vector<float>(kDim, 0.0f);
  int64_t version = 0;
  std::unique_ptr<Server> server;
  std::thread thread;

  explicit SumServer(const launch::Cluster& c) {
    auto connected = Server::Connect(Options(c, "s1", "ps0"));
    REQUIRE(connected.ok());
    server = std::move(*connected);
    server->RegisterUpdateCallback([this](const Server::Update& u) -> absl::StatusOr<int64_t> {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<float> v(kDim);
      std::memcpy(v.data(), u.data, std::min<size_t>(u.bytes, kDim * sizeof(float)));
      for (size_t k = 0; k < kDim; ++k) model[k] += v[k];
      version += u.count;
      return version;
    });
    server->RegisterRequestCallback([this]() -> absl::StatusOr<Server::Snapshot> {
      std::lock_guard<std::mutex> lock(mu);
      Server::Snapshot s;
      s.version = version;
      s.bytes.resize(kDim * sizeof(float));
      std::memcpy(s.bytes.data(), model.data(), s.bytes.size());
      return s;
    });
    thread = std::thread([this] { (void)server->Serve(); });
  }
  ~SumServer() {
    server->Stop();
    thread.join();
  }
};

// One get/compute/push iteration; the push's outcome (applied, or dropped
// as stale by the delay bound K) does not matter here, its clock tick does.
void Iterate(Worker& worker) {
  auto model = worker.Get("ps0");
  REQUIRE(model.ok());
  std::vector<float> update(kDim, 0.001f);
  PushResult r = worker.Push("ps0", update.data(), update.size() * sizeof(float),
                             model->version, 0.032).get();
  REQUIRE(r.outcome != PushOutcome::kFailed);
}

TEST_CASE("A worker more than K pushes ahead of the slowest waits at its get") {
  auto cluster = StartCluster(/*max_wait_s=*/30);
  SumServer server(*cluster);
  auto slow = Worker::Connect(Options(*cluster, "w2", "slow"));
  REQUIRE(slow.ok());
  auto fast = Worker::Connect(Options(*cluster, "w1", "fast"));
  REQUIRE(fast.ok());

  constexpr int kFastIterations = 10;
  std::atomic<int> slow_started{0};
  std::atomic<bool> done{false};
  std::thread slow_thread([&] {
    for (int i = 0; i < kFastIterations + 3 && !done.load(); ++i) {
      auto model = (*slow)->Get("ps0");
      if (!model.ok()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(150));  // a slow compute
      std::vector<float> update(kDim, 0.001f);
      ++slow_started;  // before the push: never behind the scheduler's count
      (void)(*slow)->Push("ps0", update.data(), update.size() * sizeof(float), model->version,
                          0.032).get();
    }
  });
  // Watch the admin endpoint for the fast worker's wait.
  std::atomic<bool> seen_waiting{false};
  std::thread watcher([&] {
    while (!done.load()) {
      json job = Jobs(*cluster);
      for (const json& w : job["ssp_waiting"]) {
        if (w["worker"] == "fast" && w["slowest_worker"] == "slow") seen_waiting.store(true);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  int violations = 0;
  for (int pushes = 0; pushes < kFastIterations; ++pushes) {
    auto model = (*fast)->Get("ps0");
    REQUIRE(model.ok());
    // The scheduler let this get through: slow had >= pushes - K.
    if (slow_started.load() < pushes - kStaleness) {
      ++violations;
      WARN("fast got with " << pushes << " pushes while slow had started "
                            << slow_started.load());
    }
    std::vector<float> update(kDim, 0.001f);
    PushResult r = (*fast)->Push("ps0", update.data(), update.size() * sizeof(float),
                                 model->version, 0.032).get();
    REQUIRE(r.outcome != PushOutcome::kFailed);
  }
  done.store(true);
  slow_thread.join();
  watcher.join();
  CHECK(violations == 0);
  CHECK(seen_waiting.load());
  json job = Jobs(*cluster);
  CHECK(job["mode"] == "ssp");
  CHECK(job["ssp_waits"].get<int64_t>() >= 1);
  CHECK(job["ssp_wait_timeouts"] == 0);
  bool fast_listed = false;
  for (const json& w : job["workers"]) fast_listed |= w["name"] == "fast";
  CHECK(fast_listed);
}

TEST_CASE("A stopped slowest worker holds others back only ssp_max_wait_s; a dead one not at all") {
  auto cluster = StartCluster(/*max_wait_s=*/1.0);
  SumServer server(*cluster);
  auto slow = Worker::Connect(Options(*cluster, "w2", "slow"));
  REQUIRE(slow.ok());
  auto fast = Worker::Connect(Options(*cluster, "w1", "fast"));
  REQUIRE(fast.ok());
  // slow never pushes: fast's gets from clock K + 1 on time out, one each.
  for (int i = 0; i < kStaleness + 3; ++i) Iterate(**fast);
  json job = Jobs(*cluster);
  CHECK(job["ssp_wait_timeouts"] == 2);  // the gets at clocks 3 and 4
  CHECK(launch::ReadFile(cluster->dir() + "/scheduler.log")
            .find("ssp: worker fast of job demo (clock 3) waited") != std::string::npos);
  // slow's daemon dies: it no longer counts, so fast never waits again.
  cluster->daemon("w2").Stop();
  REQUIRE(launch::WaitUntil(
      [&] {
        return launch::ReadFile(cluster->dir() + "/scheduler.log").find("host w2 is down") !=
               std::string::npos;
      },
      10));
  for (int i = 0; i < 4; ++i) Iterate(**fast);
  job = Jobs(*cluster);
  CHECK(job["ssp_wait_timeouts"] == 2);
  slow->reset();
}

}  // namespace
}  // namespace mlfabric
