// mlfabricd: the MLfabric per-host daemon (docs/architecture.md §2). Run with --help.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

#include "common/logging.h"
#include "daemon/daemon.h"
#include "daemon/daemon_config.h"

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

}  // namespace

int main(int argc, char** argv) {
  using namespace mlfabric;
  signal(SIGPIPE, SIG_IGN);
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) {
    std::cerr << "mlfabricd: " << cl.status().message() << "\n";
    return 2;
  }
  if (cl->help) {
    std::cout << DaemonConfigHelp();
    return 0;
  }
  if (!cl->positional.empty()) {
    std::cerr << "mlfabricd: unexpected argument '" << cl->positional[0] << "'\n";
    return 2;
  }
  auto config = LoadDaemonConfig(*cl);
  if (!config.ok()) {
    std::cerr << "mlfabricd: " << config.status().message() << "\n";
    return 2;
  }
  SetLogProcessName("mlfabricd " + config->host);
  LogLevel level = LogLevel::kInfo;
  ParseLogLevel(config->log_level, &level);
  SetMinLogLevel(level);

  Daemon daemon(*config);
  if (auto status = daemon.Start(); !status.ok()) {
    std::cerr << "mlfabricd: " << status.message() << "\n";
    return 1;
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  std::thread waiter([&] {
    while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    daemon.Stop();
  });
  absl::Status status = daemon.Wait();
  g_stop.store(true);
  waiter.join();
  const auto stats = daemon.GetStats();
  MLF_LOG(INFO) << "stopped: pushes " << stats.pushes << ", gets served " << stats.gets_served
                << " from " << stats.model_snapshots << " snapshots (" << stats.model_copies_sent
                << " copies sent from here, " << stats.gets_routed << " through distributors; "
                << stats.copies_forwarded << " copies forwarded), sent " << stats.bytes_sent
                << " B, received " << stats.bytes_received << " B, delivered "
                << stats.deliveries << ", malformed sessions " << stats.malformed_sessions
                << "; without a socket: " << stats.local_transfers << " transfers within this host ("
                << stats.local_transfer_bytes << " B), " << stats.local_round_gets
                << " round sums read here (" << stats.local_round_get_bytes << " B); get buffers "
                << "lent " << stats.get_buffers_lent << ", given back " << stats.get_buffers_returned
                << "; push buffers mapped " << stats.push_buffers_mapped << ", reused "
                << stats.push_buffers_reused << "; pushes sent on a round grant "
                << stats.granted_pushes;
  if (!status.ok()) {
    std::cerr << "mlfabricd: " << status.message() << "\n";
    _exit(1);
  }
  // Per-connection threads end with the process.
  _exit(0);
}
