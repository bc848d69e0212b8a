// Configuration of mlfabric-scheduler (docs/architecture.md §8): built-in defaults
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

// How a job's workers synchronise (§6). kSync: Mercury-PS rounds of one push
// per worker, summed at the server; kSsp: asynchronous pushes whose delay
// bound is staleness_k; kAsync: asynchronous pushes bounded by tau_max.
enum class JobMode { kAsync, kSync, kSsp };
// "async" | "sync" | "ssp", as written in configs and shown by the admin API.
const char* JobModeName(JobMode mode);

// What a sync job's round in progress does when one of its members leaves
// (job_membership.h; round_tracker.h LoseMember): kShrink goes on with the
// members left, kFail fails it once with the reason. Either way the next
// round is sized by the members left.
enum class MemberLoss { kShrink, kFail };
// "shrink" | "fail", as written in configs and shown by the admin API.
const char* MemberLossName(MemberLoss loss);

// The largest delay bound (tau_max, an SSP job's K, a worker's own bound) a
// job may have, in model versions.
inline constexpr int64_t kMaxDelayBound = 1000000;
// InvalidArgument naming `field` unless 0 <= bound <= kMaxDelayBound. Every
// place a delay bound enters the scheduler (config file, admin API, worker
// registration) checks it here.
absl::Status ValidateDelayBound(const char* field, int64_t bound);

// One training job. Parameters other than name/token/mode can be changed at
// run time through the admin endpoint (POST /api/v1/jobs/<name>).
struct JobConfig {
  std::string name;
  std::string token;            // applications must present it to register
  int64_t tau_max = 30;         // delay bound (§5.1.2)
  JobMode mode = JobMode::kAsync;  // "async" | "sync" | "ssp" in JSON
  // ssp only: iterations (pushes) a worker may run ahead of the job's
  // slowest worker before its get waits; tau_max still bounds versions.
  int64_t staleness_k = 3;
  // sync only: a round closes with its first (workers - backup_workers)
  // pushes; later ones are dropped as late_for_round (Chen et al., 2016).
  int64_t backup_workers = 0;
  // A member leaving during a round of a sync job's members (or, set
  // explicitly, of an AllReduce root's ranks: member_loss_explicit).
  // "shrink" (default): the round completes with the members that pushed
  // if they make the new size, else waits for the members left; "fail":
  // the round fails once, naming the worker and why it left.
  MemberLoss member_loss = MemberLoss::kShrink;
  // Whether the config wrote member_loss. Servers registered with a round
  // size (AllReduce roots) shrink with their ranks only when it says
  // "shrink" in so many words: an AllReduce's caller may divide by the
  // world size, so a sum over fewer ranks must be asked for.
  bool member_loss_explicit = false;
  double divergence_max = 0;    // Div_max for a hot-standby replica (§5.3); 0 = none
  double momentum = 0;          // optimiser momentum gamma used by the divergence bound
  int64_t priority_class = 0;   // 0 = most urgent; its batches are planned first
  // When set, only applications running as this user (checked by their
  // daemon with SO_PEERCRED) may register with the job.
  std::string user;
  // Hosts that may aggregate this job's updates in the network (§5.2); the
  // planner decides per batch whether and which. Empty = no aggregation.
  std::vector<std::string> aggregators;
};

