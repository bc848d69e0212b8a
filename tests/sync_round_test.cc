// Synchronous rounds (Mercury PS, mercury.md §IV Key idea 3; mlfabric.md §6)
// across real processes: the real scheduler and daemons, with the server
// and workers in this test process talking to their daemons over the real
// local IPC. A server registered with round_size M gets each round once,
// summed by its daemon packet by packet, and every worker's get after its
// push streams back exactly that round's sum.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/allreduce.h"
#include "api/registration.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "tests/test_util.h"

namespace mlfabric {
namespace {


// `job_keys`: more keys of job "demo" in the scheduler's config.
std::unique_ptr<launch::Cluster> StartCluster(
    const std::vector<std::string>& hosts, const std::vector<std::string>& extra_flags = {},
    const std::map<std::string, std::vector<std::string>>& host_flags = {},
    const std::string& job_keys = "") {
  const std::string dir = launch::MakeTempDir("sync-round");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789")"
                        << job_keys << "}]}";
  std::vector<std::string> flags = {"--config=" + config, "--planner=mlfabric"};
  flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
  auto cluster = launch::Cluster::StartLoopback(hosts, flags, {}, host_flags);
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  return std::move(*cluster);
}

ClientOptions Options(const launch::Cluster& c, const std::string& host, const std::string& name) {
  ClientOptions options;
  options.daemon_socket = c.Socket(host);
  options.name = name;
  return options;
}

// Integer-valued floats: every sum is exact in float32.
std::vector<float> Update(int worker, int round, size_t dim) {
  std::vector<float> v(dim);
  for (size_t i = 0; i < dim; ++i) v[i] = static_cast<float>((worker + 1) * (round + 1) + i % 97);
  return v;
}

// The round server: checks that each round arrives once, whole and exact.
struct RoundServer {
  std::unique_ptr<Server> server;
  std::mutex mu;
  std::vector<int64_t> rounds;   // versions delivered, in order
  std::vector<std::string> errors;
  std::thread thread;
  RoundServer(std::unique_ptr<Server> s, int workers, size_t dim) : server(std::move(s)) {
    server->RegisterUpdateCallback([this, workers, dim](const Server::Update& u)
                                       -> absl::StatusOr<int64_t> {
      std::lock_guard<std::mutex> lock(mu);
      const int round = static_cast<int>(u.version);
      if (u.count != workers || u.bytes != dim * sizeof(float)) {
        errors.push_back("round " + std::to_string(round) + " has count " +
                         std::to_string(u.count) + ", bytes " + std::to_string(u.bytes));
      } else {
        std::vector<float> sum(dim), got(dim);
        for (int w = 0; w < workers; ++w) {
          const std::vector<float> v = Update(w, round, dim);
          for (size_t i = 0; i < dim; ++i) sum[i] += v[i];
        }
        std::memcpy(got.data(), u.data, u.bytes);
        if (got != sum) errors.push_back("round " + std::to_string(round) + " sum differs");
      }
      rounds.push_back(u.version);
      return u.version + 1;
    });
    server->RegisterRequestCallback([]() -> absl::StatusOr<Server::Snapshot> {
      return Server::Snapshot{0, std::vector<uint8_t>(4, 0)};
    });
    thread = std::thread([this] { (void)server->Serve(); });
  }
  ~RoundServer() {
    server->Stop();
    thread.join();
  }
};

struct WorkerResult {
  std::vector<std::string> errors;
  std::vector<int64_t> applied_versions;
};

// One worker's rounds [first_round, rounds): push round r, get the sum,
// check it exactly (the sum of workers 0 .. workers - 1).
WorkerResult RunWorker(Worker& worker, int index, int workers, int rounds, size_t dim,
                       int first_round = 0) {
  WorkerResult out;
  for (int r = first_round; r < rounds; ++r) {
    const std::vector<float> mine = Update(index, r, dim);
    auto pushed = worker.Push("ps0", mine.data(), mine.size() * sizeof(float), r, 0.0);
    auto sum = worker.Get("ps0");
    const PushResult result = pushed.get();
    if (result.outcome != PushOutcome::kApplied) {
      out.errors.push_back("round " + std::to_string(r) + " push " +
                           PushOutcomeName(result.outcome) + ": " + result.reason);
      continue;
    }
    out.applied_versions.push_back(result.applied_version);
    if (!sum.ok()) {
      out.errors.push_back("round " + std::to_string(r) + " get: " +
                           std::string(sum.status().message()));
      continue;
    }
    if (sum->version != r + 1 || sum->size() != dim * sizeof(float) || sum->count != workers) {
      out.errors.push_back("round " + std::to_string(r) + " get returned version " +
                           std::to_string(sum->version) + ", " + std::to_string(sum->size()) +
                           " bytes, a sum of " + std::to_string(sum->count) + " pushes");
      continue;
    }
    std::vector<float> expected(dim), got(dim);
    for (int w = 0; w < workers; ++w) {
      const std::vector<float> v = Update(w, r, dim);
      for (size_t i = 0; i < dim; ++i) expected[i] += v[i];
    }
    std::memcpy(got.data(), sum->data(), sum->size());
    if (got != expected) out.errors.push_back("round " + std::to_string(r) + ": sum differs");
  }
  return out;
}

void RunRounds(launch::Cluster& c, const std::vector<std::string>& worker_hosts, int rounds,
               size_t dim) {
  const int n = static_cast<int>(worker_hosts.size());
  ClientOptions server_options = Options(c, "s1", "ps0");
  server_options.round_size = n;
  auto server = Server::Connect(server_options);
  INFO(server.status().ToString());
  REQUIRE(server.ok());
  RoundServer ps(std::move(*server), n, dim);
  std::vector<std::unique_ptr<Worker>> workers;
  for (int w = 0; w < n; ++w) {
    auto worker = Worker::Connect(Options(c, worker_hosts[w], "w" + std::to_string(w)));
    REQUIRE(worker.ok());
    workers.push_back(std::move(*worker));
  }
  std::vector<WorkerResult> results(n);
  std::vector<std::thread> threads;
  for (int w = 0; w < n; ++w) {
    threads.emplace_back(
        [&, w] { results[w] = RunWorker(*workers[w], w, n, rounds, dim); });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < n; ++w) {
    for (const std::string& e : results[w].errors) FAIL_CHECK("worker " << w << ": " << e);
    // Every member of round r is applied at version r + 1.
    for (size_t r = 0; r < results[w].applied_versions.size(); ++r) {
      CHECK(results[w].applied_versions[r] == static_cast<int64_t>(r) + 1);
    }
  }
  // The server saw each round exactly once, in order, exact.
  REQUIRE(launch::WaitUntil([&] {
    std::lock_guard<std::mutex> lock(ps.mu);
    return static_cast<int>(ps.rounds.size()) >= rounds;
  }, 30));
  std::lock_guard<std::mutex> lock(ps.mu);
  for (const std::string& e : ps.errors) FAIL_CHECK("server: " << e);
  std::vector<int64_t> expected(rounds);
  for (int r = 0; r < rounds; ++r) expected[r] = r;
  CHECK(ps.rounds == expected);
}

TEST_CASE("Each round is summed packet by packet and every get returns the exact sum") {
  auto c = StartCluster({"s1", "w1", "w2", "w3"});
  // 1.2 MB updates: 37 sum chunks stream back per round.
  RunRounds(*c, {"w1", "w2", "w3"}, /*rounds=*/6, /*dim=*/300000);
}

TEST_CASE("Rounds run on grants: after a planned round, pushes leave without a plan, exact") {
  // scheduler/service/round_grants.h: each member's planned transfer
  // carries a grant for its next round; its daemon sends that push at
  // once and the scheduler announces it instead of planning it. As in an
  // AllReduce, one worker is on the root's host (its push is taken in
  // there, once announced) and one is not: both go direct (a member the
  // plan sends through an aggregator or a chain gets no grant).
  const std::vector<std::string> workers = {"s1", "w1"};
  for (const bool grants : {true, false}) {
    CAPTURE(grants);
    std::map<std::string, std::vector<std::string>> debug;
    for (const std::string& h : workers) debug[h] = {"--log_level=debug"};
    auto c = StartCluster({"s1", "w1"},
                          {grants ? "--round_grants=true" : "--round_grants=false"}, debug);
    constexpr int kRounds = 6;
    RunRounds(*c, workers, kRounds, /*dim=*/300000);
    for (const std::string& h : workers) {
      const int on_grant = testing::CountOccurrences(c->daemon(h).Log(), ", sent on grant ");
      std::printf("sync_round_test: %s sent %d of %d pushes on a grant (round_grants %s)\n",
                  h.c_str(), on_grant, kRounds, grants ? "on" : "off");
      // Round 0 is planned, and so is a round after one whose links' reported
      // capacities moved more than round_grant_change (none do here).
      CHECK(on_grant == (grants ? kRounds - 1 : 0));
    }
  }
}

TEST_CASE("A round's sum reaches its workers through a tree of workers, exact (§10.3, §6)") {
  // Fanout 2 (the default): the root's host sends each round's sum to the
  // first two workers that ask; each later one gets it from an earlier one,
  // forwarded chunk by chunk as it arrives.
  const std::vector<std::string> workers = {"w1", "w2", "w3", "w4", "w5", "w6"};
  std::vector<std::string> hosts = {"s1"};
  std::map<std::string, std::vector<std::string>> debug;
  for (const std::string& h : workers) hosts.push_back(h);
  for (const std::string& h : hosts) debug[h] = {"--log_level=debug"};
  auto c = StartCluster(hosts, {}, debug);
  constexpr int kRounds = 4;
  RunRounds(*c, workers, kRounds, /*dim=*/300000);
  const int routed = testing::CountOccurrences(c->daemon("s1").Log(), "goes through");
  int forwarded = 0;
  for (const std::string& h : workers) {
    forwarded += testing::CountOccurrences(c->daemon(h).Log(), "forwards batch");
  }
  std::printf("sync_round_test: %d of %d round gets through other workers, %d forwards\n",
              routed, kRounds * 6, forwarded);
  CHECK(routed == kRounds * 4);
  CHECK(forwarded == routed);
}

TEST_CASE("With a slow server link, rounds go through an aggregation tree of workers (§6)") {
  // The server's downlink is 10x slower: Alg. 3 sends some workers'
  // updates to another worker's daemon, which sums and forwards them.
  auto c = StartCluster({"s1", "w1", "w2", "w3", "w4"}, {},
                        {{"s1", {"--downlink_bps=1e9"}}});
  RunRounds(*c, {"w1", "w2", "w3", "w4"}, /*rounds=*/5, /*dim=*/262144);
  int aggregates = 0;
  for (const char* host : {"w1", "w2", "w3", "w4"}) {
    aggregates += testing::CountOccurrences(c->daemon(host).Log(), "forwarding to s1");
  }
  std::printf("sync_round_test: %d in-network aggregates over 5 rounds of 4 workers\n",
              aggregates);
  CHECK(aggregates > 0);
}

TEST_CASE("A push that does not match its round fails the round on every worker; the next works") {
  auto c = StartCluster({"s1", "w1", "w2", "w3"});
  ClientOptions server_options = Options(*c, "s1", "ps0");
  server_options.round_size = 3;
  auto server = Server::Connect(server_options);
  REQUIRE(server.ok());
  RoundServer ps(std::move(*server), 3, 1000);
  std::vector<std::unique_ptr<Worker>> workers;
  for (const char* host : {"w1", "w2", "w3"}) {
    auto worker = Worker::Connect(Options(*c, host, std::string("x") + host));
    REQUIRE(worker.ok());
    workers.push_back(std::move(*worker));
  }
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      std::vector<float> v(w == 2 ? 1001 : 1000, 1.0f);  // worker 2 is one element longer
      auto pushed = workers[w]->Push("ps0", v.data(), v.size() * sizeof(float), 0, 0.0);
      auto sum = workers[w]->Get("ps0");
      PushResult result = pushed.get();
      errors[w] = result.reason + " | " + (sum.ok() ? "get ok" : std::string(sum.status().message()));
      if (result.outcome == PushOutcome::kApplied || sum.ok()) errors[w] = "no error: " + errors[w];
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < 3; ++w) {
    INFO("worker " << w << ": " << errors[w]);
    CHECK(errors[w].find("mismatch:") != std::string::npos);
    CHECK(errors[w].find("no error") == std::string::npos);
  }
  // Round 0 is spent; round 1 sums normally.
  threads.clear();
  std::vector<WorkerResult> results(3);
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      const std::vector<float> mine = Update(w, 1, 1000);
      auto pushed = workers[w]->Push("ps0", mine.data(), mine.size() * sizeof(float), 1, 0.0);
      auto sum = workers[w]->Get("ps0");
      if (pushed.get().outcome != PushOutcome::kApplied || !sum.ok() || sum->version != 2) {
        results[w].errors.push_back("round 1 did not complete");
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < 3; ++w) CHECK(results[w].errors.empty());
}

TEST_CASE("A round some worker never joins fails after round_timeout_s; no get hangs") {
  auto c = StartCluster({"s1", "w1", "w2"}, {"--round_timeout_s=1", "--transfer_slack_s=1"});
  ClientOptions server_options = Options(*c, "s1", "ps0");
  server_options.round_size = 3;  // the third worker never comes
  auto server = Server::Connect(server_options);
  REQUIRE(server.ok());
  RoundServer ps(std::move(*server), 3, 1000);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      auto worker = Worker::Connect(Options(*c, w == 0 ? "w1" : "w2", "y" + std::to_string(w)));
      if (!worker.ok()) return;
      const std::vector<float> mine = Update(w, 0, 1000);
      auto pushed = (*worker)->Push("ps0", mine.data(), mine.size() * sizeof(float), 0, 0.0);
      auto sum = (*worker)->Get("ps0");
      PushResult result = pushed.get();
      errors[w] = std::string(PushOutcomeName(result.outcome)) + ": " + result.reason + " | " +
                  (sum.ok() ? "get ok" : std::string(sum.status().message()));
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < 2; ++w) {
    INFO("worker " << w << ": " << errors[w]);
    CHECK(errors[w].rfind("failed: ", 0) == 0);
    CHECK(errors[w].find("timed out") != std::string::npos);
    CHECK(errors[w].find("get ok") == std::string::npos);
  }
  std::lock_guard<std::mutex> lock(ps.mu);
  CHECK(ps.rounds.empty());
}

