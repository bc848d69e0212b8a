// Hot-standby replicas (mlfabric.md §3.3, §5.3) across real processes: the
// real scheduler plans each batch's replica copies within the divergence
// bound, the workers' daemons send them to the replica's daemon (punted
// copies later, from bytes they hold), and the replica application receives
// every update the server applied, in the replica's commit order.
#include <signal.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/registration.h"
#include "api/replica.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "testing/http_client.h"

namespace mlfabric {
namespace {


constexpr size_t kDim = 65536;  // 256 KiB updates

// `aggregator`: the job names host a1 as its aggregator, and the replica's
// host declares a downlink 50 times slower than the others, so copies are
// punted (§5.3) and the next batches may sum them on their way.
// `scheduler_flags` are added to the scheduler's command line.
std::unique_ptr<launch::Cluster> StartCluster(double divergence_max, bool aggregator = false,
                                               std::vector<std::string> scheduler_flags = {}) {
  const std::string dir = launch::MakeTempDir("replica");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789", "tau_max": 1000,)"
                        << (aggregator ? R"( "aggregators": ["a1"],)" : "")
                        << R"( "divergence_max": )" << divergence_max << "}]}";
  launch::ClusterOptions options;
  options.hosts = {"s1", "r1", "w1", "w2"};
  if (aggregator) options.hosts.push_back("a1");
  options.admin = true;  // the replica's lag and divergence estimate are read there
  auto cluster = launch::Cluster::Create(options);
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  std::map<std::string, std::vector<std::string>> host_flags;
  if (aggregator) host_flags["r1"] = {"--downlink_bps=2e8"};
  scheduler_flags.insert(scheduler_flags.begin(), {"--config=" + config, "--planner=mlfabric"});
  const absl::Status started = (*cluster)->Start(scheduler_flags, {}, host_flags);
  INFO(started.ToString());
  REQUIRE(started.ok());
  return std::move(*cluster);
}

// The admin endpoint's view of ps0's replica (GET /api/v1/jobs).
nlohmann::json ReplicaView(const launch::Cluster& c) {
  const testing::HttpResult r = testing::Http(c.admin_port(), "GET", "/api/v1/jobs");
  REQUIRE(r.status == 200);
  const nlohmann::json jobs = nlohmann::json::parse(r.body);
  for (const auto& server : jobs["jobs"][0]["servers"]) {
    if (server["name"] == "ps0") return server["replica"];
  }
  FAIL("ps0 is not in " << r.body);
  return nullptr;
}

ClientOptions Options(const launch::Cluster& c, const std::string& host, const std::string& name) {
  ClientOptions options;
  options.daemon_socket = c.Socket(host);
  options.name = name;
  return options;
}

std::vector<float> Update(int worker, int i) {
  std::vector<float> v(kDim);
  for (size_t k = 0; k < kDim; ++k) v[k] = static_cast<float>((worker + 1) * (i + 1) + k % 13);
  return v;
}

double Norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double{x} * x;
  return std::sqrt(s);
}

// A model that sums what it is given: the server's and the replica's.
struct SumModel {
  std::mutex mu;
  std::vector<float> model = std::vector<float>(kDim, 0.0f);
  int64_t version = 0;
  int64_t applied = 0;
  absl::StatusOr<int64_t> Apply(const Server::Update& u) {
    std::lock_guard<std::mutex> lock(mu);
    if (u.bytes != kDim * sizeof(float)) return absl::InvalidArgumentError("size");
    std::vector<float> v(kDim);
    std::memcpy(v.data(), u.data, u.bytes);
    for (size_t k = 0; k < kDim; ++k) model[k] += v[k];
    applied += u.count;
    version += u.count;
    return version;
  }
};

struct Job {
  SumModel server_model, replica_model;
  std::unique_ptr<Server> server;
  std::unique_ptr<Replica> replica;
  std::thread server_thread, replica_thread;
  ~Job() {
    if (server) server->Stop();
    if (replica) replica->Stop();
    if (server_thread.joinable()) server_thread.join();
    if (replica_thread.joinable()) replica_thread.join();
  }
};

// `replica_apply_ms`: the replica application takes that long for each
// update it is handed (a slow standby: its copies count as applied late).
void StartJob(launch::Cluster& c, Job* job, int replica_apply_ms = 0) {
  auto server = Server::Connect(Options(c, "s1", "ps0"));
  REQUIRE(server.ok());
  job->server = std::move(*server);
  job->server->RegisterUpdateCallback([job](const Server::Update& u) {
    return job->server_model.Apply(u);
  });
  job->server->RegisterRequestCallback([job]() -> absl::StatusOr<Server::Snapshot> {
    std::lock_guard<std::mutex> lock(job->server_model.mu);
    Server::Snapshot s;
    s.version = job->server_model.version;
    s.bytes.resize(kDim * sizeof(float));
    std::memcpy(s.bytes.data(), job->server_model.model.data(), s.bytes.size());
    return s;
  });
  job->server_thread = std::thread([job] { (void)job->server->Serve(); });
  RegistrationParams params;
  params.client = Options(c, "r1", "standby");
  auto replica = RegisterAsReplica("ps0", params);
  INFO(replica.status().ToString());
  REQUIRE(replica.ok());
  job->replica = std::move(*replica);
  job->replica->RegisterUpdateCallback([job, replica_apply_ms](const Server::Update& u) {
    std::this_thread::sleep_for(std::chrono::milliseconds(replica_apply_ms));
    return job->replica_model.Apply(u);
  });
  job->replica_thread = std::thread([job] { (void)job->replica->Serve(); });
}

// Two workers push `pushes` updates each, concurrently, each waiting for
// its outcomes; returns how many were applied.
int PushAll(launch::Cluster& c, int pushes) {
  std::atomic<int> applied{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      auto worker = Worker::Connect(Options(c, w == 0 ? "w1" : "w2", "w" + std::to_string(w)));
      if (!worker.ok()) return;
      for (int i = 0; i < pushes; ++i) {
        const std::vector<float> v = Update(w, i);
        auto model = (*worker)->Get("ps0");
        const int64_t version = model.ok() ? model->version : 0;
        PushResult r =
            (*worker)->Push("ps0", v.data(), v.size() * sizeof(float), version, Norm(v)).get();
        if (r.outcome == PushOutcome::kApplied) ++applied;
      }
    });
  }
  for (auto& t : threads) t.join();
  return applied.load();
}