struct SchedulerConfig {
  std::string listen_address = "127.0.0.1";  // gRPC bind address
  int64_t grpc_port = 50051;                  // 0 = pick a free port
  // gRPC keepalive: every connection is pinged after keepalive_s without
  // traffic and closed when a ping is not answered within keepalive_s, so a
  // daemon behind a silent partition is marked down within about 2 x
  // keepalive_s (its schedule stream ends) instead of never.
  double keepalive_s = 2;
  std::string port_file;                      // write the bound port here
  double batch_interval_ms = 100;             // batching window (§4)
  // A batch is planned for its cut plus this lead (plan_lead.h); < 0: the
  // longest of the last 20 cycles' cut-to-commands times; 0: for the cut.
  double plan_lead_ms = 0;
  std::string planner = "mlfabric";           // mlfabric | fifo (the vanilla-PS baseline)
  int64_t max_update_bytes = int64_t{16} << 30;  // larger pushes are refused
  double default_link_bps = 10e9;             // capacity when a host reports none
  std::string log_level = "info";
  int64_t planner_threads = 0;                // parallel batch planning; 0 = one per core
  double transfer_slack_s = 10;               // in-flight transfer fails this long after its planned end
  double server_wait_s = 3;
  // A restarted scheduler fails a push in doubt (in_doubt.h) whose server's
  // host has not registered with it within this long.
  double in_doubt_wait_s = 30;
  // A member of a synchronous round (Mercury PS server) fails, with its
  // whole round, when the round is not complete this long after the
  // member's planned end: some worker never pushed its part.
  double round_timeout_s = 60;                   // a push waits this long for its server to register
  // Rounds on the previous round's plan (round_grants.h): a synchronous
  // round's member gets a grant to send its next round's push at once,
  // while its links' capacities stay within `round_grant_change` (a
  // fraction) of what the last plan saw and the job's membership stands.
  bool round_grants = true;
  double round_grant_change = 0.1;
  int64_t history_batches = 64;               // recent batches kept for the admin endpoint
  // Straggler detection (scheduler/service/straggler_tracker.h): a worker
  // whose median iteration time over its last `straggler_window` pushes
  // exceeds straggler_factor x its job's median is flagged.
  double straggler_factor = 1.5;
  int64_t straggler_window = 20;
  // An ssp job's worker waits at most this long at a get for the slowest
  // worker to come within K iterations; then the get goes ahead (logged).
  double ssp_max_wait_s = 60;
  // Model distribution trees for batched gets (mlfabric.md §10.3): a
  // server's daemon asks how to send one batch's snapshot (PlanDistribution).
  // get_trees = false answers every requester from the server's host.
  // get_deadline_slack > 0: the batch may end this many times
  // later than its fastest plan if that spends fewer server copies (fewest
  // copies within that deadline), sparing the server's uplink for the next
  // batch; 0 keeps the paper's per-batch objective (earliest end).
  // get_tree_planner: "cut_through" (default) plans for daemons that forward
  // packet by packet (chains and narrow trees, F = 1..get_tree_max_fanout
  // server copies, slow uplinks as leaves); "store_forward" is
  // the paper's §10.3 planner, which assumes a distributor has the whole
  // model before it sends (get_deadline_slack applies to it).
  bool get_trees = true;
  // Update batches may go through streaming chains (core/aggregation.h,
  // AggregateChains) besides Alg. 3; false plans Alg. 3 alone.
  bool streaming_aggregation = true;
  // §5.3: a replica's copies may be summed on their way at the job's
  // aggregators (Alg. 3 towards the replica): "all" (copies of pushes in
  // flight too: such an aggregate is held at the replica until all its
  // pushes applied), "punted" (only copies punted to a later batch, whose
  // pushes are applied), "none" (every copy direct).
  std::string replica_aggregation = "all";
  // §5.3's divergence bound: "plan" (the paper's) times the replica's
  // copies on the declared link rates, so a link that delivers less lets
  // the server run past Div_max; "strict" plans a push only when the
  // norms of the updates the replica has not applied yet, its own
  // included, fit within Div_max (replica_tracker.h,
  // StrictReplicaAdmits): the bound holds whatever the links deliver, at
  // the cost of overlap.
  std::string replica_bound = "plan";
  std::string get_tree_planner = "cut_through";
  int64_t get_tree_max_fanout = 4;
  // cut_through: a tree is taken only if it ends at least this fraction
  // sooner than the server sending every copy itself (it costs the
  // forwarders' uplinks and a hop per level, which the estimate leaves out).
  double get_tree_min_saving = 0.2;
  double get_deadline_slack = 0;
  // A planned distribution's streams are reserved on their links until
  // they end (ClusterState::ReserveDistribution), so pushes planned
  // meanwhile see that a forwarder's uplink or a requester's downlink is
  // taken; false plans pushes as if gets moved nothing.
  bool get_reservations = false;
  // Admin HTTP endpoint (scheduler/admin/README.md). -1 disables it.
  std::string admin_address = "127.0.0.1";
  int64_t admin_port = -1;                    // 0 = pick a free port
  std::string admin_port_file;                // write the bound admin port here
  std::string admin_token;                    // bearer token for POSTs; empty = POSTs refused
  // Reads (the JSON API, /metrics, the trace) need the bearer token too;
  // only the dashboard's page and /healthz stay open. Needs admin_token.
  bool admin_read_auth = false;
  // The admin endpoint serves HTTPS only, with tls_cert_file/tls_key_file.
  bool admin_https = false;
  // Authentication (docs/architecture.md §3a, docs/operations/security.md).
  // Hosts authenticate with the cluster secret (read from this file, mode
  // 0600) or, with tls_client_ca_file, a client certificate whose common
  // name is the host's name. Either is required on a non-loopback
  // listen_address, where job tokens must also be at least 16 characters.
  std::string cluster_secret_file;
  std::string cluster_secret;                 // its contents (not a key)
  // TLS for gRPC: the scheduler's certificate and key (PEM); with a client
  // CA, daemons must present a certificate it signed (mutual TLS).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Data sessions between daemons start with an HMAC handshake and carry
  // per-job proofs (daemon/transport/data_auth.h); false turns that off
  // (for measuring its cost).
  bool data_plane_auth = true;
  // Every data session also encrypts its payloads (AES-256-GCM, keys from
  // an X25519 exchange in the handshake; daemon/transport/payload_cipher.h).
  // Needs data_plane_auth.
  bool data_plane_encryption = false;
  // No job ships by default: each job and its token come from the config.
  std::vector<JobConfig> jobs;
};

// true for 127.0.0.0/8, ::1 and "localhost".
bool IsLoopbackAddress(const std::string& address);

// Reads the config from a parsed command line; the error names the key.
absl::StatusOr<SchedulerConfig> LoadSchedulerConfig(const CommandLine& cl);
// The same from a reader over parsed JSON and flags (the fuzz target's entry).
absl::StatusOr<SchedulerConfig> LoadSchedulerConfig(ConfigReader reader);

// The --help text, listing every key with its default.
std::string SchedulerConfigHelp();

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_SCHEDULER_CONFIG_H_