// A server whose rounds are sized by the job's members: checks that round r
// arrives once, summed over exactly `members_of(r)` workers 0 .. n - 1.
struct MemberSizedServer {
  std::unique_ptr<Server> server;
  std::mutex mu;
  std::vector<int64_t> rounds;
  std::vector<int> counts;
  std::vector<std::string> errors;
  std::thread thread;
  MemberSizedServer(std::unique_ptr<Server> s, std::function<int(int)> members_of, size_t dim)
      : server(std::move(s)) {
    server->RegisterUpdateCallback([this, members_of, dim](const Server::Update& u)
                                       -> absl::StatusOr<int64_t> {
      std::lock_guard<std::mutex> lock(mu);
      const int round = static_cast<int>(u.version);
      const int n = members_of(round);
      std::vector<float> sum(dim), got(dim);
      for (int w = 0; w < n; ++w) {
        const std::vector<float> v = Update(w, round, dim);
        for (size_t i = 0; i < dim; ++i) sum[i] += v[i];
      }
      if (u.bytes != dim * sizeof(float)) {
        errors.push_back("round " + std::to_string(round) + " has " + std::to_string(u.bytes) +
                         " bytes");
      } else {
        std::memcpy(got.data(), u.data, u.bytes);
        if (got != sum) errors.push_back("round " + std::to_string(round) + " sum differs");
      }
      rounds.push_back(u.version);
      counts.push_back(u.count);
      return u.version + 1;
    });
    server->RegisterRequestCallback([]() -> absl::StatusOr<Server::Snapshot> {
      return Server::Snapshot{0, std::vector<uint8_t>(4, 0)};
    });
    thread = std::thread([this] { (void)server->Serve(); });
  }
  ~MemberSizedServer() {
    server->Stop();
    thread.join();
  }
};