// The replica applies every update the server had applied
// (`server_applied`) and ends with the server's model, exactly (sums of
// integers).
void CheckReplicaCatchesUp(Job& job, std::int64_t server_applied) {
  const bool caught_up = launch::WaitUntil([&] {
    std::lock_guard<std::mutex> lock(job.replica_model.mu);
    return job.replica_model.applied >= server_applied;
  }, 30);
  CHECK(caught_up);
  std::lock_guard<std::mutex> s(job.server_model.mu);
  std::lock_guard<std::mutex> r(job.replica_model.mu);
  CHECK(job.replica_model.applied == job.server_model.applied);
  CHECK(job.replica_model.model == job.server_model.model);
}

TEST_CASE("The replica receives every update the server applied and ends with the same model") {
  auto c = StartCluster(/*divergence_max=*/0);
  Job job;
  StartJob(*c, &job);
  const int kPushes = 8;
  CHECK(PushAll(*c, kPushes) == 2 * kPushes);
  // Copies punted by the last batches follow in replica-only batches.
  const bool caught_up = launch::WaitUntil([&] {
    std::lock_guard<std::mutex> lock(job.replica_model.mu);
    return job.replica_model.applied >= 2 * kPushes;
  }, 30);
  std::lock_guard<std::mutex> s(job.server_model.mu);
  std::lock_guard<std::mutex> r(job.replica_model.mu);
  INFO("replica applied " << job.replica_model.applied << " of " << job.server_model.applied);
  CHECK(caught_up);
  CHECK(job.server_model.applied == 2 * kPushes);
  CHECK(job.replica_model.applied == job.server_model.applied);
  CHECK(job.replica_model.model == job.server_model.model);  // integer-valued: exact
  // The scheduler exports what it knows of the replica: every update
  // applied there, none lagging, nothing for the divergence bound to cover.
  const bool reported = launch::WaitUntil([&] {
    const nlohmann::json replica = ReplicaView(*c);
    return !replica.is_null() && replica["applied"] == 2 * kPushes;
  }, 10);
  const nlohmann::json replica = ReplicaView(*c);
  INFO(replica.dump());
  CHECK(reported);
  CHECK(replica["host"] == "r1");
  CHECK(replica["lag_updates"] == 0);
  CHECK(replica["divergence_estimate"] == 0);
}

