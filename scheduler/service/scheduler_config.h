// Configuration of mlfabric-scheduler (DESIGN.md §8): built-in defaults
// below, overridden by the --config JSON file, overridden by flags of the
// same names. Unknown keys, wrong types and out-of-range values are errors.
#ifndef MLFABRIC_SCHEDULER_SERVICE_SCHEDULER_CONFIG_H_
#define MLFABRIC_SCHEDULER_SERVICE_SCHEDULER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config.h"

namespace mlfabric {

struct JobConfig {
  std::string name;
  std::string token;          // applications must present it to register
  int64_t tau_max = 30;       // delay bound (§5.1.2)
  std::string mode = "async"; // async | sync
};

struct SchedulerConfig {
  std::string listen_address = "127.0.0.1";  // gRPC bind address
  int64_t grpc_port = 50051;                  // 0 = pick a free port
  std::string port_file;                      // write the bound port here
  double batch_interval_ms = 100;             // batching window (§4)
  std::string planner = "fifo";               // fifo | mlfabric
  int64_t max_update_bytes = int64_t{16} << 30;  // larger pushes are refused
  double default_link_bps = 10e9;             // capacity when a host reports none
  std::string log_level = "info";
  std::vector<JobConfig> jobs = {{"demo", "demo-token", 30, "async"}};
};

// Reads the config from a parsed command line; the error names the key.
absl::StatusOr<SchedulerConfig> LoadSchedulerConfig(const CommandLine& cl);

// The --help text, listing every key with its default.
std::string SchedulerConfigHelp();

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_SCHEDULER_CONFIG_H_
