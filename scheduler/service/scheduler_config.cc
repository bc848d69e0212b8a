#include "scheduler/service/scheduler_config.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/secrets.h"
#include "nlohmann/json.hpp"

namespace mlfabric {

absl::Status ValidateDelayBound(const char* field, int64_t bound) {
  if (bound >= 0 && bound <= kMaxDelayBound) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": must be in [0, ", kMaxDelayBound, "], got ", bound));
}

const char* JobModeName(JobMode mode) {
  switch (mode) {
    case JobMode::kSync: return "sync";
    case JobMode::kSsp: return "ssp";
    case JobMode::kAsync: break;
  }
  return "async";
}

const char* MemberLossName(MemberLoss loss) {
  return loss == MemberLoss::kFail ? "fail" : "shrink";
}

absl::StatusOr<SchedulerConfig> LoadSchedulerConfig(const CommandLine& cl) {
  auto reader_or = ConfigReader::FromCommandLine(cl);
  if (!reader_or.ok()) return reader_or.status();
  return LoadSchedulerConfig(std::move(*reader_or));
}

namespace {

// The scheduler's own keys: its gRPC endpoint, batching, planning and the
// ways pushes and gets may be routed.
void ReadSchedulingKeys(ConfigReader* reader, SchedulerConfig* config) {
  reader->String("listen_address", &config->listen_address);
  reader->Int("grpc_port", &config->grpc_port, 0, 65535);
  reader->Double("keepalive_s", &config->keepalive_s, 0.1, 3600);
  reader->String("port_file", &config->port_file);
  reader->Double("batch_interval_ms", &config->batch_interval_ms, 1, 60000);
  reader->Double("plan_lead_ms", &config->plan_lead_ms, -1, 60000);
  reader->Enum("planner", &config->planner, {"fifo", "mlfabric"});
  reader->Int("max_update_bytes", &config->max_update_bytes, 1, int64_t{1} << 40);
  reader->Double("default_link_bps", &config->default_link_bps, 1e3, 1e13);
  reader->Enum("log_level", &config->log_level, {"debug", "info", "warning", "error"});
  reader->Int("planner_threads", &config->planner_threads, 0, 256);
  reader->Double("transfer_slack_s", &config->transfer_slack_s, 0.01, 3600);
  reader->Double("server_wait_s", &config->server_wait_s, 0, 60);
  reader->Double("in_doubt_wait_s", &config->in_doubt_wait_s, 0.1, 3600);
  reader->Double("round_timeout_s", &config->round_timeout_s, 0.1, 86400);
  reader->Bool("round_grants", &config->round_grants);
  reader->Double("round_grant_change", &config->round_grant_change, 0, 10);
  reader->Int("history_batches", &config->history_batches, 1, 100000);
  reader->Double("straggler_factor", &config->straggler_factor, 1.0, 1000);
  reader->Int("straggler_window", &config->straggler_window, 2, 100000);
  reader->Double("ssp_max_wait_s", &config->ssp_max_wait_s, 0.01, 3600);
  reader->Bool("streaming_aggregation", &config->streaming_aggregation);
  reader->Enum("replica_aggregation", &config->replica_aggregation, {"all", "punted", "none"});
  reader->Enum("replica_bound", &config->replica_bound, {"plan", "strict"});
  reader->Bool("get_trees", &config->get_trees);
  reader->Enum("get_tree_planner", &config->get_tree_planner, {"cut_through", "store_forward"});
  reader->Int("get_tree_max_fanout", &config->get_tree_max_fanout, 1, 1024);
  reader->Double("get_tree_min_saving", &config->get_tree_min_saving, 0, 0.99);
  reader->Double("get_deadline_slack", &config->get_deadline_slack, 0, 1e6);
  reader->Bool("get_reservations", &config->get_reservations);
}

// The admin endpoint's keys and the keys that authenticate hosts and jobs.
void ReadAdminAndSecurityKeys(ConfigReader* reader, SchedulerConfig* config) {
  reader->String("admin_address", &config->admin_address);
  reader->Int("admin_port", &config->admin_port, -1, 65535);
  reader->String("admin_port_file", &config->admin_port_file);
  reader->String("admin_token", &config->admin_token);
  reader->Bool("admin_read_auth", &config->admin_read_auth);
  reader->Bool("admin_https", &config->admin_https);
  reader->String("cluster_secret_file", &config->cluster_secret_file);
  reader->String("tls_cert_file", &config->tls_cert_file);
  reader->String("tls_key_file", &config->tls_key_file);
  reader->String("tls_client_ca_file", &config->tls_client_ca_file);
  reader->Bool("data_plane_auth", &config->data_plane_auth);
  reader->Bool("data_plane_encryption", &config->data_plane_encryption);
}

// "jobs" (file only): a list of job objects, each with a non-empty name
// and token; the first bad job stops the list.
void ReadJobs(ConfigReader* reader, SchedulerConfig* config) {
  nlohmann::json jobs;
  if (!reader->Raw("jobs", &jobs)) return;
  config->jobs.clear();
  if (!jobs.is_array()) {
    reader->AddError("jobs", "expected a list of job objects");
    return;
  }
  std::set<std::string> names;
  for (size_t i = 0; i < jobs.size(); ++i) {
    ConfigReader job_reader(jobs[i], absl::StrCat("jobs[", i, "]"));
    JobConfig job;
    job_reader.String("name", &job.name);
    job_reader.String("token", &job.token);
    job_reader.Int("tau_max", &job.tau_max, 0, kMaxDelayBound);
    std::string mode = JobModeName(job.mode);
    job_reader.Enum("mode", &mode, {"async", "sync", "ssp"});
    job.mode = mode == "sync" ? JobMode::kSync : mode == "ssp" ? JobMode::kSsp : JobMode::kAsync;
    job_reader.Int("staleness_k", &job.staleness_k, 0, kMaxDelayBound);
    job_reader.Int("backup_workers", &job.backup_workers, 0, 65535);
    std::string member_loss = MemberLossName(job.member_loss);
    job_reader.Enum("member_loss", &member_loss, {"shrink", "fail"});
    job.member_loss = member_loss == "fail" ? MemberLoss::kFail : MemberLoss::kShrink;
    job.member_loss_explicit = jobs[i].is_object() && jobs[i].contains("member_loss");
    job_reader.String("user", &job.user);
    job_reader.Double("divergence_max", &job.divergence_max, 0, 1e12);
    job_reader.Double("momentum", &job.momentum, 0, 0.999999);
    job_reader.Int("priority_class", &job.priority_class, 0, 7);
    job_reader.StringList("aggregators", &job.aggregators);
    if (auto status = job_reader.Finish(); !status.ok()) {
      reader->AddError("jobs", std::string(status.message()));
      break;
    }
    if (job.token.empty()) {
      reader->AddError("jobs", absl::StrCat("jobs[", i, "].token must not be empty: ",
                                            "each job needs its own secret"));
      break;
    }
    if (job.name.empty()) {
      reader->AddError("jobs", absl::StrCat("jobs[", i, "].name must not be empty"));
      break;
    }
    if (!names.insert(job.name).second) {
      reader->AddError("jobs", absl::StrCat("jobs[", i, "].name '", job.name, "' is a duplicate"));
      break;
    }
    config->jobs.push_back(job);
  }
}

// Reads the cluster secret, then the rules that span keys (TLS files go
// together, a non-loopback address needs host authentication and long job
// tokens, ...).
void CheckSecurity(ConfigReader* reader, SchedulerConfig* config) {
  if (!config->cluster_secret_file.empty()) {
    absl::StatusOr<std::string> secret = ReadSecretFile(config->cluster_secret_file);
    if (secret.ok()) {
      config->cluster_secret = *secret;
    } else {
      reader->AddError("cluster_secret_file", std::string(secret.status().message()));
    }
  }
  if (config->tls_cert_file.empty() != config->tls_key_file.empty()) {
    reader->AddError("tls_cert_file", "tls_cert_file and tls_key_file go together");
  }
  if (config->admin_https && config->tls_cert_file.empty()) {
    reader->AddError("admin_https", "needs tls_cert_file and tls_key_file (the admin endpoint "
                                    "serves the scheduler's certificate)");
  }
  if (!config->tls_client_ca_file.empty() && config->tls_cert_file.empty()) {
    reader->AddError("tls_client_ca_file", "needs tls_cert_file and tls_key_file (mutual TLS)");
  }
  if (!IsLoopbackAddress(config->listen_address)) {
    if (config->cluster_secret_file.empty() && config->tls_client_ca_file.empty()) {
      reader->AddError("listen_address", absl::StrCat(
          config->listen_address, " is not a loopback address: hosts must authenticate, so give "
          "cluster_secret_file or tls_client_ca_file (tools/make-certs makes both)"));
    }
    for (const JobConfig& job : config->jobs) {
      if (job.token.size() < 16) {
        reader->AddError("jobs", absl::StrCat("job '", job.name, "': its token has ",
                                              job.token.size(),
                                              " characters; on a non-loopback listen_address a "
                                              "job token must have at least 16"));
        break;
      }
    }
  }
  if (config->data_plane_encryption && !config->data_plane_auth) {
    reader->AddError("data_plane_encryption",
                     "needs data_plane_auth: the session keys come from its handshake");
  }
  if (config->admin_read_auth && config->admin_token.empty()) {
    reader->AddError("admin_read_auth", "needs admin_token: reads would be refused to everyone");
  }
}

}  // namespace