// The admin endpoint's service-wide counters (GET /api/v1/cluster).
nlohmann::json Stats(const launch::Cluster& c) {
  const testing::HttpResult r = testing::Http(c.admin_port(), "GET", "/api/v1/cluster");
  REQUIRE(r.status == 200);
  return nlohmann::json::parse(r.body)["stats"];
}

TEST_CASE("Punted copies are summed at an aggregator on their way to the replica") {
  auto c = StartCluster(/*divergence_max=*/0, /*aggregator=*/true);
  Job job;
  StartJob(*c, &job);
  const int kPushes = 10;
  CHECK(PushAll(*c, kPushes) == 2 * kPushes);
  const bool caught_up = launch::WaitUntil([&] {
    std::lock_guard<std::mutex> lock(job.replica_model.mu);
    return job.replica_model.applied >= 2 * kPushes;
  }, 60);
  const nlohmann::json stats = Stats(*c);
  std::printf("replica transfers: %lld (%lld of them aggregates) carrying %lld updates in %lld "
              "bytes (%.2fx fewer than one copy per update)\n",
              stats["replica_copies"].get<long long>(),
              stats["replica_aggregates"].get<long long>(),
              stats["replica_updates"].get<long long>(), stats["replica_bytes"].get<long long>(),
              stats["replica_updates"].get<double>() * kDim * sizeof(float) /
                  std::max(1.0, stats["replica_bytes"].get<double>()));
  std::lock_guard<std::mutex> s(job.server_model.mu);
  std::lock_guard<std::mutex> r(job.replica_model.mu);
  INFO("replica applied " << job.replica_model.applied << " of " << job.server_model.applied
                          << "; stats " << stats.dump());
  CHECK(caught_up);
  CHECK(job.replica_model.applied == job.server_model.applied);
  CHECK(job.replica_model.model == job.server_model.model);  // integer-valued: exact
  CHECK(stats["replica_aggregates"].get<int64_t>() >= 1);
  CHECK(stats["replica_updates"].get<int64_t>() == 2 * kPushes);
  CHECK(stats["replica_bytes"].get<int64_t>() <
        stats["replica_updates"].get<int64_t>() * static_cast<int64_t>(kDim * sizeof(float)));
}

TEST_CASE("With a tight divergence bound the replica still ends exact") {
  // About two updates' worth of divergence (update norms here are ~1e3-5e3).
  auto c = StartCluster(/*divergence_max=*/1e4);
  Job job;
  StartJob(*c, &job);
  const int kPushes = 6;
  CHECK(PushAll(*c, kPushes) >= 1);  // some may be dropped for the bound
  std::int64_t server_applied = 0;
  {
    std::lock_guard<std::mutex> s(job.server_model.mu);
    server_applied = job.server_model.applied;
  }
  CheckReplicaCatchesUp(job, server_applied);
}

