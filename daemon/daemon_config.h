// Configuration of mlfabricd (DESIGN.md §8): defaults below < --config JSON
// < flags of the same names. Unknown keys and bad values name the key.
#ifndef MLFABRIC_DAEMON_DAEMON_CONFIG_H_
#define MLFABRIC_DAEMON_DAEMON_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/config.h"

namespace mlfabric {

struct DaemonConfig {
  std::string host;                          // required: this host's name
  std::string scheduler = "127.0.0.1:50051"; // scheduler gRPC address
  std::string listen_address = "127.0.0.1";  // data-plane TCP bind address
  int64_t data_port = 0;                     // 0 = pick a free port
  std::string local_socket;                  // default /tmp/mlfabricd-<host>.sock
  double uplink_bps = 0;                     // NIC capacity; 0 = scheduler default
  double downlink_bps = 0;
  int64_t payload_bytes = 32 * 1024;         // Mercury packet payload, 4 KiB - 1 MiB
  double register_timeout_s = 30;            // how long to wait for the scheduler
  double get_timeout_s = 30;                 // how long a get waits for the server
  double unscheduled_bps = 0;                // budget for get replies; 0 = unlimited
  std::string job_priority = "fifo";         // TensorLights mode: fifo | one | rr
  double job_priority_period_s = 20;         // rr rotation period
  std::string log_level = "info";
};

absl::StatusOr<DaemonConfig> LoadDaemonConfig(const CommandLine& cl);
std::string DaemonConfigHelp();

}  // namespace mlfabric

#endif  // MLFABRIC_DAEMON_DAEMON_CONFIG_H_
