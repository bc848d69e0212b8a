// Every C++ API call and every push outcome across real processes: the real
// mlfabric-scheduler (mlfabric planner, small tau_max) and real mlfabricd
// daemons, with the server, replica and workers in this test process.
//   applied  (with the version applied at and the delay)
//   dropped  (the scheduler's deadline rule, with its reason)
//   failed   (the worker's daemon was killed mid-push)
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <thread>

#include "api/allreduce.h"
#include "api/registration.h"
#include "api/replica.h"
#include "testing/cluster.h"
#include "tools/launch/process.h"

namespace mlfabric {
namespace {


std::unique_ptr<testing::Cluster> StartCluster(int tau_max, const std::vector<std::string>& hosts) {
  const std::string dir = launch::MakeTempDir("api-outcomes");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789", "tau_max": )"
                        << tau_max << "}]}";
  auto cluster = testing::Cluster::StartLoopback(
      hosts, {"--config=" + config, "--planner=mlfabric"});
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  return std::move(*cluster);
}

RegistrationParams Params(const testing::Cluster& c, const std::string& host,
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
      CHECK(!r.reason.empty());
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
  auto worker = RegisterAsWorker(Params(*c, "w1", "w1"));
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

}  // namespace
}  // namespace mlfabric