// The scheduler's divergence estimate for ps0, or -1 when it cannot be
// read (no Catch2 assertion: the sampler runs on its own thread).
double Estimate(const launch::Cluster& c) {
  const testing::HttpResult r = testing::Http(c.admin_port(), "GET", "/api/v1/jobs");
  if (r.status != 200) return -1;
  const nlohmann::json jobs = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (jobs.is_discarded()) return -1;
  for (const auto& server : jobs["jobs"][0]["servers"]) {
    if (server["name"] == "ps0" && server["replica"].is_object()) {
      return server["replica"].value("divergence_estimate", -1.0);
    }
  }
  return -1;
}

// One sample: ‖w_s − w_r‖ of the two applications' models and the
// scheduler's estimate, read while both models are locked (neither
// application can apply anything meanwhile, so the two describe the same
// moment).
struct Sample {
  double truth = 0;
  double estimate = -1;
  int64_t server_applied = 0;  // updates the server had applied by then
};

// ‖w_s − w_r‖, with both models locked by the caller.
double TrueDivergence(const Job& job) {
  double sum = 0;
  for (size_t k = 0; k < kDim; ++k) {
    const double d = double{job.server_model.model[k]} - job.replica_model.model[k];
    sum += d * d;
  }
  return std::sqrt(sum);
}

Sample TakeSample(const launch::Cluster& c, Job& job) {
  std::lock_guard<std::mutex> s(job.server_model.mu);
  std::lock_guard<std::mutex> r(job.replica_model.mu);
  Sample sample;
  sample.truth = TrueDivergence(job);
  sample.estimate = Estimate(c);
  sample.server_applied = job.server_model.applied;
  return sample;
}

