// mlfabric-demo: the whole system on this one machine, as separate
// processes on loopback: mlfabric-scheduler, one mlfabricd per emulated host
// (s1 for the server, w1..wN for workers), a parameter server and N workers
// training logistic regression by asynchronous push/get. The server prints
// progress once a second; the demo ends with a summary, stops every process
// it started, and exits 0 when every push ended applied and the loss fell.
//
//   bazel run //tools/demo:mlfabric-demo -- --seconds=8 --workers=3
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "nlohmann/json.hpp"

namespace {

std::atomic<bool> g_interrupted{false};
void OnSignal(int) { g_interrupted.store(true); }

constexpr char kHelp[] = R"(mlfabric-demo: MLfabric end to end on this machine.

  --seconds   how long the workers train          (default 8)
  --workers   worker hosts, at least 1            (default 3)
  --planner   mlfabric | fifo                     (default mlfabric)
  --dim       logistic-regression features        (default 256)
  --slow_worker  worker k (1..workers) computes --slow_ms longer per
              iteration: the scheduler flags it as a straggler, on the
              dashboard and in the summary       (default 0: none)
  --slow_ms   the slow worker's extra compute per iteration (default 150)
  --straggler_factor  the scheduler flags a worker slower than this many
              times its job's median iteration (default 3 here; the
              scheduler's own default is 1.5). The demo's iterations take
              a few milliseconds, so on a busy machine a lower factor
              flags workers that were merely descheduled for a moment.
)";

struct DemoOptions {
  double seconds = 8;
  int64_t workers = 3, dim = 256;
  std::string planner = "mlfabric";
  int64_t slow_worker = 0;
  double slow_ms = 150;
  double straggler_factor = 3;
};

// Reads the flags. Returns 0, or the exit code (-1: --help printed).
int ParseOptions(int argc, char** argv, DemoOptions* o) {
  auto cl = mlfabric::ParseCommandLine(argc, argv);
  if (!cl.ok()) {
    std::cerr << "mlfabric-demo: " << cl.status().message() << "\n";
    return 2;
  }
  if (cl->help) {
    std::cout << kHelp;
    return -1;
  }
  mlfabric::ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  reader.Double("seconds", &o->seconds, 1, 3600);
  reader.Int("slow_worker", &o->slow_worker, 0, 64);
  reader.Double("slow_ms", &o->slow_ms, 0, 60000);
  reader.Double("straggler_factor", &o->straggler_factor, 1, 1000);
  reader.Int("workers", &o->workers, 1, 64);
  reader.Int("dim", &o->dim, 1, 1 << 20);
  reader.Enum("planner", &o->planner, {"fifo", "mlfabric"});
  if (auto status = reader.Finish(); !status.ok()) {
    std::cerr << "mlfabric-demo: " << status.message() << "\n" << kHelp;
    return 2;
  }
  if (o->slow_worker > o->workers) {
    std::cerr << "mlfabric-demo: --slow_worker=" << o->slow_worker << " but there are only "
              << o->workers << " workers (1.." << o->workers << ", or 0 for none)\n";
    return 2;
  }
  return 0;
}

// Says where the scheduler, the daemons' logs and the dashboard are.
void PrintStarted(mlfabric::launch::Cluster& cluster, const std::vector<std::string>& hosts) {
  using namespace mlfabric;
  std::printf("started mlfabric-scheduler at %s and mlfabricd on", cluster.scheduler_address().c_str());
  for (const auto& host : hosts) std::printf(" %s", host.c_str());
  std::printf(" (logs in %s)\n", cluster.dir().c_str());
  const std::string admin_port_file = cluster.dir() + "/admin.port";
  if (launch::WaitUntil([&] { return !launch::ReadFile(admin_port_file).empty(); }, 10)) {
    const std::string port = launch::ReadFile(admin_port_file);
    std::printf("admin dashboard: http://127.0.0.1:%d/ (JSON under /api/v1/, Prometheus at "
                "/metrics; open it while the demo runs)\n",
                std::atoi(port.c_str()));
  }
  std::fflush(stdout);
}

// The server, on s1, once it has registered; null if it did not (said why).
mlfabric::launch::Subprocess* StartServer(mlfabric::launch::Cluster& cluster,
                                          const DemoOptions& o) {
  using namespace mlfabric;
  auto server = cluster.StartApp(
      "server",
      {launch::BinaryPath("tools/demo/logreg_server"), "--socket=" + cluster.Socket("s1"),
       "--dim=" + std::to_string(o.dim), "--duration_s=" + std::to_string(o.seconds + 1.5)},
      /*inherit_output=*/true);
  if (!server.ok()) {
    std::cerr << "mlfabric-demo: " << server.status().message() << "\n";
    return nullptr;
  }
  const std::string scheduler_log = cluster.dir() + "/scheduler.log";
  if (!launch::WaitUntil(
          [&] {
            return g_interrupted.load() ||
                   launch::ReadFile(scheduler_log).find("server ps0") != std::string::npos;
          },
          30)) {
    std::cerr << "mlfabric-demo: the server did not register:\n" << (*server)->Log();
    return nullptr;
  }
  return *server;
}