absl::StatusOr<SchedulerConfig> LoadSchedulerConfig(ConfigReader reader) {
  SchedulerConfig config;
  ReadSchedulingKeys(&reader, &config);
  ReadAdminAndSecurityKeys(&reader, &config);
  ReadJobs(&reader, &config);
  CheckSecurity(&reader, &config);
  if (auto status = reader.Finish(); !status.ok()) return status;
  if (config.jobs.empty()) {
    return absl::InvalidArgumentError(
        "config key 'jobs': no job is configured: give --config with \"jobs\": [{\"name\": ..., "
        "\"token\": ...}] (no job or token ships by default)");
  }
  return config;
}

bool IsLoopbackAddress(const std::string& address) {
  return address == "localhost" || address == "::1" || address == "[::1]" ||
         absl::StartsWith(address, "127.");
}

namespace {

// The sections of SchedulerConfigHelp's text, in order.

// Usage, and the keys of the gRPC endpoint, batching and the planner.
const char* UsageHelp() {
  return R"(mlfabric-scheduler: MLfabric's central scheduler (gRPC control plane).

Usage: mlfabric-scheduler [--config FILE] [--KEY=VALUE ...]

Every key can be set in the JSON file or as a flag; flags win.
  --listen_address     gRPC bind address                 (default 127.0.0.1)
  --grpc_port          gRPC port, 0 picks a free one     (default 50051)
  --keepalive_s        ping idle daemon connections this often and drop
                       one that does not answer this long: a daemon behind
                       a silent partition is marked down (default 2)
  --port_file          write the bound port to this file (default none)
  --batch_interval_ms  batching window in milliseconds   (default 100)
  --plan_lead_ms       plan each batch for this long after its cut, when
                       its commands will be out; -1 = the longest of the
                       last 20 cycles' times from cut to commands queued;
                       0 = for the cut, the paper's      (default 0)
  --planner            mlfabric | fifo (vanilla-PS baseline) (default mlfabric)
  --max_update_bytes   largest push accepted             (default 16 GiB)
  --default_link_bps   NIC capacity when a host gives none (default 1e10)
  --log_level          debug | info | warning | error    (default info)
)";
}

