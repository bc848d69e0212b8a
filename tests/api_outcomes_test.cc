// Every C++ API call and every push outcome across real processes: the real
// mlfabric-scheduler (mlfabric planner, small tau_max) and real mlfabricd
// daemons, with the server, replica and workers in this test process.
//   applied  (with the version applied at and the delay)
//   dropped  (the scheduler's deadline rule, with its reason)
//   failed   (the worker's daemon was killed mid-push)
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <thread>

#include "api/allreduce.h"
#include "api/registration.h"
#include "api/replica.h"
#include "launch/cluster.h"
#include "launch/process.h"

namespace mlfabric {
namespace {


std::unique_ptr<launch::Cluster> StartCluster(int tau_max, const std::vector<std::string>& hosts) {
  const std::string dir = launch::MakeTempDir("api-outcomes");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789", "tau_max": )"
                        << tau_max << "}]}";
  auto cluster = launch::Cluster::StartLoopback(
      hosts, {"--config=" + config, "--planner=mlfabric"});
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  return std::move(*cluster);
}

RegistrationParams Params(const launch::Cluster& c, const std::string& host,
                          const std::string& name) {
  RegistrationParams params;
  params.client.daemon_socket = c.Socket(host);
  params.client.name = name;
  return params;
}

// A float32 sum server running on its own thread.
struct SumServer {
  std::unique_ptr<Server> server;
  std::vector<float> model;
  int64_t version = 0;
  std::atomic<int> applied{0};
  std::thread thread;
  explicit SumServer(std::unique_ptr<Server> s, size_t dim) : server(std::move(s)), model(dim) {
    version = server->initial_version();
    server->RegisterUpdateCallback([this](const Server::Update& u) -> absl::StatusOr<int64_t> {
      if (u.bytes != model.size() * sizeof(float)) return absl::InvalidArgumentError("size");
      const float* v = reinterpret_cast<const float*>(u.data);
      for (size_t i = 0; i < model.size(); ++i) model[i] += v[i];
      ++applied;
      return ++version;
    });
    server->RegisterRequestCallback([this]() -> absl::StatusOr<Server::Snapshot> {
      Server::Snapshot s;
      s.version = version;
      s.bytes.resize(model.size() * sizeof(float));
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

TEST_CASE("Pushes end applied (version, delay) or dropped for their deadline (reason)") {
  auto c = StartCluster(/*tau_max=*/1, {"s1", "w1", "w2", "w3"});
  auto server = RegisterAsServer(Params(*c, "s1", "ps0"));
  REQUIRE(server.ok());
  SumServer ps(std::move(*server), 256);
  std::vector<std::unique_ptr<Worker>> workers;
  for (const char* host : {"w1", "w2", "w3"}) {
    auto worker = RegisterAsWorker(Params(*c, host, host));
    INFO(worker.status().ToString());
    REQUIRE(worker.ok());
    workers.push_back(std::move(*worker));
  }
  // Wait until the server answers gets (it registered).
  REQUIRE(launch::WaitUntil([&] { return workers[0]->Get("ps0").ok(); }, 30));
  // Every worker pushes 8 updates at once, all computed from version 0:
  // with tau_max 1 most of them cannot meet their deadline.
  std::vector<float> update(256, 1.0f);
  std::vector<std::future<PushResult>> pushes;
  for (int round = 0; round < 8; ++round) {
    for (auto& worker : workers) {
      pushes.push_back(worker->Push("ps0", update.data(), update.size() * sizeof(float), 0, 16.0,
                                    {TensorSpec{0, 512, 0}, TensorSpec{1, 512, 1}}));
    }
  }
  int applied = 0, dropped = 0, failed = 0;
  for (auto& push : pushes) {
    REQUIRE(push.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
    PushResult r = push.get();
    if (r.outcome == PushOutcome::kApplied) {
      ++applied;
      CHECK(r.applied_version >= 1);
      CHECK(r.delay >= 0);
      CHECK(r.delay < 1 + 1);  // never beyond the bound
    } else if (r.outcome == PushOutcome::kDropped) {
      ++dropped;
      // The deadline rule's two drops (scheduler/core/ordering.h): past
      // its deadline ("stale"), or dropped ahead of it so the server link
      // never idles ("deadline_lookahead"). Any other reason (no_bandwidth,
      // replica_divergence, a failure's text) is not this rule's.
      INFO("reason: " << r.reason);
      CHECK((r.reason == "stale" || r.reason == "deadline_lookahead"));
    } else {
      ++failed;
      FAIL("push failed: " << r.reason);
    }
  }
  INFO("applied " << applied << " dropped " << dropped);
  CHECK(applied >= 1);
  CHECK(dropped >= 1);
  CHECK(applied + dropped == 24);
  // The server applied exactly the applied ones, and get sees them.
  REQUIRE(launch::WaitUntil([&] { return ps.applied.load() == applied; }, 10));
  auto model = workers[1]->Get("ps0");
  REQUIRE(model.ok());
  CHECK(model->version == ps.server->initial_version() + applied);
  CHECK(reinterpret_cast<const float*>(model->data())[7] == static_cast<float>(applied));
}

TEST_CASE("Registration parameters, replica registration and clear errors") {
  auto c = StartCluster(30, {"s1", "w1"});
  RegistrationParams params = Params(*c, "w1", "w1");
  params.delay_bound = -5;
  CHECK(absl::IsInvalidArgument(RegisterAsWorker(params).status()));
  params.delay_bound = 30;
  params.divergence_bound = 0;
  CHECK(absl::IsInvalidArgument(RegisterAsWorker(params).status()));
  params.divergence_bound = 2.5;
  ::setenv("MLFABRIC_DELAY_BOUND", "30", 1);
  CHECK(RegisterAsWorker(params).ok());
  params.delay_bound = 7;
  auto mismatch = RegisterAsWorker(params);
  CHECK(absl::IsFailedPrecondition(mismatch.status()));
  CHECK(mismatch.status().message().find("tau_max 30") != absl::string_view::npos);
  ::unsetenv("MLFABRIC_DELAY_BOUND");

  RegistrationParams bad_token = Params(*c, "w1", "w1");
  bad_token.client.job_token = "wrong";
  CHECK(!RegisterAsWorker(bad_token).ok());

  auto server = RegisterAsServer(Params(*c, "s1", "ps0"));
  REQUIRE(server.ok());
  SumServer ps(std::move(*server), 4);
  auto replica = RegisterAsReplica("ps0", Params(*c, "s1", "ps0-replica"));
  INFO(replica.status().ToString());
  REQUIRE(replica.ok());
  CHECK((*replica)->server() == "ps0");
  (*replica)->RegisterUpdateCallback([](const Server::Update&) -> absl::StatusOr<int64_t> {
    return 1;
  });
  std::thread serving([&] { CHECK((*replica)->Serve().ok()); });
  (*replica)->Stop();
  serving.join();

  // Get from a server nobody registered: an error naming it, promptly.
  auto worker = RegisterAsWorker(Params(*c, "w1", "w1"));
  REQUIRE(worker.ok());
  auto missing = (*worker)->Get("no-such-server");
  CHECK(!missing.ok());
  CHECK(missing.status().message().find("no-such-server") != absl::string_view::npos);

  // Tensor priorities: the default (layer order) is accepted and applied;
  // a negative one fails the push, naming the tensor and the value.
  std::vector<float> update(4, 1.0f);
  PushResult layered = (*worker)->Push("ps0", update.data(), 16, 0, 2.0,
                                       {TensorSpec{0, 8}, TensorSpec{1, 8}}).get();
  CHECK(layered.outcome == PushOutcome::kApplied);
  PushResult negative = (*worker)->Push("ps0", update.data(), 16, 0, 2.0,
                                        {TensorSpec{0, 8, 0}, TensorSpec{1, 8, -5}}).get();
  CHECK(negative.outcome == PushOutcome::kFailed);
  CHECK(negative.reason.find("tensor 1 (index 1): priority -5 is negative") != std::string::npos);

  // AllReduce: a single rank sums to itself; a missing root is an error.
  AllReduceOptions options;
  options.backend = "mlfabric";
  options.rank = 0;
  options.size = 1;
  options.client = Params(*c, "w1", "").client;
  auto reducer = MakeAllReducer(options);
  INFO(reducer.status().ToString());
  REQUIRE(reducer.ok());
  std::vector<double> values = {1.5, -2.0, 3.0};
  REQUIRE((*reducer)->AllReduce(values.data(), values.size(), DataType::kFloat64).ok());
  CHECK(values == std::vector<double>{1.5, -2.0, 3.0});
  options.rank = 1;
  options.size = 2;
  options.root_server = "nobody-runs-this-root";
  options.client.connect_timeout_s = 2;
  auto orphan = MakeAllReducer(options);
  CHECK(absl::IsUnavailable(orphan.status()));
  CHECK(orphan.status().message().find("nobody-runs-this-root") != absl::string_view::npos);
}

TEST_CASE("A push fails (it does not hang) when the worker's daemon dies") {
  auto c = StartCluster(30, {"s1", "w1"});
  auto server = RegisterAsServer(Params(*c, "s1", "ps0"));
  REQUIRE(server.ok());
  SumServer ps(std::move(*server), 1 << 18);
  RegistrationParams params = Params(*c, "w1", "w1");
  params.client.reconnect_s = 0;  // no daemon comes back: fail at once
  auto worker = RegisterAsWorker(params);
  REQUIRE(worker.ok());
  REQUIRE(launch::WaitUntil([&] { return (*worker)->Get("ps0").ok(); }, 30));
  std::vector<float> update(1 << 18, 1.0f);
  std::vector<std::future<PushResult>> pushes;
  for (int i = 0; i < 64; ++i) {
    pushes.push_back((*worker)->Push("ps0", update.data(), update.size() * sizeof(float), 0, 1.0));
  }
  c->daemon("w1").Signal(SIGKILL);
  int failed = 0;
  for (auto& push : pushes) {
    REQUIRE(push.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    PushResult r = push.get();
    if (r.outcome == PushOutcome::kFailed) {
      ++failed;
      CHECK(r.reason.find("lost the connection to the MLfabric daemon") != std::string::npos);
    }
  }
  CHECK(failed >= 1);
  auto get = (*worker)->Get("ps0");
  CHECK(absl::IsUnavailable(get.status()));
  auto late = (*worker)->Push("ps0", update.data(), 16, 0, 1.0).get();
  CHECK(late.outcome == PushOutcome::kFailed);
}

// A float32 sum server whose update callback waits at a gate until the
// test opens it: an update handed to it is delivered but not applied yet.
struct GatedSumServer {
  std::unique_ptr<Server> server;
  std::vector<float> model;
  int64_t version = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int entered = 0;
  int applied = 0;
  std::thread thread;
  GatedSumServer(std::unique_ptr<Server> s, size_t dim) : server(std::move(s)), model(dim) {
    version = server->initial_version();
    server->RegisterUpdateCallback([this](const Server::Update& u) -> absl::StatusOr<int64_t> {
      std::unique_lock<std::mutex> lock(mu);
      ++entered;
      cv.notify_all();
      cv.wait_for(lock, std::chrono::seconds(60), [&] { return open; });
      if (u.bytes != model.size() * sizeof(float)) return absl::InvalidArgumentError("size");
      const float* v = reinterpret_cast<const float*>(u.data);
      for (size_t i = 0; i < model.size(); ++i) model[i] += v[i];
      ++applied;
      return ++version;
    });
    server->RegisterRequestCallback([this]() -> absl::StatusOr<Server::Snapshot> {
      std::lock_guard<std::mutex> lock(mu);
      Server::Snapshot s;
      s.version = version;
      s.bytes.resize(model.size() * sizeof(float));
      std::memcpy(s.bytes.data(), model.data(), s.bytes.size());
      return s;
    });
    thread = std::thread([this] { (void)server->Serve(); });
  }
  ~GatedSumServer() {
    Open();
    server->Stop();
    thread.join();
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu);
    open = false;
  }
  bool AwaitEntered(int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return entered >= n; });
  }
  int Applied() {
    std::lock_guard<std::mutex> lock(mu);
    return applied;
  }
  float At(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    return model[i];
  }
};

TEST_CASE("A worker whose daemon died learns how its pushes ended from the daemon that replaced it") {
  // w1's uplink paced to 20 Mbit/s: a 4 MiB push is 1.7 s on its way.
  const std::string dir = launch::MakeTempDir("api-outcomes");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789", "tau_max": 30}]})";
  auto started = launch::Cluster::StartLoopback(
      {"s1", "w1"}, {"--config=" + config, "--planner=mlfabric"}, {},
      {{"w1", {"--uplink_bps=2e7"}}});
  INFO(started.status().ToString());
  REQUIRE(started.ok());
  launch::Cluster& c = **started;
  auto server = RegisterAsServer(Params(c, "s1", "ps0"));
  REQUIRE(server.ok());
  constexpr size_t kDim = 1 << 20;  // 4 MiB of float32
  GatedSumServer ps(std::move(*server), kDim);
  RegistrationParams params = Params(c, "w1", "w1");
  params.client.reconnect_s = 30;
  auto worker = RegisterAsWorker(params);
  REQUIRE(worker.ok());
  REQUIRE(launch::WaitUntil([&] { return (*worker)->Get("ps0").ok(); }, 30));
  const int64_t initial = ps.server->initial_version();
  std::vector<float> one(kDim, 1.0f), two(kDim, 2.0f), four(kDim, 4.0f);
  const size_t bytes = kDim * sizeof(float);

  SECTION("applied while the daemon was down: reported applied after it came back") {
    // Delivered to the server, not yet applied, when w1's daemon dies.
    auto first = (*worker)->Push("ps0", one.data(), bytes, 0, 1.0);
    REQUIRE(ps.AwaitEntered(1));
    REQUIRE(c.KillDaemon("w1").ok());
    ps.Open();
    REQUIRE(launch::WaitUntil([&] { return ps.Applied() == 1; }, 30));
    CHECK(first.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
    REQUIRE(c.RestartDaemon("w1").ok());
    REQUIRE(first.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
    const PushResult result = first.get();
    INFO(result.reason);
    CHECK(result.outcome == PushOutcome::kApplied);
    CHECK(result.applied_version == initial + 1);
    CHECK((*worker)->reconnects() == 1);
    // Pushes and gets go on through the new daemon.
    const PushResult later = (*worker)->Push("ps0", two.data(), bytes, 1, 1.0).get();
    INFO(later.reason);
    CHECK(later.outcome == PushOutcome::kApplied);
    CHECK(ps.At(7) == 3.0f);
    auto model = (*worker)->Get("ps0");
    REQUIRE(model.ok());
    CHECK(model->version == initial + 2);
  }

  SECTION("cut off mid-transfer: reported failed, and not in the model") {
    ps.Open();
    auto cut = (*worker)->Push("ps0", four.data(), bytes, 0, 1.0);
    // Under way (paced) for about 1.7 s: kill its source half way.
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    REQUIRE(c.KillDaemon("w1").ok());
    REQUIRE(c.RestartDaemon("w1").ok());
    REQUIRE(cut.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
    const PushResult result = cut.get();
    INFO(result.reason);
    std::printf("push cut off mid-transfer: %s%s%s\n", PushOutcomeName(result.outcome),
                result.reason.empty() ? "" : ": ", result.reason.c_str());
    if (result.outcome == PushOutcome::kApplied) {
      // The whole transfer made it before the kill after all (a slow start):
      // then the model has it, once.
      REQUIRE(launch::WaitUntil([&] { return ps.Applied() == 1; }, 30));
      CHECK(ps.At(0) == 4.0f);
    } else {
      CHECK(result.outcome == PushOutcome::kFailed);
      CHECK(result.reason.find("unknown") == std::string::npos);  // the scheduler knew
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      CHECK(ps.Applied() == 0);
      CHECK(ps.At(0) == 0.0f);
    }
    CHECK((*worker)->reconnects() == 1);
  }

  SECTION("no daemon back in time: failed, saying its outcome is unknown") {
    RegistrationParams impatient = Params(c, "w1", "w1-impatient");
    impatient.client.reconnect_s = 1;
    auto quick = RegisterAsWorker(impatient);
    REQUIRE(quick.ok());
    auto pending = (*quick)->Push("ps0", one.data(), bytes, 0, 1.0);
    REQUIRE(ps.AwaitEntered(1));
    REQUIRE(c.KillDaemon("w1").ok());
    REQUIRE(pending.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    const PushResult result = pending.get();
    CHECK(result.outcome == PushOutcome::kFailed);
    CHECK(result.reason.find("could not connect to the daemon again within 1 s") !=
          std::string::npos);
    CHECK(result.reason.find("its outcome is unknown here") != std::string::npos);
    ps.Open();
    REQUIRE(c.RestartDaemon("w1").ok());
  }
}

}  // namespace
}  // namespace mlfabric
