#include "daemon/daemon_config.h"

#include <fstream>
#include <iterator>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/secrets.h"
#include "daemon/nicprio/tc_runner.h"
#include "daemon/transport/packet.h"

namespace mlfabric {

namespace {

// The daemon's own keys: where it listens and connects, link rates, timeouts, gets, rounds,
// pacing and sending.
void ReadDaemonKeys(ConfigReader& reader, DaemonConfig* config) {
  reader.String("host", &config->host);
  reader.String("scheduler", &config->scheduler);
  reader.String("listen_address", &config->listen_address);
  reader.Int("data_port", &config->data_port, 0, 65535);
  reader.String("local_socket", &config->local_socket);
  reader.String("local_socket_group", &config->local_socket_group);
  reader.Double("uplink_bps", &config->uplink_bps, 0, 1e13);
  reader.Double("downlink_bps", &config->downlink_bps, 0, 1e13);
  reader.Int("payload_bytes", &config->payload_bytes, transport::kMinPayloadBytes,
             transport::kMaxPayloadBytes);
  reader.Double("register_timeout_s", &config->register_timeout_s, 0.1, 3600);
  reader.Double("get_timeout_s", &config->get_timeout_s, 0.1, 3600);
  reader.Double("failover_wait_s", &config->failover_wait_s, 0, 600);
  reader.Double("keepalive_s", &config->keepalive_s, 0.1, 3600);
  reader.Double("get_batch_wait_s", &config->get_batch_wait_s, 0, 3600);
  reader.Int("get_tree_min_bytes", &config->get_tree_min_bytes, 0, int64_t{1} << 40);
  reader.Int("round_tree_fanout", &config->round_tree_fanout, 0, 1024);
  reader.Int("get_late_joins", &config->get_late_joins, 0, 1024);
  reader.Double("get_late_join_min_share", &config->get_late_join_min_share, 0, 1e6);
  reader.Int("group_snapshot_history", &config->group_snapshot_history, 0, 1024);
  reader.Double("resolve_ttl_s", &config->resolve_ttl_s, 0, 3600);
  reader.Double("round_wait_s", &config->round_wait_s, 0.1, 86400);
  reader.Int("rounds_kept", &config->rounds_kept, 2, 1024);
  reader.Double("unscheduled_bps", &config->unscheduled_bps, 0, 1e13);
  reader.Double("pacing_quantum_us", &config->pacing_quantum_us, 0, 1e5);
  reader.Int("coalesce_bytes", &config->coalesce_bytes, 0, int64_t{16} << 20);
  reader.Int("io_threads", &config->io_threads, 1, 64);
  reader.Double("send_timeout_s", &config->send_timeout_s, 0.1, 3600);
  reader.Double("clock_sync_period_s", &config->clock_sync_period_s, 0.1, 3600);
  reader.Enum("job_priority", &config->job_priority, {"fifo", "one", "rr"});
  reader.Double("job_priority_period_s", &config->job_priority_period_s, 0.01, 86400);
  reader.String("nic_priority_interface", &config->nic_priority_interface);
  reader.String("nic_priority_jobs", &config->nic_priority_jobs);
  reader.Double("nic_priority_link_bps", &config->nic_priority_link_bps, 0, 1e13);
  reader.Enum("log_level", &config->log_level, {"debug", "info", "warning", "error"});
}

// The bandwidth monitor's keys (monitor/README.md).
void ReadMonitorKeys(ConfigReader& reader, DaemonConfig* config) {
  reader.String("monitor_interface", &config->monitor_interface);
  reader.String("monitor_trace", &config->monitor_trace);
  reader.String("monitor_tc_class", &config->monitor_tc_class);
  reader.Double("monitor_period_s", &config->monitor_period_s, 0.001, 60);
  reader.Double("monitor_ewma_tau_s", &config->monitor_ewma_tau_s, 0.001, 600);
  reader.Double("report_lag_s", &config->report_lag_s, 0, 60);
  reader.Double("report_threshold", &config->report_threshold, 0, 10);
  reader.Double("report_max_interval_s", &config->report_max_interval_s, 0.01, 3600);
}

// Authentication to the scheduler: where the cluster secret and the TLS files are.
void ReadAuthKeys(ConfigReader& reader, DaemonConfig* config) {
  reader.String("cluster_secret_file", &config->cluster_secret_file);
  reader.String("scheduler_ca_file", &config->scheduler_ca_file);
  reader.String("tls_cert_file", &config->tls_cert_file);
  reader.String("tls_key_file", &config->tls_key_file);
  reader.String("scheduler_tls_name", &config->scheduler_tls_name);
}

// What the secret and PEM files hold; a file that cannot be read is its key's error.
void ReadAuthFiles(ConfigReader& reader, DaemonConfig* config) {
  if (!config->cluster_secret_file.empty()) {
    absl::StatusOr<std::string> secret = ReadSecretFile(config->cluster_secret_file);
    if (secret.ok()) {
      config->cluster_secret = *secret;
    } else {
      reader.AddError("cluster_secret_file", std::string(secret.status().message()));
    }
  }
  for (auto [key, path, out] : {std::tuple{"scheduler_ca_file", &config->scheduler_ca_file,
                                           &config->scheduler_ca_pem},
                                std::tuple{"tls_cert_file", &config->tls_cert_file,
                                           &config->tls_cert_pem},
                                std::tuple{"tls_key_file", &config->tls_key_file,
                                           &config->tls_key_pem}}) {
    if (path->empty()) continue;
    std::ifstream in(*path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in || text.find("-----BEGIN") == std::string::npos) {
      reader.AddError(key, absl::StrCat(*path, " is not a readable PEM file"));
    }
    *out = std::move(text);
  }
}

// NIC priorities need an interface, jobs with ports and a ranking mode
// together.
void CheckNicPriorityKeys(const DaemonConfig& config, ConfigReader& reader) {
  absl::StatusOr<std::vector<nicprio::NicJob>> jobs =
      nicprio::ParseNicJobs(config.nic_priority_jobs);
  if (!jobs.ok()) {
    reader.AddError("nic_priority_jobs", std::string(jobs.status().message()));
    return;
  }
  if (config.nic_priority_interface.empty()) {
    if (!jobs->empty()) {
      reader.AddError("nic_priority_jobs", "needs nic_priority_interface: the NIC to rank them on");
    }
    return;
  }
  if (jobs->empty()) {
    reader.AddError("nic_priority_interface",
                    "needs nic_priority_jobs: the jobs and their ports, e.g. "
                    "\"jobA:2222;jobB:3333,3334\"");
  }
  if (config.job_priority == "fifo") {
    reader.AddError("nic_priority_interface",
                    "needs a job ranking: give job_priority one or rr (it is fifo)");
  }
  if (config.nic_priority_link_bps > 0 && config.nic_priority_link_bps < 1e3) {
    reader.AddError("nic_priority_link_bps", "give 0 (uplink_bps) or at least 1000");
  }
}

// What no single key's range checks: keys that go together, the required host, link rates the
// scheduler would refuse.
void CheckKeys(const DaemonConfig& config, ConfigReader& reader) {
  if (config.tls_cert_file.empty() != config.tls_key_file.empty()) {
    reader.AddError("tls_cert_file", "tls_cert_file and tls_key_file go together");
  }
  if (!config.tls_cert_file.empty() && config.scheduler_ca_file.empty()) {
    reader.AddError("tls_cert_file", "a client certificate needs TLS: give scheduler_ca_file too");
  }
  if (config.host.empty()) {
    reader.AddError("host", "is required: name this host (e.g. --host=w1)");
  }
  CheckNicPriorityKeys(config, reader);
  // The scheduler refuses link rates below 1e3 bit/s at registration; say
  // so here, at start-up, naming the flag (0 still means its default).
  for (const auto& [key, bps] : {std::pair<const char*, double>{"uplink_bps", config.uplink_bps},
                                 {"downlink_bps", config.downlink_bps}}) {
    if (bps > 0 && bps < 1e3) {
      reader.AddError(key, absl::StrCat("is ", bps, " bit/s: give 0 (the scheduler's default) or ",
                                        "at least 1000"));
    }
  }
}

}  // namespace

absl::StatusOr<DaemonConfig> LoadDaemonConfig(const CommandLine& cl) {
  auto reader_or = ConfigReader::FromCommandLine(cl);
  if (!reader_or.ok()) return reader_or.status();
  ConfigReader& reader = *reader_or;
  DaemonConfig config;
  ReadDaemonKeys(reader, &config);
  ReadMonitorKeys(reader, &config);
  ReadAuthKeys(reader, &config);
  ReadAuthFiles(reader, &config);
  CheckKeys(config, reader);
  if (auto status = reader.Finish(); !status.ok()) return status;
  if (config.local_socket.empty()) {
    config.local_socket = absl::StrCat("/tmp/mlfabricd-", config.host, ".sock");
  }
  return config;
}

namespace {

// DaemonConfigHelp's sections, in its order; each ends with its last line's newline.

// The usage, then where the daemon listens and connects, link rates, packets.
const char* UsageHelp() {
  return R"(mlfabricd: the MLfabric per-host daemon.

Usage: mlfabricd --host=NAME [--config FILE] [--KEY=VALUE ...]

  --host                this host's name, unique in the cluster (required)
  --scheduler           scheduler gRPC address        (default 127.0.0.1:50051)
  --listen_address      data-plane bind address       (default 127.0.0.1)
  --data_port           data-plane TCP port, 0 = free (default 0)
  --local_socket        Unix socket for applications  (default /tmp/mlfabricd-<host>.sock)
  --local_socket_group  group whose members may connect to it too (mode 0660);
                        default none: mode 0600, the daemon's user only
  --uplink_bps          NIC uplink capacity in bit/s, 0 or >= 1000;
                        0 = scheduler default               (default 0)
  --downlink_bps        NIC downlink capacity in bit/s, 0 or >= 1000;
                        0 = scheduler default               (default 0)
  --payload_bytes       Mercury packet payload, 4096..1048576 (default 32768)
)";
}

const char* TimeoutsHelp() {
  return R"(  --register_timeout_s  how long to wait for the scheduler (default 30)
  --get_timeout_s       how long a get waits for the server (default 30)
  --failover_wait_s     a get of a server with a hot-standby replica that
                        fails waits this long for the replica to take over,
                        then gets from it; 0 = fail at once (default 6)
  --keepalive_s         ping the scheduler after this long without traffic;
                        no answer within as long: the connection is dead, and
                        the pushes in flight wait for the scheduler's word
                        once this daemon has registered again; a get from
                        a daemon whose host stops answering fails after
                        about 3 times as long (default 2)
)";
}