// Planning threads, the service's waits and timeouts, and stragglers.
const char* TimingHelp() {
  return R"(  --planner_threads    threads planning batches of different servers in
                       parallel, 0 = one per core       (default 0)
  --transfer_slack_s   an in-flight transfer not completed this long after
                       its planned end fails ("timed out") (default 10)
  --server_wait_s      a push to a server of its job that has not registered
                       yet waits this long for it (workers often start
                       before their server)          (default 3)
  --in_doubt_wait_s    after a restart, a push that was in flight is failed
                       if its server's host has not registered again within
                       this long (its daemon decides it otherwise)
                                                      (default 30)
  --round_timeout_s    a synchronous round (server registered with
                       round_size > 0, or a sync-mode job) fails this long
                       after a member's planned end if some worker's part
                       never came                      (default 60)
  --round_grants       a synchronous round's member may send its next
                       round's push at once, on its last plan's rate, and
                       the scheduler accounts for it instead of planning
                       it (no round trip per round)  (default true)
  --round_grant_change re-plan instead once a member's links have changed
                       by more than this fraction since the plan the
                       grant came from, or the membership changed
                                                      (default 0.1)
  --history_batches    recent batches kept for the admin endpoint (default 64)
  --straggler_factor   a worker whose median iteration time (between its
                       pushes) exceeds this many times its job's median is
                       flagged as a straggler (admin API, /metrics) (default 1.5)
  --straggler_window   pushes per worker the medians are taken over (default 20)
  --ssp_max_wait_s     an ssp job's worker more than staleness_k pushes ahead
                       of the slowest live worker waits at its get at most
                       this long, then goes ahead (logged)   (default 60)
)";
}