// The workers w1..wN; empty if one could not start (said why).
std::vector<mlfabric::launch::Subprocess*> StartWorkers(mlfabric::launch::Cluster& cluster,
                                                        const DemoOptions& o) {
  using namespace mlfabric;
  std::vector<launch::Subprocess*> workers;
  for (int w = 1; w <= o.workers && !g_interrupted.load(); ++w) {
    const std::string host = "w" + std::to_string(w);
    auto worker = cluster.StartApp(
        host,
        {launch::BinaryPath("tools/demo/logreg_worker"), "--socket=" + cluster.Socket(host),
         "--name=" + host, "--shard=" + std::to_string(w), "--dim=" + std::to_string(o.dim),
         "--duration_s=" + std::to_string(o.seconds),
         "--compute_delay_ms=" + std::to_string(w == o.slow_worker ? o.slow_ms : 0.0)},
        /*inherit_output=*/true);
    if (!worker.ok()) {
      std::cerr << "mlfabric-demo: " << worker.status().message() << "\n";
      return {};
    }
    workers.push_back(*worker);
  }
  return workers;
}

// Waits for `process` to end (bounded, or until interrupted): true if it
// exited 0.
bool EndedCleanly(mlfabric::launch::Subprocess* process, double timeout_s) {
  std::optional<int> code;
  mlfabric::launch::WaitUntil(
      [&] {
        code = process->WaitFor(0);
        return code.has_value() || g_interrupted.load();
      },
      timeout_s);
  return code.has_value() && *code == 0;
}

// What the scheduler said about stragglers (scheduler/service/straggler_tracker.h).
void PrintStragglers(const std::string& scheduler_log) {
  std::istringstream log(mlfabric::launch::ReadFile(scheduler_log));
  for (std::string line; std::getline(log, line);) {
    if (line.find("straggler: worker") != std::string::npos) {
      std::printf("scheduler: %s\n", line.substr(line.find("straggler: worker")).c_str());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mlfabric;
  DemoOptions o;
  if (int code = ParseOptions(argc, argv, &o); code != 0) return code < 0 ? 0 : code;
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);

  std::vector<std::string> hosts = {"s1"};
  for (int w = 1; w <= o.workers; ++w) hosts.push_back("w" + std::to_string(w));
  std::printf("MLfabric demo: scheduler (planner %s) + %zu daemons + 1 server + %lld workers "
              "on loopback, training logistic regression (%lld features) for %.0f s\n",
              o.planner.c_str(), hosts.size(), static_cast<long long>(o.workers),
              static_cast<long long>(o.dim), o.seconds);
  std::fflush(stdout);
  auto cluster_or = launch::Cluster::StartLoopback(
      hosts, {"--planner=" + o.planner, "--admin_port=0", "--admin_port_file={dir}/admin.port",
              "--straggler_factor=" + std::to_string(o.straggler_factor)});
  if (!cluster_or.ok()) {
    std::cerr << "mlfabric-demo: cannot start the cluster: " << cluster_or.status().message()
              << "\n";
    return 1;
  }
  launch::Cluster& cluster = **cluster_or;
  PrintStarted(cluster, hosts);
  launch::Subprocess* server = StartServer(cluster, o);
  if (server == nullptr) return 1;
  const std::vector<launch::Subprocess*> workers = StartWorkers(cluster, o);
  if (workers.empty() && !g_interrupted.load()) return 1;
  int failures = 0;
  for (auto* worker : workers) failures += !EndedCleanly(worker, o.seconds + 60);
  failures += !EndedCleanly(server, 30);
  if (g_interrupted.load()) {
    std::printf("mlfabric-demo: interrupted; stopping every process it started\n");
    return 130;
  }
  const std::string scheduler_log = cluster.dir() + "/scheduler.log";
  PrintStragglers(scheduler_log);
  if (failures > 0) {
    std::printf("mlfabric-demo: FAILED (%d process(es) did not finish cleanly). Scheduler log:\n%s",
                failures, launch::ReadFile(scheduler_log).c_str());
    return 1;
  }
  std::printf("mlfabric-demo: OK: every push ended applied or dropped with a reason, none "
              "failed, and the test loss fell; "
              "stopping the scheduler and %zu daemons\n",
              hosts.size());
  return 0;
}