// Runs rounds [first, last) on `workers` (indices 0 .. n - 1) in parallel.
void RunMembers(std::vector<std::unique_ptr<Worker>>& workers, int n, int first, int last,
                size_t dim) {
  std::vector<WorkerResult> results(n);
  std::vector<std::thread> threads;
  for (int w = 0; w < n; ++w) {
    threads.emplace_back([&, w] { results[w] = RunWorker(*workers[w], w, n, last, dim, first); });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < n; ++w) {
    for (const std::string& e : results[w].errors) FAIL_CHECK("worker " << w << ": " << e);
    REQUIRE(results[w].applied_versions.size() == static_cast<size_t>(last - first));
    for (int r = first; r < last; ++r) {
      CHECK(results[w].applied_versions[r - first] == r + 1);
    }
  }
}

// Three members push kBefore rounds of a sync-mode job whose server has no
// round size (rounds sized by the live members); `leave` removes worker 2
// (w3's), and the scheduler's log must say `left_line`; the next rounds are
// summed over the two others, each once, with exact sums.
void MemberLeavesAndRoundsGoOn(
    const std::function<void(launch::Cluster&, std::vector<std::unique_ptr<Worker>>&)>& leave,
    const std::string& left_line) {
  auto c = StartCluster({"s1", "w1", "w2", "w3"}, {}, {}, R"(, "mode": "sync")");
  constexpr size_t kDim = 100000;
  constexpr int kBefore = 2, kRounds = 5;
  auto server = Server::Connect(Options(*c, "s1", "ps0"));  // no round size: the members'
  INFO(server.status().ToString());
  REQUIRE(server.ok());
  MemberSizedServer ps(std::move(*server), [](int round) { return round < kBefore ? 3 : 2; },
                       kDim);
  std::vector<std::unique_ptr<Worker>> workers;
  for (int w = 0; w < 3; ++w) {  // all registered before the first push
    auto worker = Worker::Connect(Options(*c, "w" + std::to_string(w + 1), "w" + std::to_string(w)));
    REQUIRE(worker.ok());
    workers.push_back(std::move(*worker));
  }
  RunMembers(workers, 3, 0, kBefore, kDim);

  leave(*c, workers);
  REQUIRE(launch::WaitUntil([&] {
    return c->scheduler().Log().find(left_line) != std::string::npos;
  }, 30));
  // Three joins and one leave.
  CHECK(c->scheduler().Log().find("membership generation 5, 2 member(s)") != std::string::npos);

  RunMembers(workers, 2, kBefore, kRounds, kDim);
  REQUIRE(launch::WaitUntil([&] {
    std::lock_guard<std::mutex> lock(ps.mu);
    return static_cast<int>(ps.rounds.size()) >= kRounds;
  }, 30));
  std::lock_guard<std::mutex> lock(ps.mu);
  for (const std::string& e : ps.errors) FAIL_CHECK("server: " << e);
  CHECK(ps.rounds == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(ps.counts == std::vector<int>{3, 3, 2, 2, 2});
}

TEST_CASE("A sync job whose worker's host dies goes on with the survivors; sums stay exact") {
  // Elastic membership: worker 2's daemon is killed (its host dies); the
  // scheduler drops it from the membership.
  MemberLeavesAndRoundsGoOn(
      [](launch::Cluster& c, std::vector<std::unique_ptr<Worker>>& workers) {
        REQUIRE(c.KillDaemon("w3").ok());
        workers.pop_back();
      },
      "worker w2 left");
}

TEST_CASE("A sync job whose worker application exits goes on with the others; sums stay exact") {
  // Only worker 2's application ends (its daemon stays): the daemon reports
  // it gone (ReportEntityGone, ROLE_WORKER).
  MemberLeavesAndRoundsGoOn(
      [](launch::Cluster&, std::vector<std::unique_ptr<Worker>>& workers) {
        workers.pop_back();  // w2's application closes its connection to w3's daemon
      },
      "worker w2 left (its application left host w3");
}

// Three members run rounds 0 and 1 of a sync job with `member_loss`; the
// survivors' pushes of round 2 are announced to the server's daemon (the
// scheduler's debug log says so) when worker 2's host dies. How each
// survivor's round-2 push and get ended ("<outcome>: <reason> | get ok"
// or the get's error), and the survivors, for rounds after.
struct MemberDiesMidRound {
  static constexpr size_t kDim = 1000;
  std::unique_ptr<launch::Cluster> c;
  std::unique_ptr<MemberSizedServer> ps;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::string> ended = std::vector<std::string>(2);

  MemberDiesMidRound(const std::string& member_loss, std::function<int(int)> members_of) {
    c = StartCluster({"s1", "w1", "w2", "w3"}, {"--log_level=debug"}, {},
                     R"(, "mode": "sync", "member_loss": ")" + member_loss + R"(")");
    auto server = Server::Connect(Options(*c, "s1", "ps0"));
    REQUIRE(server.ok());
    ps = std::make_unique<MemberSizedServer>(std::move(*server), members_of, kDim);
    for (int w = 0; w < 3; ++w) {
      auto worker =
          Worker::Connect(Options(*c, "w" + std::to_string(w + 1), "w" + std::to_string(w)));
      REQUIRE(worker.ok());
      workers.push_back(std::move(*worker));
    }
    RunMembers(workers, 3, 0, 2, kDim);
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([this, w] {
        const std::vector<float> mine = Update(w, 2, kDim);
        auto pushed = workers[w]->Push("ps0", mine.data(), mine.size() * sizeof(float), 2, 0.0);
        auto sum = workers[w]->Get("ps0");
        const PushResult result = pushed.get();
        std::string got = "get ok";
        if (!sum.ok()) {
          got = std::string(sum.status().message());
        } else if (sum->count != 2) {
          got = "get ok but of a sum of " + std::to_string(sum->count) + " pushes";
        } else if (sum->size() != kDim * sizeof(float)) {
          got = "get of " + std::to_string(sum->size()) + " bytes";
        } else {
          // Exactly the two survivors' updates.
          const std::vector<float> a = Update(0, 2, kDim), b = Update(1, 2, kDim);
          std::vector<float> values(kDim);
          std::memcpy(values.data(), sum->data(), sum->size());
          for (size_t i = 0; i < kDim; ++i) {
            if (values[i] != a[i] + b[i]) got = "get ok but element " + std::to_string(i) + " differs";
          }
        }
        ended[w] = std::string(PushOutcomeName(result.outcome)) + ": " + result.reason + " | " + got;
      });
    }
    REQUIRE(launch::WaitUntil([&] {
      return testing::CountOccurrences(c->scheduler().Log(), " for round 2 at ") >= 2;
    }, 30));
    REQUIRE(c->KillDaemon("w3").ok());
    for (auto& t : threads) t.join();
    workers.pop_back();
  }

  // Round 3 on the two survivors; the server then has `rounds` with `counts`.
  void RoundThreeAndCheck(const std::vector<int64_t>& rounds, const std::vector<int>& counts) {
    RunMembers(workers, 2, 3, 4, kDim);
    REQUIRE(launch::WaitUntil([&] {
      std::lock_guard<std::mutex> lock(ps->mu);
      return ps->rounds.size() >= rounds.size();
    }, 30));
    std::lock_guard<std::mutex> lock(ps->mu);
    for (const std::string& e : ps->errors) FAIL_CHECK("server: " << e);
    CHECK(ps->rounds == rounds);
    CHECK(ps->counts == counts);
  }
};

