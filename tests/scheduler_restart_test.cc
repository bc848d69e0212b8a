// The scheduler restarts (kill -9, a new process on the same port) and the
// job goes on: the daemons register again, the server's
// daemon sees the new epoch and forgets the old commit positions (the new
// scheduler numbers them from 1), and pushes after the restart apply. The
// server's model is exactly the sum of every push reported applied, before
// and after: nothing lost, nothing applied twice. The pushes before the
// restart ended before it. The second case restarts the scheduler while
// pushes are in flight and checks that each ends exactly once, as the
// servers' daemons say (scheduler/service/in_doubt.h).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "api/allreduce.h"
#include "api/registration.h"
#include "api/replica.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "tests/test_util.h"

namespace mlfabric {
namespace {

constexpr size_t kDim = 1000;

// A server application's model that sums the float updates it is given,
// each after `delay` (a slow server: updates queue at its daemon).
struct SumModel {
  std::mutex mu;
  std::vector<double> model = std::vector<double>(kDim, 0.0);
  int64_t version = 0;
  std::chrono::milliseconds delay{0};

  // Serves ps0 on `host` of `c` from this model.
  testing::InProcessServer Serve(launch::Cluster& c, const std::string& host) {
    return testing::InProcessServer(
        c.Socket(host), "ps0",
        [this](const Server::Update& u) -> absl::StatusOr<int64_t> {
          std::this_thread::sleep_for(delay);
          std::lock_guard<std::mutex> lock(mu);
          const float* values = reinterpret_cast<const float*>(u.data);
          for (size_t i = 0; i < kDim; ++i) model[i] += values[i];
          version += u.count;
          return version;
        },
        [this]() -> absl::StatusOr<Server::Snapshot> {
          std::lock_guard<std::mutex> lock(mu);
          Server::Snapshot s;
          s.version = version;
          const std::vector<float> as_float(model.begin(), model.end());
          s.bytes.resize(kDim * sizeof(float));
          std::memcpy(s.bytes.data(), as_float.data(), s.bytes.size());
          return s;
        });
  }
};

// A loopback cluster of `hosts` whose job "demo" has `job_fields` (JSON
// members after the token), its scheduler given `flags` too.
std::unique_ptr<launch::Cluster> StartCluster(const std::string& name,
                                               const std::vector<std::string>& hosts,
                                               const std::string& job_fields,
                                               std::vector<std::string> flags = {}) {
  const std::string config = launch::MakeTempDir(name) + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789")"
                        << job_fields << "}]}";
  flags.push_back("--config=" + config);
  auto started = launch::Cluster::StartLoopback(hosts, flags);
  INFO(started.status().ToString());
  REQUIRE(started.ok());
  return std::move(*started);
}

// Waits (60 s at most) until the restarted scheduler's log names every
// one of `registrations` ("server ps0 on s1", ...) after it listened again.
bool RegisteredAgain(launch::Cluster& c, const std::vector<std::string>& registrations) {
  return launch::WaitUntil(
      [&] {
        const std::string log = c.scheduler().Log();
        const size_t restarted = log.rfind("listening on");
        if (restarted == std::string::npos) return false;
        for (const std::string& line : registrations) {
          if (log.find(line, restarted) == std::string::npos) return false;
        }
        return true;
      },
      60);
}

TEST_CASE("After a scheduler restart, pushes apply again and the model stays exact") {
  auto cluster = StartCluster("scheduler-restart", {"s1", "w1"}, "");
  launch::Cluster& c = *cluster;

  SumModel summed;
  testing::InProcessServer server = summed.Serve(c, "s1");
  REQUIRE(server.status().ok());
  ClientOptions options;
  options.daemon_socket = c.Socket("w1");
  options.name = "w1";
  auto worker = Worker::Connect(options);
  REQUIRE(worker.ok());

  std::vector<double> expected(kDim, 0.0);
  int applied = 0;
  auto push_round = [&](int first, int count) {
    for (int p = first; p < first + count; ++p) {
      std::vector<float> update(kDim);
      for (size_t i = 0; i < kDim; ++i) update[i] = static_cast<float>((p * 7 + i) % 5);
      PushResult result =
          (*worker)->Push("ps0", update.data(), update.size() * sizeof(float), 0, 1.0).get();
      INFO("push " << p << ": " << PushOutcomeName(result.outcome) << ": " << result.reason);
      REQUIRE(result.outcome == PushOutcome::kApplied);
      ++applied;
      for (size_t i = 0; i < kDim; ++i) expected[i] += update[i];
    }
  };
  push_round(0, 5);

  REQUIRE(c.RestartScheduler().ok());
  // Both daemons and both applications register again with the new one.
  REQUIRE(RegisteredAgain(c, {"server ps0 on s1", "worker w1 on w1"}));
  push_round(5, 5);

  CHECK(c.daemon("s1").Log().find("the scheduler restarted (epoch") != std::string::npos);
  std::lock_guard<std::mutex> lock(summed.mu);
  CHECK(summed.version == applied);
  int mismatches = 0;
  for (size_t i = 0; i < kDim; ++i) mismatches += summed.model[i] != expected[i];
  CHECK(mismatches == 0);
}

TEST_CASE("Pushes in flight while the scheduler restarts end exactly once, as the server says") {
  auto cluster = StartCluster("scheduler-restart-in-flight", {"s1", "w1", "w2"},
                              R"(, "tau_max": 100000)");
  launch::Cluster& c = *cluster;

  // A slow server: updates queue at its daemon, so that at the restart
  // some are applied, some handed over, some still on their way.
  SumModel summed;
  summed.delay = std::chrono::milliseconds(40);
  testing::InProcessServer server = summed.Serve(c, "s1");
  REQUIRE(server.status().ok());

  struct Sent {
    std::vector<float> update;
    std::future<PushResult> result;
  };
  std::vector<Sent> sent;
  std::vector<std::unique_ptr<Worker>> workers;
  for (const char* host : {"w1", "w2"}) {
    ClientOptions options;
    options.daemon_socket = c.Socket(host);
    options.name = host;
    auto worker = Worker::Connect(options);
    REQUIRE(worker.ok());
    workers.push_back(std::move(*worker));
  }
  auto push = [&](int p) {
    Sent s;
    s.update.resize(kDim);
    for (size_t i = 0; i < kDim; ++i) s.update[i] = static_cast<float>(1 + (p * 3 + i) % 7);
    s.result = workers[p % 2]->Push("ps0", s.update.data(), s.update.size() * sizeof(float), 0, 1.0);
    sent.push_back(std::move(s));
  };
  for (int p = 0; p < 40; ++p) push(p);
  // Some applied, most still queued or moving.
  REQUIRE(launch::WaitUntil([&] {
    std::lock_guard<std::mutex> lock(summed.mu);
    return summed.version >= 5;
  }, 60));
  // A burst the old scheduler has not planned yet, or only just.
  for (int p = 40; p < 50; ++p) push(p);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  // Which pushes had ended before the kill: the others were in flight.
  std::vector<bool> ended_before(sent.size());
  for (size_t p = 0; p < sent.size(); ++p) {
    ended_before[p] =
        sent[p].result.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  const auto killed_at = std::chrono::steady_clock::now();
  REQUIRE(c.RestartScheduler().ok());
  // After the restart the job goes on.
  REQUIRE(RegisteredAgain(c, {"server ps0 on s1", "worker w1 on w1", "worker w2 on w2"}));
  const double back_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  for (int p = 50; p < 60; ++p) push(p);
  const PushResult first_after = sent[50].result.get();
  const double first_applied_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();

  // Every push ends, once (a future never ready is a hang).
  std::vector<double> expected(kDim, 0.0);
  int applied = 0, failed = 0, after_applied = 0, in_flight = 0, in_flight_applied = 0;
  for (size_t p = 0; p < sent.size(); ++p) {
    if (p != 50) {  // its result was taken above
      REQUIRE(sent[p].result.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
    }
    const PushResult r = p == 50 ? first_after : sent[p].result.get();
    INFO("push " << p << ": " << PushOutcomeName(r.outcome) << ": " << r.reason);
    const bool was_in_flight = p < ended_before.size() && !ended_before[p];
    in_flight += was_in_flight;
    if (r.outcome == PushOutcome::kApplied) {
      ++applied;
      if (p >= 50) ++after_applied;
      in_flight_applied += was_in_flight;
      for (size_t i = 0; i < kDim; ++i) expected[i] += sent[p].update[i];
    } else {
      ++failed;
      // Failed, not dropped (tau_max is far away): the new scheduler's
      // in-doubt rule, or the old one's before it died.
      CHECK(r.outcome == PushOutcome::kFailed);
      CHECK_FALSE(r.reason.empty());
      std::printf("push %zu %s: %s\n", p, PushOutcomeName(r.outcome), r.reason.c_str());
    }
  }
  CHECK(after_applied == 10);  // the pushes after the restart all apply
  // in_doubt.h: a push in flight at the restart ends applied when the
  // server's daemon logged it applied, and the slow server's application
  // is handed an update from its queue at its daemon as soon as it
  // acknowledges the last, so it held one when the stream broke (and
  // applied it). Were every push in flight reported failed, the server
  // would hold one that the workers were told failed.
  INFO(in_flight << " pushes in flight at the kill, " << in_flight_applied << " of them applied");
  CHECK(in_flight >= 1);
  CHECK(in_flight_applied >= 1);
  // No late application can come: when the stream broke the server's
  // daemon cancelled what it had not handed over, and the server applies
  // in order, so what it held was applied before the pushes after the
  // restart, which have all ended applied. The version counts each apply.
  CHECK(launch::WaitUntil([&] {
    std::lock_guard<std::mutex> lock(summed.mu);
    return summed.version >= applied;
  }, 10));
  std::lock_guard<std::mutex> lock(summed.mu);
  INFO(applied << " applied, " << failed << " failed; the server applied " << summed.version);
  CHECK(summed.version == applied);
  int mismatches = 0;
  for (size_t i = 0; i < kDim; ++i) mismatches += summed.model[i] != expected[i];
  CHECK(mismatches == 0);
  // The restarted scheduler decided pushes in doubt, and no outcome it or
  // its predecessor gave was contradicted by a server.
  const std::string log = c.scheduler().Log();
  CHECK(log.find("push(es) in doubt") != std::string::npos);
  CHECK(log.find("but host") == std::string::npos);
  std::printf("in flight across the restart: %d applied, %d failed of %zu pushes; the hosts "
              "were back %.2f s after the kill, the first new push applied at %.2f s (%s)\n",
              applied, failed, sent.size(), back_s, first_applied_s,
              PushOutcomeName(first_after.outcome));
}

// The last `chars` characters of a process's log, for a failure to print.
std::string Tail(const std::string& text, size_t chars = 6000) {
  return text.substr(text.size() > chars ? text.size() - chars : 0);
}

// What a replica holds after a scheduler restart amid 40 pushes of norm 1
// to a slow server ps0 on s1 (updates queue at its daemon), with its
// replica on r1 and the job's divergence bound in `job_fields`.
struct ReplicaRun {
  int applied = 0;      // pushes reported applied
  size_t pushes = 0;
  int64_t replica_version = 0;
  bool exact = false;   // the replica's model is exactly the applied pushes' sum
  std::string scheduler_log;
};

ReplicaRun RunReplicaAcrossRestart(const std::string& name, const std::string& job_fields) {
  auto cluster = StartCluster(name, {"s1", "r1", "w1"}, job_fields, {"--planner=mlfabric"});
  launch::Cluster& c = *cluster;
  SumModel summed;
  summed.delay = std::chrono::milliseconds(40);
  testing::InProcessServer server = summed.Serve(c, "s1");
  REQUIRE(server.status().ok());
  SumModel standby;
  RegistrationParams params;
  params.client.daemon_socket = c.Socket("r1");
  auto replica = RegisterAsReplica("ps0", params);
  INFO(replica.status().ToString());
  REQUIRE(replica.ok());
  (*replica)->RegisterUpdateCallback([&](const Server::Update& u) -> absl::StatusOr<int64_t> {
    std::lock_guard<std::mutex> lock(standby.mu);
    const float* values = reinterpret_cast<const float*>(u.data);
    for (size_t i = 0; i < kDim; ++i) standby.model[i] += values[i];
    standby.version += u.count;
    return standby.version;
  });
  std::thread replica_thread([&] { (void)(*replica)->Serve(); });

  ClientOptions options;
  options.daemon_socket = c.Socket("w1");
  options.name = "w1";
  auto worker = Worker::Connect(options);
  REQUIRE(worker.ok());
  std::vector<std::vector<float>> updates;
  std::vector<std::future<PushResult>> results;
  auto push = [&](int p) {
    std::vector<float> update(kDim);
    for (size_t i = 0; i < kDim; ++i) update[i] = static_cast<float>(1 + (p * 5 + i) % 7);
    results.push_back(
        (*worker)->Push("ps0", update.data(), update.size() * sizeof(float), 0, 1.0));
    updates.push_back(std::move(update));
  };
  for (int p = 0; p < 30; ++p) push(p);
  REQUIRE(launch::WaitUntil([&] {
    std::lock_guard<std::mutex> lock(summed.mu);
    return summed.version >= 5;
  }, 60));
  REQUIRE(c.RestartScheduler().ok());
  REQUIRE(RegisteredAgain(c, {"ROLE_REPLICA ps0 on r1", "worker w1 on w1"}));
  for (int p = 30; p < 40; ++p) push(p);

  ReplicaRun run;
  std::vector<double> expected(kDim, 0.0);
  for (size_t p = 0; p < results.size(); ++p) {
    REQUIRE(results[p].wait_for(std::chrono::seconds(120)) == std::future_status::ready);
    const PushResult r = results[p].get();
    if (r.outcome != PushOutcome::kApplied) continue;
    ++run.applied;
    for (size_t i = 0; i < kDim; ++i) expected[i] += updates[p][i];
  }
  run.pushes = results.size();
  run.exact = launch::WaitUntil([&] {
    std::lock_guard<std::mutex> lock(standby.mu);
    return standby.model == expected;
  }, 30);
  (*replica)->Stop();
  replica_thread.join();
  run.scheduler_log = c.scheduler().Log();
  if (!run.exact) {
    // It failed once in a busy CI run (3 of 40 copies missing), and not in
    // runs by hand: keep what the processes said about the replica.
    std::string replica_lines;
    for (absl::string_view line : absl::StrSplit(run.scheduler_log, '\n')) {
      if (absl::StrContains(line, "replica") || absl::StrContains(line, "restart")) {
        absl::StrAppend(&replica_lines, line, "\n");
      }
    }
    std::printf("--- scheduler log, lines on the replica or the restart (tail)\n%s\n"
                "--- r1 log (tail)\n%s\n--- w1 log (tail)\n%s\n",
                Tail(replica_lines, 12000).c_str(), Tail(c.daemon("r1").Log()).c_str(),
                Tail(c.daemon("w1").Log()).c_str());
  }
  std::lock_guard<std::mutex> lock(standby.mu);
  run.replica_version = standby.version;
  return run;
}

TEST_CASE("A replica keeps the copies it held across a restart: it has what the server applied") {
  // A tight divergence bound (each push's norm is 1): copies go with their
  // pushes instead of being punted to a later batch (§5.3), and are held at
  // the replica's daemon for the outcome.
  const ReplicaRun run = RunReplicaAcrossRestart(
      "scheduler-restart-replica", R"(, "tau_max": 100000, "divergence_max": 2)");
  // The replica ends with exactly the pushes reported applied: the copies
  // it kept are delivered for the pushes the server applied, dropped for
  // the others.
  const int redelivered = testing::CountOccurrences(run.scheduler_log, "across the restart: delivered");
  INFO(run.applied << " of " << run.pushes << " pushes applied; the replica applied "
                   << run.replica_version << "; " << redelivered << " kept copies delivered again");
  CHECK(run.exact);
  CHECK(run.replica_version == run.applied);
  // The kept copies' path was taken (the slow server had a queue).
  CHECK(redelivered > 0);
  std::printf("replica across the restart: %d of %zu pushes applied, %d kept copies delivered "
              "again, the replica applied %lld\n",
              run.applied, run.pushes, redelivered, static_cast<long long>(run.replica_version));
}

TEST_CASE("Punted copies held at their source cross a restart: the replica has what was applied") {
  // A loose divergence bound: copies of applied pushes are punted to later
  // batches and their bytes stay at w1's daemon, which names them when it
  // registers with the restarted scheduler (in_doubt.h, held sources).
  const ReplicaRun run = RunReplicaAcrossRestart(
      "scheduler-restart-punted", R"(, "tau_max": 100000, "divergence_max": 1000000)");
  const int recopied = testing::CountOccurrences(run.scheduler_log, "across the restart: planned again");
  INFO(run.applied << " of " << run.pushes << " pushes applied; the replica applied "
                   << run.replica_version << "; " << recopied << " held copies planned again");
  CHECK(run.exact);
  CHECK(run.replica_version == run.applied);
  CHECK(recopied > 0);
  std::printf("punted copies across the restart: %d of %zu pushes applied, %d held at the source "
              "planned again, the replica applied %lld\n",
              run.applied, run.pushes, recopied, static_cast<long long>(run.replica_version));
}

TEST_CASE("A synchronous AllReduce job goes on across a scheduler restart") {
  auto cluster = StartCluster("scheduler-restart-allreduce", {"h0", "h1"}, "");
  launch::Cluster& c = *cluster;

  constexpr int kRanks = 2;
  constexpr size_t kCount = 4096;
  std::atomic<int> rounds_done[kRanks] = {};
  std::atomic<bool> restarted{false};
  // The ranks make the same calls, as a collective's must: a rank that
  // stopped one round before the other left it alone in a round nobody
  // else would push (its get waited for it). The first rank with 15 good
  // rounds after the restart sets the last round both run: the next one
  // (the other rank is at most one round behind or ahead).
  std::atomic<int> stop_at{500};
  struct Tally {
    int ok = 0, failed = 0, ok_after = 0, wrong = 0;
    std::string first_error, construct_error;
  } tally[kRanks];
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      AllReduceOptions options;
      options.backend = "mlfabric";
      options.rank = r;
      options.size = kRanks;
      options.client.daemon_socket = c.Socket(r == 0 ? "h0" : "h1");
      // Short enough that rounds that keep failing end the case (and print
      // the logs below) well before the test's own timeout.
      options.timeout_s = 20;
      auto reducer = MakeAllReducer(options);
      if (!reducer.ok()) {
        tally[r].construct_error = std::string(reducer.status().message());
        return;
      }
      // Rounds until 15 have succeeded after the restart (or too many fail).
      for (int i = 0; i < stop_at.load() && tally[r].failed < 10; ++i) {
        if (tally[r].ok_after >= 15) {
          int last = stop_at.load();
          while (i + 1 < last && !stop_at.compare_exchange_weak(last, i + 1)) {
          }
          if (i >= stop_at.load()) break;
        }
        std::vector<int32_t> data(kCount);
        for (size_t k = 0; k < kCount; ++k) data[k] = static_cast<int32_t>(i * 10 + r + k % 3);
        const bool after = restarted.load();
        const absl::Status status = (*reducer)->AllReduce(data.data(), kCount, DataType::kInt32);
        if (!status.ok()) {
          ++tally[r].failed;
          if (tally[r].first_error.empty()) tally[r].first_error = std::string(status.message());
          continue;  // the next call is the next round; both ranks move on
        }
        ++tally[r].ok;
        if (after) ++tally[r].ok_after;
        for (size_t k = 0; k < kCount; ++k) {
          if (data[k] != static_cast<int32_t>(2 * (i * 10 + k % 3) + 1)) {
            ++tally[r].wrong;
            break;
          }
        }
        rounds_done[r].store(i + 1);
      }
    });
  }
  REQUIRE(launch::WaitUntil([&] { return rounds_done[0] >= 5 && rounds_done[1] >= 5; }, 60));
  REQUIRE(c.RestartScheduler().ok());
  restarted.store(true);
  for (std::thread& t : ranks) t.join();
  // It failed once in a CI run, too rarely to reproduce: keep what the
  // processes said.
  if (tally[0].ok_after < 15 || tally[1].ok_after < 15 || tally[0].failed > 2 ||
      tally[1].failed > 2) {
    std::printf("--- scheduler log (tail)\n%s\n--- h0 log (tail)\n%s\n--- h1 log (tail)\n%s\n",
                Tail(c.scheduler().Log()).c_str(), Tail(c.daemon("h0").Log()).c_str(),
                Tail(c.daemon("h1").Log()).c_str());
  }
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r << ": " << tally[r].ok << " rounds ok (" << tally[r].ok_after
                 << " after the restart), " << tally[r].failed << " failed (first: "
                 << tally[r].first_error << ")" << tally[r].construct_error);
    CHECK(tally[r].construct_error.empty());
    CHECK(tally[r].ok_after >= 15);
    CHECK(tally[r].wrong == 0);
    // The round in progress at the restart may fail, and say why; not more.
    CHECK(tally[r].failed <= 2);
    std::printf("AllReduce rank %d: %d rounds ok (%d after the restart), %d failed%s%s\n", r,
                tally[r].ok, tally[r].ok_after, tally[r].failed,
                tally[r].first_error.empty() ? "" : ": ", tally[r].first_error.c_str());
  }
}

}  // namespace
}  // namespace mlfabric
