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
#include <string>

#include "common/config.h"
#include "launch/cluster.h"
#include "launch/process.h"

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

}  // namespace

int main(int argc, char** argv) {
  using namespace mlfabric;
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) {
    std::cerr << "mlfabric-demo: " << cl.status().message() << "\n";
    return 2;
  }
  if (cl->help) {
    std::cout << kHelp;
    return 0;
  }
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  double seconds = 8;
  int64_t workers = 3, dim = 256;
  std::string planner = "mlfabric";
  int64_t slow_worker = 0;
  double slow_ms = 150;
  double straggler_factor = 3;
  reader.Double("seconds", &seconds, 1, 3600);
  reader.Int("slow_worker", &slow_worker, 0, 64);
  reader.Double("slow_ms", &slow_ms, 0, 60000);
  reader.Double("straggler_factor", &straggler_factor, 1, 1000);
  reader.Int("workers", &workers, 1, 64);
  reader.Int("dim", &dim, 1, 1 << 20);
  reader.Enum("planner", &planner, {"fifo", "mlfabric"});
  if (auto status = reader.Finish(); !status.ok()) {
    std::cerr << "mlfabric-demo: " << status.message() << "\n" << kHelp;
    return 2;
  }
  if (slow_worker > workers) {
    std::cerr << "mlfabric-demo: --slow_worker=" << slow_worker << " but there are only "
              << workers << " workers (1.." << workers << ", or 0 for none)\n";
    return 2;
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);

  std::vector<std::string> hosts = {"s1"};
  for (int w = 1; w <= workers; ++w) hosts.push_back("w" + std::to_string(w));
  std::printf("MLfabric demo: scheduler (planner %s) + %zu daemons + 1 server + %lld workers "
              "on loopback, training logistic regression (%lld features) for %.0f s\n",
              planner.c_str(), hosts.size(), static_cast<long long>(workers),
              static_cast<long long>(dim), seconds);
  std::fflush(stdout);
  auto cluster_or = launch::Cluster::StartLoopback(
      hosts, {"--planner=" + planner, "--admin_port=0", "--admin_port_file={dir}/admin.port",
              "--straggler_factor=" + std::to_string(straggler_factor)});
  if (!cluster_or.ok()) {
    std::cerr << "mlfabric-demo: cannot start the cluster: " << cluster_or.status().message()
              << "\n";
    return 1;
  }
  launch::Cluster& cluster = **cluster_or;
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

  const std::string dim_flag = "--dim=" + std::to_string(dim);
  auto server = cluster.StartApp(
      "server",
      {launch::BinaryPath("tools/demo/logreg_server"), "--socket=" + cluster.Socket("s1"),
       dim_flag, "--duration_s=" + std::to_string(seconds + 1.5)},
      /*inherit_output=*/true);
  if (!server.ok()) {
    std::cerr << "mlfabric-demo: " << server.status().message() << "\n";
    return 1;
  }
  const std::string scheduler_log = cluster.dir() + "/scheduler.log";
  if (!launch::WaitUntil(
          [&] {
            return g_interrupted.load() ||
                   launch::ReadFile(scheduler_log).find("server ps0") != std::string::npos;
          },
          30)) {
    std::cerr << "mlfabric-demo: the server did not register:\n" << (*server)->Log();
    return 1;
  }
  std::vector<launch::Subprocess*> worker_procs;
  for (int w = 1; w <= workers && !g_interrupted.load(); ++w) {
    const std::string host = "w" + std::to_string(w);
    auto worker = cluster.StartApp(
        host,
        {launch::BinaryPath("tools/demo/logreg_worker"), "--socket=" + cluster.Socket(host),
         "--name=" + host, "--shard=" + std::to_string(w), dim_flag,
         "--duration_s=" + std::to_string(seconds),
         "--compute_delay_ms=" + std::to_string(w == slow_worker ? slow_ms : 0.0)},
        /*inherit_output=*/true);
    if (!worker.ok()) {
      std::cerr << "mlfabric-demo: " << worker.status().message() << "\n";
      return 1;
    }
    worker_procs.push_back(*worker);
  }
  int failures = 0;
  for (auto* worker : worker_procs) {
    std::optional<int> code;
    launch::WaitUntil(
        [&] {
          code = worker->WaitFor(0);
          return code.has_value() || g_interrupted.load();
        },
        seconds + 60);
    if (!code.has_value() || *code != 0) ++failures;
  }
  std::optional<int> server_code;
  launch::WaitUntil(
      [&] {
        server_code = (*server)->WaitFor(0);
        return server_code.has_value() || g_interrupted.load();
      },
      30);
  if (!server_code.has_value() || *server_code != 0) ++failures;
  if (g_interrupted.load()) {
    std::printf("mlfabric-demo: interrupted; stopping every process it started\n");
    return 130;
  }
  // What the scheduler said about stragglers (scheduler/service/straggler_tracker.h).
  std::istringstream log(launch::ReadFile(scheduler_log));
  for (std::string line; std::getline(log, line);) {
    if (line.find("straggler: worker") != std::string::npos) {
      std::printf("scheduler: %s\n", line.substr(line.find("straggler: worker")).c_str());
    }
  }
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