TEST_CASE("member_loss fail: the round a dying worker leaves open fails once, saying why") {
  // Round 2 fails on both survivors with the reason; round 3 is summed over
  // the two, exact.
  MemberDiesMidRound f("fail", [](int round) { return round < 2 ? 3 : 2; });
  for (int w = 0; w < 2; ++w) {
    INFO("worker " << w << ": " << f.ended[w]);
    CHECK(f.ended[w].rfind("failed: ", 0) == 0);
    // Directly, or through the in-network aggregate it was planned into.
    CHECK(f.ended[w].find("round 2 failed: worker 'w2' left the job (its host w3 is down") !=
          std::string::npos);
    CHECK(f.ended[w].find("at membership generation 5") != std::string::npos);
    CHECK(f.ended[w].find("member_loss is fail") != std::string::npos);
    CHECK(f.ended[w].find("(round 2 opened at membership generation 4)") != std::string::npos);
    CHECK(f.ended[w].find("get ok") == std::string::npos);
  }
  f.RoundThreeAndCheck({0, 1, 3}, {3, 3, 2});
}

TEST_CASE("member_loss shrink: the round a dying worker leaves open completes with the others") {
  // The server's daemon had round 2 announced with size 3; the scheduler
  // tells it to close with 2, so both survivors' pushes apply, their gets
  // return the exact sum of the two, and the server is handed count 2.
  MemberDiesMidRound f("shrink", [](int round) { return round < 2 ? 3 : 2; });
  for (int w = 0; w < 2; ++w) {
    INFO("worker " << w << ": " << f.ended[w]);
    CHECK(f.ended[w].rfind("applied: ", 0) == 0);
    CHECK(f.ended[w].find("| get ok") != std::string::npos);
    CHECK(f.ended[w].find("differs") == std::string::npos);
  }
  // Announced to the server's daemon with size 3 and closed with 2, or
  // (when w3 died before a batch planned the two pushes) sized down to 2
  // before it was announced: either way the scheduler says so.
  const std::string log = f.c->scheduler().Log();
  CHECK((log.find("round 2 closes with 2 of its 3 pushes (member_loss shrink)") !=
             std::string::npos ||
         log.find("round 2 of server 'ps0', not yet announced, closes with 2 of its 3 pushes "
                  "(member_loss shrink)") != std::string::npos));
  f.RoundThreeAndCheck({0, 1, 2, 3}, {3, 3, 2, 2});
}


