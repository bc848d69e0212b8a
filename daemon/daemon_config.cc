#include "daemon/daemon_config.h"

#include "absl/strings/str_cat.h"
#include "daemon/transport/packet.h"

namespace mlfabric {

absl::StatusOr<DaemonConfig> LoadDaemonConfig(const CommandLine& cl) {
  auto reader_or = ConfigReader::FromCommandLine(cl);
  if (!reader_or.ok()) return reader_or.status();
  ConfigReader& reader = *reader_or;
  DaemonConfig config;
  reader.String("host", &config.host);
  reader.String("scheduler", &config.scheduler);
  reader.String("listen_address", &config.listen_address);
  reader.Int("data_port", &config.data_port, 0, 65535);
  reader.String("local_socket", &config.local_socket);
  reader.Double("uplink_bps", &config.uplink_bps, 0, 1e13);
  reader.Double("downlink_bps", &config.downlink_bps, 0, 1e13);
  reader.Int("payload_bytes", &config.payload_bytes, transport::kMinPayloadBytes,
             transport::kMaxPayloadBytes);
  reader.Double("register_timeout_s", &config.register_timeout_s, 0.1, 3600);
  reader.Double("get_timeout_s", &config.get_timeout_s, 0.1, 3600);
  reader.Double("unscheduled_bps", &config.unscheduled_bps, 0, 1e13);
  reader.Enum("job_priority", &config.job_priority, {"fifo", "one", "rr"});
  reader.Double("job_priority_period_s", &config.job_priority_period_s, 0.01, 86400);
  reader.Enum("log_level", &config.log_level, {"debug", "info", "warning", "error"});
  if (config.host.empty()) {
    reader.AddError("host", "is required: name this host (e.g. --host=w1)");
  }
  if (auto status = reader.Finish(); !status.ok()) return status;
  if (config.local_socket.empty()) {
    config.local_socket = absl::StrCat("/tmp/mlfabricd-", config.host, ".sock");
  }
  return config;
}

std::string DaemonConfigHelp() {
  return R"(mlfabricd: the MLfabric per-host daemon.

Usage: mlfabricd --host=NAME [--config FILE] [--KEY=VALUE ...]

  --host                this host's name, unique in the cluster (required)
  --scheduler           scheduler gRPC address        (default 127.0.0.1:50051)
  --listen_address      data-plane bind address       (default 127.0.0.1)
  --data_port           data-plane TCP port, 0 = free (default 0)
  --local_socket        Unix socket for applications  (default /tmp/mlfabricd-<host>.sock)
  --uplink_bps          NIC uplink capacity, 0 = scheduler default   (default 0)
  --downlink_bps        NIC downlink capacity, 0 = scheduler default (default 0)
  --payload_bytes       Mercury packet payload, 4096..1048576 (default 32768)
  --register_timeout_s  how long to wait for the scheduler (default 30)
  --get_timeout_s       how long a get waits for the server (default 30)
  --unscheduled_bps     rate budget for unscheduled traffic (get replies);
                        0 = unlimited (default 0)
  --job_priority        job priority across co-located jobs: fifo | one | rr
                        (TensorLights; default fifo)
  --job_priority_period_s  rr rotation period in seconds (default 20)
  --log_level           debug | info | warning | error (default info)
)";
}

}  // namespace mlfabric
