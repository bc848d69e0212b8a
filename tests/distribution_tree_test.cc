// A batch of gets answered through a distribution tree (mlfabric.md §10.3,
// docs/architecture.md §3): the server's daemon asks the scheduler for the batch's tree
// and sends the model to some requesters; the others are routed to one of
// those (a distributor), which forwards each packet as it arrives. Real
// scheduler and daemons, on loopback.
//
// 1. Six workers on six hosts ask at once; on equal links the cut-through
//    planner (the default) sends one copy from the server's host and the
//    requesters forward it along a chain (--get_tree_max_fanout=1): every worker has the same bytes
//    and version, and the server daemon's counters say so.
// 2. A distributor is killed while it forwards (its forwarding is slowed by
//    --unscheduled_bps so that it is still at it): exactly the gets routed
//    through it fail, each naming it; the others succeed; the next batch
//    works.
#include <catch2/catch.hpp>

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/registration.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "tests/test_util.h"

namespace mlfabric {
namespace {

constexpr int kWorkers = 6;

std::string WorkerHost(int w) { return "w" + std::to_string(w); }

// The server application: answers each snapshot once all `expected` gets of
// the wave have joined its batch at s1's daemon (so the batch is decided by
// the order of events, not by timing).
class HeldServer {
 public:
  HeldServer(launch::Cluster& cluster, size_t model_bytes)
      : cluster_(cluster), model_bytes_(model_bytes) {}

  void ExpectJoined(int total) { joined_ = total; }
  int snapshots() const { return snapshots_.load(); }

  absl::StatusOr<Server::Snapshot> operator()() {
    const int call = ++snapshots_;
    launch::WaitUntil(
        [&] {
          return testing::CountOccurrences(cluster_.daemon("s1").Log(), "joins model batch") >=
                 joined_.load();
        },
        60);
    Server::Snapshot snapshot;
    snapshot.version = 100 * call;
    snapshot.bytes.resize(model_bytes_);
    for (size_t i = 0; i < model_bytes_; ++i) {
      snapshot.bytes[i] = static_cast<uint8_t>((i * 131 + static_cast<size_t>(call) * 7) & 0xff);
    }
    return snapshot;
  }