// Model gets: batches, distribution trees, late joins, snapshots, resolving.
const char* GetsHelp() {
  return R"(  --get_batch_wait_s    gets that arrive while a server's previous batch of
                        replies is leaving share one snapshot, taken when it
                        has left or after this long (default 2)
  --get_tree_min_bytes  a batch of gets of a model at least this large from
                        two or more hosts goes through a distribution tree
                        planned by the scheduler: some requesters forward
                        each packet to others as it arrives (default 1048576)
  --get_late_joins      a get that comes while the server's previous batch
                        of copies is still leaving joins that batch as a leaf
                        below one of its requesters (same model and version,
                        one server copy spared); at most this many below
                        each; 0 = it waits for the next batch (default 2)
  --get_late_join_min_share
                        ... only below a requester where, by the scheduler's
                        rates, its copy comes at least this share of the
                        speed of the server's own copies; elsewhere it waits
                        for the next batch (default 0.5)
  --group_snapshot_history
                        shards of server groups here: keep the snapshots of
                        their last N versions (one taken after each update)
                        so that a group get reads every shard at one
                        version; 0 = none, a get retries until the shards
                        agree (default 16)
  --resolve_ttl_s       how long the scheduler's answer to where a server
                        lives serves this host's gets; a failed get asks
                        again, 0 = ask for every get (default 1)
)";
}

