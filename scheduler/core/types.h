// Value types of the scheduler core: one batch of update-transfer requests
// in, one plan out. They mirror the planner JSON contract of docs/architecture.md §4
// field for field (units: bytes, seconds, bits per second), so the service,
// the `mlfabric-plan` CLI and the tests all speak the same language.
//
// Everything here is a plain value: copyable, no pointers into other
// objects, safe to hand to another thread.
#ifndef MLFABRIC_SCHEDULER_CORE_TYPES_H_
#define MLFABRIC_SCHEDULER_CORE_TYPES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mlfabric::core {

// A piecewise-constant rate: `rate_bps` holds from `from_s` to `to_s`.
struct RateSegment {
  double from_s = 0;
  double to_s = 0;
  double rate_bps = 0;
};

// A point of a piecewise-constant profile: from `at_s` on (until the next
// point) the capacity is `rate_bps`.
using ProfilePoint = std::pair<double, double>;

// One host's NIC as the scheduler sees it (congestion-free core, §7.4).
struct HostLink {
  std::string name;
  double uplink_bps = 0;
  double downlink_bps = 0;
  // Optional; when non-empty they override the constant capacities.
  std::vector<ProfilePoint> uplink_profile;
  std::vector<ProfilePoint> downlink_profile;
};

// §10.2: one further component of an update to a model split across
// several servers. The component goes to `server` and shares the update's
// deadline; all components are reserved together.
struct ShardPart {
  std::string server;
  int64_t bytes = 0;
};

// One pushed update waiting to be scheduled (docs/architecture.md §3 step 1).
struct UpdateRequest {
  std::string id;
  std::string worker;   // source host
  int64_t bytes = 0;
  int64_t version = 0;  // v(g): the model version the update was computed from
  double norm = 0;      // ||g||, used by replication (§5.3)
  // Extension (§10.2): components for further servers; `bytes` above is the
  // component for the batch's own server. Empty for a single-server model.
  std::vector<ShardPart> shards;
};

// Extension: an explicit network element beyond the host NICs (e.g. a
// rack uplink), for topologies whose core is not congestion-free.
struct TopologyLink {
  std::string name;
  double bps = 0;
  std::vector<ProfilePoint> profile;  // optional; overrides `bps`
};

// Extension: a fixed path from `src` to `dst` through `links` (names of
// TopologyLinks), used in addition to the source uplink and destination
// downlink. Host pairs without an entry use the congestion-free core.
struct FixedPath {
  std::string src;
  std::string dst;
  std::vector<std::string> links;
};

// Hot-standby replica and its divergence bound (§5.3).
struct ReplicaSpec {
  std::string host;
  std::vector<std::string> aggregators;
  double divergence_bound = 0;
  double momentum = 0;
  double history_norm = 0;
  std::vector<double> lead;  // norms of updates applied at the server, not yet at the replica
  // Extension: updates the server applied in earlier batches whose replica
  // transfers were punted (§5.3: "processed along with the next batch"), in
  // apply order. They follow `lead` in the server's order and go to the
  // replica ahead of this batch's updates. Only id, worker, bytes and norm
  // are used.
  std::vector<UpdateRequest> pending;
  // Extension (the live service; not part of the planner JSON): only the
  // `pending` copies may go through the replica's aggregators, this batch's
  // go direct. A copy of a push still in flight waits at the replica for
  // the push's outcome (exactly once), so it must not be summed with
  // others whose pushes may end differently; `pending` pushes are applied.
  bool aggregate_pending_only = false;
};

enum class Mode { kAsync, kSync };

struct Batch {
  double now_s = 0;
  Mode mode = Mode::kAsync;
  int64_t tau_max = 0;
  int64_t v_init = 0;
  std::string server;
  std::vector<std::string> aggregators;
  std::optional<ReplicaSpec> replica;
  std::vector<HostLink> hosts;
  std::vector<UpdateRequest> updates;
  // Optional explicit topology (see TopologyLink, FixedPath).
  std::vector<TopologyLink> links;
  std::vector<FixedPath> paths;
  uint64_t seed = 1;  // randomness (aggregator pre-assignment) comes from here
  // "aggregation": "streaming" (default) also considers streaming chains
  // (aggregation.h); "alg3" plans the paper's Alg. 3 alone.
  bool streaming_aggregation = true;
};

enum class TransferKind { kDirect, kToAggregator, kAggregate, kReplica, kReplicaAggregate };

const char* TransferKindName(TransferKind kind);

struct Transfer {
  std::string update;  // update id, or "agg:<n>" for an aggregate
  std::string src;
  std::string dst;
  TransferKind kind = TransferKind::kDirect;
  double start_s = 0;
  double end_s = 0;
  int64_t bytes = 0;
  std::vector<RateSegment> segments;
  // For aggregates: the update ids summed into it, in commit order.
  std::vector<std::string> constituents;
  // For an aggregate that is one hop of a streaming chain (aggregation.h):
  // the aggregate ("agg:<n>") its partial sum feeds at `dst`; empty when
  // it goes to the server.
  std::string into;
};

struct Drop {
  std::string id;
  std::string reason;  // "deadline_lookahead", "stale", ...
};

struct Commit {
  std::string update;
  double at_s = 0;
  int position = 0;  // 1-based position in the batch's commit order
};

struct Plan {
  std::vector<std::string> order;
  std::vector<Drop> dropped;
  std::vector<Transfer> transfers;
  std::vector<Commit> commits;
  std::vector<Commit> replica_commits;
  std::vector<std::string> punted;
  double compute_ms = 0;
  // Extensions for inspection (stats): Alg. 3's chosen split point (number
  // of updates sent directly to the server; -1 when not run) and the §5.3
  // divergence bound at the last server commit (0 without a replica).
  int aggregation_split = -1;
  double replica_divergence = 0;
};

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_TYPES_H_