// How pushes are aggregated and how replicas are kept (§5.3).
const char* AggregationHelp() {
  return R"(  --streaming_aggregation  an update batch may also go through streaming
                       chains: each worker adds its update to the partial
                       sum streaming through it on the way to the server,
                       so the server's downlink carries one copy per chain
                       (scheduler/core/README.md); false = the paper's
                       Alg. 3 alone                      (default true)
  --replica_aggregation  all|punted|none: a replica's copies may be summed
                       on their way at the job's aggregators (§5.3), so the
                       replica's downlink carries one transfer per
                       aggregate. all: any copy (an aggregate holding
                       copies of pushes still in flight waits at the
                       replica until they all applied); punted: only
                       copies punted to a later batch; none: every copy
                       direct                          (default all)
  --replica_bound      plan|strict: how the divergence bound Div_max is
                       kept (§5.3). plan: the replica's copies are timed on
                       the declared link rates (the paper's; a link that
                       delivers less lets the server run past Div_max);
                       strict: a push is planned only while the norms of
                       the updates the replica has not applied, its own
                       included, fit within Div_max   (default plan)
)";
}

// How a batch of gets is answered (§10.3).
const char* GetTreeHelp() {
  return R"(  --get_trees          a batch of gets for one server is answered through a
                       distribution tree: the server's host sends the model
                       to some requesters, which forward each packet to the
                       others as it arrives (§10.3); false = every copy from
                       the server's host                (default true)
  --get_tree_planner   cut_through: trees for daemons that forward packet by
                       packet (chains and narrow trees, the fewest server
                       copies that do not slow the batch, slow uplinks as
                       leaves); store_forward: the paper's §10.3 planner
                       (a distributor has the whole model before it sends)
                                                        (default cut_through)
  --get_tree_max_fanout  cut_through: at most this many copies from the
                       server and from each requester   (default 4)
  --get_tree_min_saving  cut_through: a tree is taken only if it ends at
                       least this fraction sooner than the server sending
                       every copy itself                (default 0.2)
  --get_deadline_slack store_forward: > 0 lets a get batch end this many times
                       later than its fastest tree if that spends fewer server
                       copies; 0 = fastest tree         (default 0)
  --get_reservations   reserve each planned distribution's streams on their
                       links until they end, for the pushes planned
                       meanwhile                        (default false)
)";
}

// The admin endpoint, and how hosts, jobs and data are authenticated.
const char* SecurityHelp() {
  return R"(  --admin_address      admin HTTP bind address          (default 127.0.0.1)
  --admin_port         admin HTTP port, 0 = free port, -1 = off (default -1)
  --admin_port_file    write the bound admin port to this file (default none)
  --admin_token        bearer token for admin POSTs; empty refuses them (default none)
  --admin_read_auth    reads (JSON, /metrics, trace) need the bearer token too;
                       the dashboard page and /healthz stay open (default false)
  --admin_https        the admin endpoint serves HTTPS only, with the
                       scheduler's tls_cert_file and tls_key_file (default false)
  --cluster_secret_file  a file (mode 0600) with the cluster's secret: a daemon
                       must present it to register its host, and every later
                       call carries the session the registration returned
                       (default none)
  --tls_cert_file      the scheduler's TLS certificate (PEM); with
  --tls_key_file       its key, gRPC runs over TLS   (default none: plaintext)
  --tls_client_ca_file daemons must present a certificate this CA signed,
                       whose common name is their host's name (mutual TLS;
                       hosts are then authenticated)  (default none)
  --data_plane_auth    data sessions between daemons start with an HMAC
                       handshake and carry per-job proofs (default true)
  --data_plane_encryption  data sessions also encrypt every payload
                       (AES-256-GCM, keys from an X25519 exchange in the
                       handshake); needs data_plane_auth (default false)
  A non-loopback listen_address needs cluster_secret_file or
  tls_client_ca_file, and job tokens of at least 16 characters.
)";
}

// The jobs list, read from the file only.
const char* JobsHelp() {
  return R"(  jobs (file only)     [{"name", "token", "tau_max", "mode" (async|sync|ssp),
                         "staleness_k", "backup_workers" (sync: a round
                         closes with workers - backup_workers pushes),
                         "member_loss" (shrink|fail, what the round in
                         progress does when a worker leaves; default
                         shrink for a sync job's member-sized rounds;
                         servers registered with a round size, such as
                         AllReduce roots, shrink with their ranks only
                         when it is written "shrink", else keep it and
                         fail the round a rank leaves open),
                         "divergence_max", "momentum", "user" (only
                         applications running as this user may register),
                         "priority_class" (0..7, 0 = most urgent),
                         "aggregators" (hosts that may aggregate, §5.2)}]
                       (required: no job or token ships by default)
)";
}

}  // namespace

std::string SchedulerConfigHelp() {
  return absl::StrCat(UsageHelp(), TimingHelp(), AggregationHelp(), GetTreeHelp(),
                      SecurityHelp(), JobsHelp());
}

}  // namespace mlfabric