TEST_CASE("An elastic AllReduce (member_loss written shrink) goes on with 3 of 4 ranks, exact") {
  // Rank r on host h<r>; rank 0 runs the root. After three rounds of four,
  // rank 3's application ends and its host dies: the survivors' rounds are
  // summed over the three of them, exactly, and summed() says 3.
  auto c = StartCluster({"h0", "h1", "h2", "h3"}, {}, {}, R"(, "member_loss": "shrink")");
  constexpr int kRanks = 4, kBefore = 3, kAfter = 4;
  constexpr size_t kCount = 20000;
  auto value = [](int round, int rank, size_t k) {
    return static_cast<int32_t>(round * 1000 + rank * 10 + static_cast<int>(k % 7));
  };
  auto expected = [&](int round, int ranks, size_t k) {
    int32_t sum = 0;
    for (int r = 0; r < ranks; ++r) sum += value(round, r, k);
    return sum;
  };
  std::vector<std::string> errors(kRanks);
  std::vector<int> summed_after(kRanks, -1);
  std::atomic<int> before_done{0};
  std::atomic<bool> gone{false};
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      AllReduceOptions options;
      options.backend = "mlfabric";
      options.rank = r;
      options.size = kRanks;
      options.timeout_s = 60;
      options.client.daemon_socket = c->Socket("h" + std::to_string(r));
      auto reducer = MakeAllReducer(options);
      if (!reducer.ok()) {
        errors[r] = "construct: " + std::string(reducer.status().message());
        ++before_done;
        return;
      }
      auto run = [&](int round, int ranks_in) {
        std::vector<int32_t> data(kCount);
        for (size_t k = 0; k < kCount; ++k) data[k] = value(round, r, k);
        const absl::Status status = (*reducer)->AllReduce(data.data(), kCount, DataType::kInt32);
        if (!status.ok()) return "round " + std::to_string(round) + ": " + std::string(status.message());
        for (size_t k = 0; k < kCount; ++k) {
          if (data[k] != expected(round, ranks_in, k)) {
            return "round " + std::to_string(round) + ": element " + std::to_string(k) + " is " +
                   std::to_string(data[k]) + ", not the sum over " + std::to_string(ranks_in);
          }
        }
        return std::string();
      };
      for (int round = 0; round < kBefore && errors[r].empty(); ++round) errors[r] = run(round, kRanks);
      ++before_done;
      if (r == kRanks - 1) return;  // its reducer ends here; its host dies below
      while (!gone.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      for (int round = kBefore; round < kBefore + kAfter && errors[r].empty(); ++round) {
        errors[r] = run(round, kRanks - 1);
      }
      summed_after[r] = (*reducer)->summed();
    });
  }
  REQUIRE(launch::WaitUntil([&] { return before_done.load() == kRanks; }, 120));
  ranks.back().join();
  REQUIRE(c->KillDaemon("h3").ok());
  gone.store(true);
  for (int r = 0; r < kRanks - 1; ++r) ranks[r].join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(errors[r].empty());
    if (!errors[r].empty()) std::printf("rank %d: %s\n", r, errors[r].c_str());
  }
  for (int r = 0; r < kRanks - 1; ++r) CHECK(summed_after[r] == kRanks - 1);
}

