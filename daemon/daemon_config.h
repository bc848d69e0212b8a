// Configuration of mlfabricd (docs/architecture.md §8): defaults below < --config JSON
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
  // Empty: the local socket is mode 0600 (only the daemon's user may
  // connect). A group name: mode 0660 and owned by that group.
  std::string local_socket_group;
  double uplink_bps = 0;                     // NIC capacity; 0 = scheduler default
  double downlink_bps = 0;
  int64_t payload_bytes = 32 * 1024;         // Mercury packet payload, 4 KiB - 1 MiB
  double register_timeout_s = 30;            // how long to wait for the scheduler
  double get_timeout_s = 30;                 // how long a get waits for the server
  // A failed get of a server with a replica waits this long for a failover
  // (scheduler/service/failover.h) and gets from the new server; 0 = not.
  double failover_wait_s = 6;
  // gRPC keepalive to the scheduler: a ping after keepalive_s without
  // traffic, the connection dropped if not answered within keepalive_s;
  // the schedule stream then ends and this daemon's pending pushes fail.
  // Gets from other daemons fail after about 3 × keepalive_s without an
  // answer from the other host (transport::SetPeerTimeout).
  double keepalive_s = 2;
  // A batch of gets waits this long for the previous batch's replies to
  // leave before it takes its snapshot anyway (daemon/engine/get_batcher.h).
  double get_batch_wait_s = 2;
  // A batch of gets for a model at least this large is answered through a
  // distribution tree the scheduler plans (mlfabric.md §10.3); smaller
  // models go to every requester from here (a tree's extra hop costs more
  // than it spares).
  int64_t get_tree_min_bytes = 1 << 20;
  // A get that comes while the server's previous batch of copies is still
  // leaving (and no newer batch is open) joins that batch as a leaf below
  // one of its requesters, which forwards its copy: same model and
  // version, one server copy spared, no wait for a snapshot. At most this
  // many per requester; 0 = such a get waits for the next batch.
  int64_t get_late_joins = 2;
  // ... and only below a requester where, in the scheduler's view, its copy
  // would come at no less than this share of the rate of the server's own
  // copies in that batch (a slow uplink is not made to forward: N3).
  double get_late_join_min_share = 0.5;
  // Shards of server groups on this host: the snapshots of their last N
  // versions are kept (one taken after each update), so that a group get
  // can read every shard at one version; 0 = none (a get then retries
  // until the shards agree).
  int64_t group_snapshot_history = 16;
  // How long the scheduler's answer to where a server lives is used for
  // this host's gets (a failed get asks again); 0 = asked for every get.
  double resolve_ttl_s = 1;
  // A synchronous round's sum (Mercury PS, the mlfabric AllReduce) reaches
  // its workers through a tree over the order their gets arrive: each
  // requester forwards it to at most this many later ones
  // (daemon/engine/round_routes.h); 0 = every copy from the root's host.
  // Sums smaller than get_tree_min_bytes always come from the root.
  int64_t round_tree_fanout = 2;
  double round_wait_s = 300;                 // how long a get waits for a synchronous round's sum
  // Synchronous rounds kept at a round server's daemon, the newest
  // included, for the gets of workers that are behind (a late backup
  // worker goes on with each round's sum); older ones are forgotten.
  int64_t rounds_kept = 4;
  double clock_sync_period_s = 10;           // how often the clock offset is refreshed
  double unscheduled_bps = 0;                // budget for get replies; 0 = unlimited
  // How long a paced transfer may send at full speed to catch up with its
  // rate: its token bucket holds rate x this (at least two packets). See
  // daemon/engine/send_scheduler.h; 0 = two packets whatever the rate.
  double pacing_quantum_us = 500;
  // Consecutive packets for one peer leave in one gather write of at most
  // this many bytes (daemon/engine/send_scheduler.h); <= payload_bytes:
  // one packet per write (the default; daemon/README.md says why).
  int64_t coalesce_bytes = 0;
  // Threads that read every incoming data session (DataReceiver). One
  // runs the event loop and the handlers without handing them over; two
  // measured 13-17 context switches per MiB received against 0.6-4.5.
  int64_t io_threads = 1;
  double send_timeout_s = 30;                // a data write that makes no progress this long fails
  std::string job_priority = "fifo";         // TensorLights mode: fifo | one | rr
  double job_priority_period_s = 20;         // rr rotation period
  // TensorLights on the host NIC (daemon/nicprio/nic_classes.h): off
  // unless an interface is given. The jobs, "NAME:PORT[,PORT...];...",
  // are ranked as the queue ranks them (job_priority one or rr).
  std::string nic_priority_interface;
  std::string nic_priority_jobs;
  double nic_priority_link_bps = 0;          // class ceiling; 0 = uplink_bps, else 10 Gbit/s
  std::string log_level = "info";
  // Bandwidth monitor (monitor/README.md). Off unless an interface or a
  // trace is given; capacities are uplink_bps/downlink_bps (0 = 10 Gbit/s).
  std::string monitor_interface;             // NIC to sample, e.g. "eth0"
  std::string monitor_tc_class;              // htb class on the NIC whose ceil is the uplink
  std::string monitor_trace;                 // replay, e.g. "n2,seed=3,period_s=5,scale=0.01"
  double monitor_period_s = 0.1;             // sampling period
  double monitor_ewma_tau_s = 0.5;           // estimator time constant
  double report_lag_s = 0.2;                 // reporting lag (paper §7: 0.2-2 s)
  double report_threshold = 0.1;             // relative change that triggers a report
  double report_max_interval_s = 2.0;        // report at least this often
  // Authentication to the scheduler (docs/architecture.md §3a): the cluster secret
  // (from a file, mode 0600) and/or TLS. With scheduler_ca_file the
  // control plane runs over TLS, the scheduler's certificate checked
  // against that CA for the name scheduler_tls_name (default: the host
  // part of `scheduler`); tls_cert_file and tls_key_file are this host's
  // client certificate (mutual TLS; its common name is the host's name).
  std::string cluster_secret_file;
  std::string scheduler_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string scheduler_tls_name;
  // What the files hold (filled by LoadDaemonConfig, not keys).
  std::string cluster_secret;
  std::string scheduler_ca_pem;
  std::string tls_cert_pem;
  std::string tls_key_pem;
};

absl::StatusOr<DaemonConfig> LoadDaemonConfig(const CommandLine& cl);
std::string DaemonConfigHelp();

}  // namespace mlfabric

#endif  // MLFABRIC_DAEMON_DAEMON_CONFIG_H_
