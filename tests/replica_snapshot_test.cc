// A replica that registers while its server already holds a model starts
// from a snapshot of it (RegistrationParams::replica_snapshot;
// scheduler/service/replica_sync.h), across real processes: ps0 on s1
// starts from a model that is not zero and takes updates from w1 before
// the replica on r1 registers; more updates follow while the snapshot is
// on its way. The replica must end with exactly the server's model, and,
// once s1's daemon is killed, serve it as the promoted server with every
// update reported applied. Updates are integer-valued, so the checks are
// exact.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "api/registration.h"
#include "api/replica.h"
#include "launch/cluster.h"
#include "launch/process.h"

namespace mlfabric {
namespace {

constexpr size_t kDim = 8192;  // 32 KiB of float32

// A model of floats that sums updates; a replica installs snapshots too.
struct SumModel {
  std::mutex mu;
  std::vector<float> w = std::vector<float>(kDim, 0.0f);
  int64_t version = 0;
  int64_t installs = 0;

  absl::StatusOr<int64_t> Apply(const Server::Update& u) {
    std::lock_guard<std::mutex> lock(mu);
    if (u.bytes != kDim * sizeof(float)) return absl::InvalidArgumentError("size");
    const float* v = reinterpret_cast<const float*>(u.data);
    for (size_t k = 0; k < kDim; ++k) w[k] += v[k];
    version += u.count;
    return version;
  }
  absl::Status Install(const Replica::Install& snapshot) {
    std::lock_guard<std::mutex> lock(mu);
    if (snapshot.bytes != kDim * sizeof(float)) {
      return absl::InvalidArgumentError("snapshot of the wrong size");
    }
    std::memcpy(w.data(), snapshot.data, snapshot.bytes);
    version = snapshot.version;
    ++installs;
    return absl::OkStatus();
  }
  absl::StatusOr<Server::Snapshot> Snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    Server::Snapshot s;
    s.version = version;
    s.bytes.resize(kDim * sizeof(float));
    std::memcpy(s.bytes.data(), w.data(), s.bytes.size());
    return s;
  }
  std::pair<std::vector<float>, int64_t> Read() {
    std::lock_guard<std::mutex> lock(mu);
    return {w, version};
  }
};

// ps0's job (loose bounds) on hosts s1, r1 and w1.
std::unique_ptr<launch::Cluster> StartCluster() {
  const std::string dir = launch::MakeTempDir("replica-snapshot");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789",)"
                        << R"( "tau_max": 1000, "divergence_max": 1e7}]})";
  auto started = launch::Cluster::StartLoopback({"s1", "r1", "w1"},
                                                 {"--config=" + config, "--planner=mlfabric"});
  INFO(started.status().ToString());
  REQUIRE(started.ok());
  return std::move(*started);
}

RegistrationParams Params(const launch::Cluster& c, const std::string& host,
                          const std::string& name) {
  RegistrationParams params;
  params.client.daemon_socket = c.Socket(host);
  params.client.name = name;
  return params;
}

// ps0 on s1 serving `model` (a thread until *serving is joined), and a
// worker on w1 that has seen it answer a get.
std::unique_ptr<Worker> ServeAndConnect(launch::Cluster& c, SumModel& model,
                                        std::unique_ptr<Server>* server, std::thread* serving) {
  auto registered = RegisterAsServer(Params(c, "s1", "ps0"));
  REQUIRE(registered.ok());
  *server = std::move(*registered);
  Server* raw = server->get();
  raw->RegisterUpdateCallback([&model](const Server::Update& u) { return model.Apply(u); });
  raw->RegisterRequestCallback([&model] { return model.Snapshot(); });
  *serving = std::thread([raw] { (void)raw->Serve(); });
  auto worker = RegisterAsWorker(Params(c, "w1", "w1"));
  REQUIRE(worker.ok());
  std::unique_ptr<Worker> connected = std::move(*worker);
  REQUIRE(launch::WaitUntil([&] { return connected->Get("ps0").ok(); }, 30));
  return connected;
}

// Update i: i + 1 in slot i % kDim, 1 everywhere else (integers: exact).
std::vector<float> Update(int i) {
  std::vector<float> v(kDim, 1.0f);
  v[static_cast<size_t>(i) % kDim] = static_cast<float>(i + 1);
  return v;
}

TEST_CASE("A replica registered mid-training starts from the server's model and stays exact") {
  const std::unique_ptr<launch::Cluster> started = StartCluster();
  launch::Cluster& c = *started;

  // The server starts from a model that is not zero: a replica starting
  // from its own (zero) model could not end equal.
  SumModel server_model;
  for (size_t k = 0; k < kDim; ++k) server_model.w[k] = static_cast<float>(k % 7);
  std::unique_ptr<Server> server;
  std::thread serving;
  const std::unique_ptr<Worker> worker = ServeAndConnect(c, server_model, &server, &serving);
  std::vector<float> expected(kDim);
  for (size_t k = 0; k < kDim; ++k) expected[k] = static_cast<float>(k % 7);
  int applied = 0;
  auto push = [&](int i) {
    const std::vector<float> v = Update(i);
    return worker->Push("ps0", v.data(), v.size() * sizeof(float), 0, 1.0);
  };
  auto settle = [&](std::vector<std::future<PushResult>>& pushes, int first) {
    for (size_t n = 0; n < pushes.size(); ++n) {
      REQUIRE(pushes[n].wait_for(std::chrono::seconds(60)) == std::future_status::ready);
      const PushResult r = pushes[n].get();
      INFO(r.reason);
      REQUIRE(r.outcome == PushOutcome::kApplied);
      ++applied;
      const std::vector<float> v = Update(first + static_cast<int>(n));
      for (size_t k = 0; k < kDim; ++k) expected[k] += v[k];
    }
    pushes.clear();
  };

  // 1. Training before the replica exists.
  std::vector<std::future<PushResult>> pushes;
  for (int i = 0; i < 20; ++i) pushes.push_back(push(i));
  settle(pushes, 0);

  // 2. The replica registers (from a snapshot) while updates keep coming.
  SumModel replica_model;
  RegistrationParams replica_params = Params(c, "r1", "r1");
  replica_params.replica_snapshot = true;
  auto replica = RegisterAsReplica("ps0", replica_params);
  REQUIRE(replica.ok());
  (*replica)->RegisterUpdateCallback([&](const Server::Update& u) { return replica_model.Apply(u); });
  (*replica)->RegisterRequestCallback([&] { return replica_model.Snapshot(); });
  (*replica)->RegisterInstallCallback(
      [&](const Replica::Install& snapshot) { return replica_model.Install(snapshot); });
  std::thread standing_by([&] { (void)(*replica)->Serve(); });
  for (int i = 20; i < 60; ++i) {
    pushes.push_back(push(i));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  settle(pushes, 20);

  // The replica ends with exactly the server's model and version.
  REQUIRE(launch::WaitUntil(
      [&] { return replica_model.Read().second == server_model.Read().second; }, 30));
  {
    const auto [server_w, server_version] = server_model.Read();
    const auto [replica_w, replica_version] = replica_model.Read();
    CHECK(server_version == applied);
    CHECK(replica_version == server_version);
    CHECK(server_w == expected);
    CHECK(replica_w == server_w);
    CHECK(replica_model.installs == 1);
  }

  // 3. The server's daemon dies: the replica, in sync, takes over.
  REQUIRE(c.KillDaemon("s1").ok());
  REQUIRE(launch::WaitUntil([&] { return (*replica)->promoted(); }, 30));
  for (int i = 60; i < 70; ++i) pushes.push_back(push(i));
  settle(pushes, 60);
  REQUIRE(launch::WaitUntil([&] { return replica_model.Read().second == applied; }, 30));
  CHECK((*replica)->promoted());
  CHECK(replica_model.Read().first == expected);
  // A get that still went to s1 fails, and the next asks where ps0 is.
  absl::StatusOr<mlfabric::Model> model = absl::UnavailableError("not asked");
  REQUIRE(launch::WaitUntil(
      [&] {
        model = worker->Get("ps0");
        return model.ok();
      },
      30));
  CHECK(model->version == applied);

  (*replica)->Stop();
  standing_by.join();
  server->Stop();
  serving.join();
}

TEST_CASE("A replica registered before its server starts from the server's first model") {
  const std::unique_ptr<launch::Cluster> started = StartCluster();
  launch::Cluster& c = *started;

  // The standby is up first, with a model of its own (zeros).
  SumModel replica_model;
  RegistrationParams replica_params = Params(c, "r1", "r1");
  replica_params.replica_snapshot = true;
  auto replica = RegisterAsReplica("ps0", replica_params);
  REQUIRE(replica.ok());
  (*replica)->RegisterUpdateCallback([&](const Server::Update& u) { return replica_model.Apply(u); });
  (*replica)->RegisterInstallCallback(
      [&](const Replica::Install& snapshot) { return replica_model.Install(snapshot); });
  std::thread standing_by([&] { (void)(*replica)->Serve(); });

  // The server's first model is not the replica's.
  SumModel server_model;
  for (size_t k = 0; k < kDim; ++k) server_model.w[k] = static_cast<float>(k % 5);
  server_model.version = 3;
  std::unique_ptr<Server> server;
  std::thread serving;
  const std::unique_ptr<Worker> worker = ServeAndConnect(c, server_model, &server, &serving);
  std::vector<std::future<PushResult>> pushes;
  for (int i = 0; i < 30; ++i) {
    const std::vector<float> v = Update(i);
    pushes.push_back(worker->Push("ps0", v.data(), v.size() * sizeof(float), 0, 1.0));
  }
  for (auto& p : pushes) {
    REQUIRE(p.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
    const PushResult r = p.get();
    INFO(r.reason);
    CHECK(r.outcome == PushOutcome::kApplied);
  }
  REQUIRE(launch::WaitUntil(
      [&] { return replica_model.Read().second == server_model.Read().second; }, 30));
  const auto [server_w, server_version] = server_model.Read();
  const auto [replica_w, replica_version] = replica_model.Read();
  CHECK(server_version == 33);
  CHECK(replica_version == server_version);
  CHECK(replica_w == server_w);
  CHECK(replica_model.installs == 1);

  (*replica)->Stop();
  standing_by.join();
  server->Stop();
  serving.join();
}

TEST_CASE("A replica registered for snapshots needs an install callback") {
  const std::string dir = launch::MakeTempDir("replica-snapshot");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789"}]})";
  auto started = launch::Cluster::StartLoopback({"s1", "r1"},
                                                 {"--config=" + config, "--planner=mlfabric"});
  REQUIRE(started.ok());
  RegistrationParams params = Params(**started, "r1", "r1");
  params.replica_snapshot = true;
  auto replica = RegisterAsReplica("ps0", params);
  REQUIRE(replica.ok());
  (*replica)->RegisterUpdateCallback([](const Server::Update&) -> absl::StatusOr<int64_t> {
    return 0;
  });
  const absl::Status served = (*replica)->Serve();
  CHECK(absl::IsFailedPrecondition(served));
  CHECK(served.message().find("install callback") != absl::string_view::npos);
}

}  // namespace
}  // namespace mlfabric
