// What the data-plane tests and benchmarks read back from a running system:
// the receiving daemon's arrival trace, the server application's delivery
// order, the scheduler's planned transfers (admin endpoint) and a process's
// CPU time. Plain parsing; the processes are started by the caller
// (launch/process.h).
//
//   auto arrivals = ParseArrivals(cluster.daemon("s1").Log());  // needs --log_level=debug
//   auto planned = FetchPlannedTransfers(admin_port, "ps0");     // commit order
//
// Times are CLOCK_MONOTONIC seconds (steady_clock): the daemons' and the
// scheduler's stamps are comparable on one machine.
// Thread safety: free functions without shared state.
#ifndef MLFABRIC_TESTING_APPS_DATAPLANE_TRACE_H_
#define MLFABRIC_TESTING_APPS_DATAPLANE_TRACE_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mlfabric::bench {

// One completed incoming transfer, from the daemon's debug line
// "received transfer <id> bytes <n> priority <p> first_packet_s <t0> complete_s <t1>".
struct Arrival {
  uint64_t transfer_id = 0;
  int64_t bytes = 0;
  int priority = 0;  // of the transfer's last packet
  double first_packet_s = 0;
  double complete_s = 0;
};

// In log order (= completion order).
std::vector<Arrival> ParseArrivals(const std::string& daemon_log);
std::optional<Arrival> FindArrival(const std::vector<Arrival>& arrivals, uint64_t transfer_id);

// One update handed to dataplane_server, in the order it was handed over.
struct Delivered {
  uint64_t sequence = 0;
  uint64_t transfer_id = 0;
  int64_t bytes = 0;
  std::string worker;
  std::string verdict;  // "ok" or why not
};

std::vector<Delivered> ParseDeliveries(const std::string& server_log);

// A transfer as the scheduler planned it (GET /api/v1/transfers).
struct PlannedTransfer {
  uint64_t transfer_id = 0;
  uint64_t batch_id = 0;
  std::string server;
  std::string src;
  int64_t bytes = 0;
  double start_s = 0;  // scheduler clock
  double end_s = 0;
};

// Body of GET http://127.0.0.1:<port><target> (HTTP/1.1, Connection: close).
absl::StatusOr<std::string> HttpGet(int port, const std::string& target);

// The planned transfers to `server` from the admin endpoint's recent
// batches, oldest batch first and in commit order within a batch: the
// order the server's daemon must deliver them in.
absl::StatusOr<std::vector<PlannedTransfer>> FetchPlannedTransfers(int admin_port,
                                                                   const std::string& server);

// User + system CPU seconds a live process has used (from /proc/<pid>/stat).
absl::StatusOr<double> ProcessCpuSeconds(pid_t pid);

// Context switches (voluntary + involuntary) of every thread of a live
// process so far, summed over /proc/<pid>/task/*/status (the process's
// own status counts only its main thread). Threads that ended are not
// counted: read it where the process's threads are long-lived.
absl::StatusOr<int64_t> ProcessContextSwitches(pid_t pid);

}  // namespace mlfabric::bench

#endif  // MLFABRIC_TESTING_APPS_DATAPLANE_TRACE_H_