 private:
  launch::Cluster& cluster_;
  const size_t model_bytes_;
  std::atomic<int> joined_{0};
  std::atomic<int> snapshots_{0};
};

struct Wave {
  std::map<int, absl::StatusOr<Model>> results;  // by worker
};

Wave GetAll(const std::map<int, Worker*>& workers) {
  std::map<int, std::future<absl::StatusOr<Model>>> gets;
  for (const auto& [w, worker] : workers) {
    Worker* p = worker;
    gets.emplace(w, std::async(std::launch::async, [p] { return p->Get("ps0"); }));
  }
  Wave wave;
  for (auto& [w, get] : gets) wave.results.emplace(w, get.get());
  return wave;
}

// "get ... goes through distributor wX" lines of s1's log since `from`:
// the distributor of each routed get, in log order.
// "... for wY goes through distributor wX" lines of s1's log since `from`:
// requester -> its distributor.
std::map<std::string, std::string> Routes(const std::string& log, size_t from) {
  std::map<std::string, std::string> via;
  static const std::regex kRoute("for (w[0-9]+) goes through distributor (w[0-9]+)");
  const std::string tail = log.substr(std::min(from, log.size()));
  for (auto it = std::sregex_iterator(tail.begin(), tail.end(), kRoute);
       it != std::sregex_iterator(); ++it) {
    via[(*it)[1].str()] = (*it)[2].str();
  }
  return via;
}

// The hosts below `host` in the tree `via` (requester -> distributor).
std::set<std::string> Below(const std::map<std::string, std::string>& via,
                            const std::string& host) {
  std::set<std::string> below;
  for (const auto& [requester, distributor] : via) {
    for (std::string up = distributor;;) {
      if (up == host) {
        below.insert(requester);
        break;
      }
      auto next = via.find(up);
      if (next == via.end()) break;
      up = next->second;
    }
  }
  return below;
}

std::unique_ptr<launch::Cluster> StartCluster(const std::string& dir,
                                               const std::vector<std::string>& scheduler_flags,
                                               const std::vector<std::string>& worker_flags) {
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789"}]})";
  std::vector<std::string> hosts = {"s1"};
  // No late joins: a wave's gets must not join the previous wave's batch
  // while its last copy is still leaving.
  std::map<std::string, std::vector<std::string>> host_flags = {
      {"s1", {"--log_level=debug", "--get_late_joins=0"}}};
  for (int w = 1; w <= kWorkers; ++w) {
    hosts.push_back(WorkerHost(w));
    host_flags[WorkerHost(w)] = worker_flags;
    host_flags[WorkerHost(w)].push_back("--log_level=debug");
  }
  std::vector<std::string> flags = {"--config=" + config, "--log_level=debug"};
  flags.insert(flags.end(), scheduler_flags.begin(), scheduler_flags.end());
  auto started = launch::Cluster::StartLoopback(hosts, flags, {}, host_flags);
  INFO(started.status().ToString());
  REQUIRE(started.ok());
  return std::move(*started);
}

std::vector<std::unique_ptr<Worker>> ConnectWorkers(launch::Cluster& c) {
  std::vector<std::unique_ptr<Worker>> workers;
  for (int w = 1; w <= kWorkers; ++w) {
    ClientOptions options;
    options.daemon_socket = c.Socket(WorkerHost(w));
    options.name = WorkerHost(w);
    auto worker = Worker::Connect(options);
    INFO(worker.status().ToString());
    REQUIRE(worker.ok());
    workers.push_back(std::move(*worker));
  }
  return workers;
}

// The server application on s1 and one worker per worker host.
struct Apps {
  Apps(launch::Cluster& c, size_t model_bytes)
      : held(c, model_bytes),
        server(c.Socket("s1"), "ps0", testing::NextVersion, [this] { return held(); }),
        workers(ConnectWorkers(c)) {
    REQUIRE(server.status().ok());
    for (int w = 1; w <= kWorkers; ++w) all[w] = workers[static_cast<size_t>(w - 1)].get();
  }
  HeldServer held;
  testing::InProcessServer server;
  std::vector<std::unique_ptr<Worker>> workers;
  std::map<int, Worker*> all;
};

TEST_CASE("A batch of gets through a two-level tree: one server copy, identical models") {
  constexpr size_t kModelBytes = 2 << 20;  // above the daemon's get_tree_min_bytes (1 MiB)
  const std::string dir = launch::MakeTempDir("dist-tree");
  // Fanout 1: a chain. (On loopback a 2 MiB copy takes under 2 ms, so the
  // planner's 1 ms per hop would otherwise make a wider tree faster.)
  auto c = StartCluster(dir, {"--get_tree_max_fanout=1"}, {});
  Apps apps(*c, kModelBytes);
  HeldServer& held = apps.held;
  std::map<int, Worker*> all = apps.all;

  for (int wave = 1; wave <= 2; ++wave) {
    INFO("wave " << wave);
    held.ExpectJoined(wave * kWorkers);
    const size_t log_from = c->daemon("s1").Log().size();
    Wave got = GetAll(all);
    const Model* first = nullptr;
    for (auto& [w, model] : got.results) {
      INFO("worker " << w << ": " << model.status().ToString());
      REQUIRE(model.ok());
      CHECK(model->version == 100 * wave);
      REQUIRE(model->size() == kModelBytes);
      if (first == nullptr) first = &*model;
      CHECK(std::memcmp(model->data(), first->data(), kModelBytes) == 0);
    }
    CHECK(first->data()[1] == static_cast<uint8_t>((131 + wave * 7) & 0xff));
    // Every host but one is fed by another requester (a chain or a tree
    // below the one copy).
    const std::map<std::string, std::string> via = Routes(c->daemon("s1").Log(), log_from);
    CHECK(via.size() == kWorkers - 1);
    int forwarded = 0;
    for (int w = 1; w <= kWorkers; ++w) {
      forwarded += testing::CountOccurrences(c->daemon(WorkerHost(w)).Log(), "forwards batch");
    }
    CHECK(forwarded == wave * (kWorkers - 1));
  }
  apps.server.Stop();
  c->daemon("s1").Stop();  // its counters, printed as it stops
  const std::string log = c->daemon("s1").Log();
  INFO(log.substr(log.size() > 2000 ? log.size() - 2000 : 0));
  CHECK(log.find("gets served 12 from 2 snapshots (2 copies sent from here, 10 through "
                 "distributors") != std::string::npos);
}

TEST_CASE("A distributor killed mid-forward fails only the gets below it; the next batch works") {
  constexpr size_t kModelBytes = 4 << 20;
  const std::string dir = launch::MakeTempDir("dist-kill");
  // Workers forward at 1 MB/s: a distributor is still forwarding seconds
  // after its children connected. The server's daemon is not slowed.
  auto c = StartCluster(dir, {}, {"--unscheduled_bps=8e6"});
  Apps apps(*c, kModelBytes);
  HeldServer& held = apps.held;
  std::map<int, Worker*> all = apps.all;

  held.ExpectJoined(kWorkers);
  auto wave = std::async(std::launch::async, [&] { return GetAll(all); });
  // The tree: which gets s1 routed through which distributor.
  std::map<std::string, std::string> via;
  REQUIRE(launch::WaitUntil(
      [&] {
        const std::string log = c->daemon("s1").Log();
        static const std::regex kPlan(
            "model batch 1 of server 'ps0' \\(job [0-9]+\\): ([0-9]+) hosts, ([0-9]+) copies");
        std::smatch plan;
        if (!std::regex_search(log, plan, kPlan)) return false;
        via = Routes(log, 0);
        return static_cast<int>(via.size()) == std::stoi(plan[1]) - std::stoi(plan[2]);
      },
      60));
  INFO(c->daemon("s1").Log());
  REQUIRE(!via.empty());  // the plan used at least one distributor
  // The distributor with the fewest requesters below it (in a chain, the
  // last but one: gets above it and below it); killed once each of those is
  // being forwarded.
  std::string killed = via.begin()->second;
  for (const auto& [requester, distributor] : via) {
    if (Below(via, distributor).size() < Below(via, killed).size()) killed = distributor;
  }
  const std::set<std::string> below = Below(via, killed);
  REQUIRE(launch::WaitUntil(
      [&] {
        int forwarding = 0;
        for (int w = 1; w <= kWorkers; ++w) {
          if (below.count(WorkerHost(w)) > 0 || WorkerHost(w) == killed) {
            forwarding += testing::CountOccurrences(c->daemon(WorkerHost(w)).Log(), "forwards batch");
          }
        }
        return forwarding >= static_cast<int>(below.size());
      },
      60));
  std::printf("tree: %zu of %d gets through distributors; killing %s with %zu below it\n",
              via.size(), kWorkers, killed.c_str(), below.size());
  c->daemon(killed).Signal(SIGKILL);
  Wave got = wave.get();
  const int killed_worker = std::stoi(killed.substr(1));
  int failed = 0;
  for (auto& [w, model] : got.results) {
    if (w == killed_worker) continue;  // its own get may have finished first
    INFO("worker " << w << ": " << model.status().ToString());
    if (!model.ok()) {
      ++failed;
      // Below it, every failure names the dead distributor (further down,
      // as where the chain broke).
      CHECK(below.count(WorkerHost(w)) == 1);
      CHECK(std::string(model.status().message()).find("distributor " + killed) !=
            std::string::npos);
    } else {
      CHECK(model->version == 100);
      CHECK(model->size() == kModelBytes);
    }
  }
  CHECK(failed == static_cast<int>(below.size()));
  std::printf("%d gets failed naming %s, %zu others succeeded\n", failed, killed.c_str(),
              got.results.size() - 1 - static_cast<size_t>(failed));

  // The next batch, without the dead host: every get succeeds.
  std::map<int, Worker*> rest = all;
  rest.erase(killed_worker);
  held.ExpectJoined(kWorkers + kWorkers - 1);
  Wave next = GetAll(rest);
  for (auto& [w, model] : next.results) {
    INFO("worker " << w << ": " << model.status().ToString());
    REQUIRE(model.ok());
    CHECK(model->version == 200);
    CHECK(model->size() == kModelBytes);
    CHECK(model->data()[1] == static_cast<uint8_t>((131 + 2 * 7) & 0xff));
  }
  apps.server.Stop();
}

}  // namespace
}  // namespace mlfabric