const char* RoundsHelp() {
  return R"(  --round_tree_fanout   a synchronous round's sum of at least
                        get_tree_min_bytes reaches its workers through a tree
                        over the order their gets arrive: the root's host
                        sends this many copies, each receiver forwards to at
                        most this many later ones; 0 = every copy from the
                        root's host (default 2)
  --round_wait_s        how long a get waits for a synchronous round's sum
                        (Mercury PS servers; default 300)
  --rounds_kept         synchronous rounds kept at a round server's daemon for
                        the gets of workers behind (late backup workers);
                        2..1024 (default 4)
)";
}

// Also clock sync, job priority and logging, which come between.
const char* SendingHelp() {
  return R"(  --clock_sync_period_s how often to refresh the scheduler clock offset (default 10)
  --unscheduled_bps     rate budget for unscheduled traffic (get replies);
                        0 = unlimited (default 0)
  --pacing_quantum_us   a paced transfer may catch up with its planned rate
                        for this long at full speed (its token bucket holds
                        rate x quantum, at least two packets); 0..100000,
                        0 = two packets (default 500)
  --coalesce_bytes      consecutive packets for one peer or get reply leave
                        in one gather write of at most this many bytes; what
                        the kernel does not take at once goes back to the
                        queue, so urgent packets still go first; 0..16777216,
                        at most --payload_bytes = one packet per write
                        (default 0)
  --io_threads          threads that read all incoming data sessions, 1..64;
                        a session takes one only while it has bytes to read
                        (default 1)
  --send_timeout_s      a write to another daemon that makes no progress for
                        this long fails that peer's transfers or that get
                        reply, so one stuck peer cannot hold the sender (default 30)
  --job_priority        job priority across co-located jobs: fifo | one | rr
                        (TensorLights; default fifo)
  --job_priority_period_s  rr rotation period in seconds (default 20)
  --nic_priority_interface  also rank the jobs on this NIC (TensorLights: tc
                        htb classes by TCP port, for a job's traffic that
                        does not pass through the daemon, such as its MPI
                        sums); needs CAP_NET_ADMIN and --job_priority one or
                        rr; removed when the daemon stops (default none)
  --nic_priority_jobs   the jobs and their TCP ports on this host, in
                        ranking order after the scheduler's priority class:
                        "jobA:2222;jobB:3333,3334" (default none)
  --nic_priority_link_bps  the classes' ceiling, the NIC's line rate;
                        0 = --uplink_bps, or 10 Gbit/s if that is 0 (default 0)
  --log_level           debug | info | warning | error (default info)
)";
}