// PushAll(c, pushes) while a sampler takes a sample every 5 ms; *applied
// is PushAll's. Beside it a watcher reads the true divergence alone every
// millisecond (the locks held only for the norm): the sampler holds both
// models across an HTTP call, and on a loaded machine its samples can all
// fall where the replica has caught up; *watched_worst is the largest
// divergence the watcher saw.
std::vector<Sample> SampleWhilePushing(launch::Cluster& c, Job& job, int pushes, int* applied,
                                       double* watched_worst) {
  std::atomic<bool> done{false};
  std::vector<Sample> samples;
  std::thread sampler([&] {
    while (!done.load()) {
      samples.push_back(TakeSample(c, job));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  *watched_worst = 0;
  std::thread watcher([&] {
    while (!done.load()) {
      {
        std::lock_guard<std::mutex> s(job.server_model.mu);
        std::lock_guard<std::mutex> r(job.replica_model.mu);
        *watched_worst = std::max(*watched_worst, TrueDivergence(job));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  *applied = PushAll(c, pushes);
  done = true;
  sampler.join();
  watcher.join();
  return samples;
}

TEST_CASE("Sampled during training, the true divergence stays within the estimate") {
  // replica_bound "plan" (the default, the paper's) keeps Div_max on the
  // plan: copies are timed on the declared link rates, and where they land
  // later the server may run past it (docs/user-guide/replicas.md). On a
  // loaded machine the daemons deliver less than declared (one CI run:
  // true 12,370, estimate 17,088 against 10,000), so how the true
  // divergence compares with Div_max is printed, not asserted; what holds
  // whatever the machine does is: the estimate covers it. The strict test
  // below holds the data plane to Div_max.
  constexpr double kDivergenceMax = 1e4;  // about two updates' worth
  auto c = StartCluster(kDivergenceMax);
  Job job;
  StartJob(*c, &job);
  int applied = 0;
  double watched_worst = 0;
  const std::vector<Sample> samples = SampleWhilePushing(*c, job, 8, &applied, &watched_worst);
  CHECK(applied >= 1);
  int64_t server_applied = 0;
  {
    std::lock_guard<std::mutex> lock(job.server_model.mu);
    server_applied = job.server_model.applied;
  }
  double worst = 0;
  int over_bound = 0, over_estimate = 0, unread = 0, during = 0;
  for (const Sample& s : samples) {
    if (s.estimate < 0) ++unread;
    if (s.server_applied > 0 && s.server_applied < server_applied) ++during;
    worst = std::max(worst, s.truth);
    // float32 sums of integers below 2^24 are exact: no tolerance needed.
    if (s.truth > kDivergenceMax) ++over_bound;
    if (s.truth > s.estimate) ++over_estimate;
  }
  double worst_estimate = 0;
  for (const Sample& s : samples) worst_estimate = std::max(worst_estimate, s.estimate);
  std::printf("divergence sampled %zu times (%d while updates were being applied) over %d "
              "applied updates: true at most %.0f (%.0f between samples), estimate at most %.0f, "
              "bound %.0f; %d samples over the bound, %d over the estimate\n",
              samples.size(), during, applied, worst, watched_worst, worst_estimate,
              kDivergenceMax, over_bound, over_estimate);
  CHECK(samples.size() >= 20);
  CHECK(unread == 0);
  // The samples span the training, not only its ends, and the replica was
  // seen behind: without lag the estimate check below would hold for a
  // scheduler whose estimate missed every copy in flight.
  CHECK(during > 0);
  CHECK(std::max(worst, watched_worst) > 0);
  CHECK(over_estimate == 0);
  // And the lag is only ever a delay: every update the server applied
  // reaches the replica, which ends with the server's model exactly.
  CheckReplicaCatchesUp(job, server_applied);
}

TEST_CASE("replica_bound strict: a slow replica is never more than the bound behind") {
  // The replica's application takes 60 ms per update, so its copies are
  // applied long after the plan (timed on the links) expects; "plan" lets
  // the server run ahead (in this setup: 20,783 against the bound of
  // 10,000, 54 of 143 samples over it), "strict" holds its pushes until
  // the replica caught up.
  constexpr double kDivergenceMax = 1e4;  // about two updates' worth
  auto c = StartCluster(kDivergenceMax, /*aggregator=*/false, {"--replica_bound=strict"});
  Job job;
  StartJob(*c, &job, /*replica_apply_ms=*/60);
  int applied = 0;
  double watched_worst = 0;
  const std::vector<Sample> samples = SampleWhilePushing(*c, job, 8, &applied, &watched_worst);
  double worst = 0;
  int over_bound = 0, over_estimate = 0;
  for (const Sample& s : samples) {
    worst = std::max(worst, s.truth);
    if (s.truth > kDivergenceMax) ++over_bound;
    if (s.truth > s.estimate) ++over_estimate;
  }
  const testing::HttpResult r = testing::Http(c->admin_port(), "GET", "/api/v1/cluster");
  REQUIRE(r.status == 200);
  const int64_t waits = nlohmann::json::parse(r.body)["stats"].value("replica_bound_waits", -1);
  std::printf("strict bound: %d applied, divergence sampled %zu times, true at most %.0f, "
              "bound %.0f, %d samples over it, %d over the estimate; pushes held back %lld "
              "batch(es)\n",
              applied, samples.size(), worst, kDivergenceMax, over_bound, over_estimate,
              static_cast<long long>(waits));
  CHECK(applied >= 8);
  CHECK(samples.size() >= 20);
  CHECK(std::max(worst, watched_worst) > 0);  // the slow replica lagged, and was seen behind
  CHECK(over_bound == 0);
  CHECK(over_estimate == 0);
  CHECK(waits > 0);  // the gate did hold pushes back
}

TEST_CASE("Losing the replica's daemon does not fail the job's pushes") {
  auto c = StartCluster(/*divergence_max=*/0);
  Job job;
  StartJob(*c, &job);
  CHECK(PushAll(*c, 2) == 4);
  ::kill(c->daemon("r1").pid(), SIGKILL);
  CHECK(PushAll(*c, 3) == 6);
  std::lock_guard<std::mutex> s(job.server_model.mu);
  CHECK(job.server_model.applied == 10);
}

}  // namespace
}  // namespace mlfabric