TEST_CASE("Workers of a job see each other's membership and its generation change when one leaves") {
  auto c = StartCluster({"w1", "w2"}, {}, {}, R"(, "mode": "sync")");
  auto w0 = Worker::Connect(Options(*c, "w1", "w0"));
  REQUIRE(w0.ok());
  auto w1 = Worker::Connect(Options(*c, "w2", "w1"));
  REQUIRE(w1.ok());
  const std::vector<std::string> both = {"w0", "w1"};
  for (Worker* worker : {w0->get(), w1->get()}) {
    absl::StatusOr<JobMembers> members = worker->Membership();
    INFO(members.status().ToString());
    REQUIRE(members.ok());
    CHECK(members->generation == 3);  // 1, then two joins
    CHECK(members->members == both);
  }
  {
    // A second connection under w1's name (an elastic rank rebuilding its
    // AllReducer holds one) joins nothing, and closing it leaves nothing:
    // w1 is still connected.
    auto again = Worker::Connect(Options(*c, "w2", "w1"));
    REQUIRE(again.ok());
    absl::StatusOr<JobMembers> members = (*again)->Membership();
    REQUIRE(members.ok());
    CHECK(members->generation == 3);
  }
  w0->reset();  // its application's connection closes: the daemon reports it gone
  absl::StatusOr<JobMembers> after;
  REQUIRE(launch::WaitUntil([&] {
    after = (*w1)->Membership();
    return after.ok() && after->members.size() == 1;
  }, 30));
  CHECK(after->generation == 4);
  CHECK(after->members == std::vector<std::string>{"w1"});
  CHECK(c->scheduler().Log().find("worker w1 left") == std::string::npos);
}

}  // namespace
}  // namespace mlfabric