const char* MonitorHelp() {
  return R"(  Bandwidth monitor (off unless an interface or a trace is given):
  --monitor_interface   NIC whose /sys counters to sample (default none)
  --monitor_tc_class    htb class (e.g. 1:10) shaping the NIC: its ceil is the uplink (default none)
  --monitor_trace       replay N1-N3: "n2,seed=3,period_s=5,scale=0.01" (default none)
  --monitor_period_s    sampling period               (default 0.1)
  --monitor_ewma_tau_s  estimator time constant       (default 0.5)
  --report_lag_s        reporting lag, 0.2-2 s in the paper (default 0.2)
  --report_threshold    relative change that triggers a report (default 0.1)
  --report_max_interval_s  report at least this often (default 2)
)";
}

const char* AuthHelp() {
  return R"(  Authentication to the scheduler (see the README's Security section):
  --cluster_secret_file a file (mode 0600) with the scheduler's cluster secret
                        (default none)
  --scheduler_ca_file   talk to the scheduler over TLS, trusting this CA (PEM)
                        (default none: plaintext)
  --tls_cert_file       this host's client certificate and key (PEM) for
  --tls_key_file        mutual TLS; its common name is --host (default none)
  --scheduler_tls_name  the name the scheduler's certificate must carry
                        (default: the host part of --scheduler)
)";
}

}  // namespace

std::string DaemonConfigHelp() {
  return absl::StrCat(UsageHelp(), TimeoutsHelp(), GetsHelp(), RoundsHelp(), SendingHelp(),
                      MonitorHelp(), AuthHelp());
}

}  // namespace mlfabric
