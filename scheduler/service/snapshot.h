// ClusterSnapshot: a consistent, copyable picture of the scheduler's state
// for observers (the admin endpoint, logs, tests). SchedulerService::Snapshot()
// fills it under the service's lock; readers render it at leisure with no
// lock and no reference into the live service.
//
//   ClusterSnapshot snap = service.Snapshot();
//   for (const HostView& host : snap.hosts) Print(host.name, host.available_up_bps);
//
// Units: seconds on the scheduler's monotonic clock (`now_s` is "now"),
// bits per second, bytes. Plain values only; safe to hand to another thread.
#ifndef MLFABRIC_SCHEDULER_SERVICE_SNAPSHOT_H_
#define MLFABRIC_SCHEDULER_SERVICE_SNAPSHOT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/core/types.h"
#include "scheduler/service/job_membership.h"
#include "scheduler/service/scheduler_config.h"
#include "scheduler/service/straggler_tracker.h"

namespace mlfabric {

// Service-wide counters since start.
struct SchedulerStats {
  int64_t batches = 0;    // batch cycles that planned at least one server
  int64_t planned = 0;    // updates dispatched to the data plane
  int64_t applied = 0;
  int64_t dropped = 0;    // dropped by the planner (stale, lookahead, ...)
  int64_t failed = 0;     // failed (host down, timed out, plan error, ...)
  int64_t rejected = 0;   // SubmitUpdate refused
  int64_t timed_out = 0;  // subset of failed: in-flight past deadline
  int64_t aggregates = 0; // in-network aggregates dispatched (§5.2)
  // Partial sums streamed from one aggregator to the next (streaming
  // chains, core/aggregation.h); each chain's last hop is in `aggregates`.
  int64_t chain_hops = 0;
  int64_t replica_copies = 0;  // replica transfers dispatched (§5.3)
  // Of those, aggregates of punted copies summed at an aggregator on their
  // way to the replica (PlanDispatcher, §5.3 with the replica's aggregators).
  int64_t replica_aggregates = 0;
  // What the replica transfers carry into the replica's host: bytes, and
  // the updates they hold (an aggregate holds several); updates * update
  // size / bytes is the saving of replica aggregation (the paper's Fig. 9).
  int64_t replica_bytes = 0;
  int64_t replica_updates = 0;
  int64_t bandwidth_reports = 0;
  // Pushes of a lost scheduler's plans, ended by this one (in_doubt.h).
  int64_t in_doubt_applied = 0;
  int64_t in_doubt_failed = 0;
  // Punted replica copies whose sources held them across a scheduler
  // restart, planned again by this one (in_doubt.h).
  int64_t held_sources_recopied = 0;
  // replica_bound "strict": pushes held back from a batch until the
  // replica caught up (one per push and batch it waited).
  int64_t replica_bound_waits = 0;
  // Pushes a server's daemon applied after this scheduler reported them
  // dropped or failed: exactly-once broken (should stay 0).
  int64_t outcome_contradicted = 0;
  // QueryOutcomes calls: applications that lost their daemon asking how
  // their pushes ended (outcome_queries.h).
  int64_t outcome_queries = 0;
  // Pushes that arrived before their server registered and waited for it
  // (server_wait_s), whether it came in time or not.
  int64_t server_waits = 0;
  // Rounds on the previous round's plan (round_grants.h): grants issued
  // with a round member's plan, and pushes sent on one (accounted and
  // announced, not planned).
  int64_t round_grants = 0;
  int64_t granted_pushes = 0;
  double plan_ms_total = 0;  // summed planner compute time over all batches
  double plan_ms_max = 0;
};

// One host's NIC as the scheduler sees it now. The network view the planner
// gets is `reported - reserved` per direction (docs/architecture.md §4).
struct HostView {
  std::string name;
  std::string data_address;
  bool alive = false;
  bool draining = false;             // admin drain: no new pushes from/to it
  double capacity_up_bps = 0;        // from registration (or the default)
  double capacity_down_bps = 0;
  double reported_up_bps = 0;        // latest monitor report (capacity if none)
  double reported_down_bps = 0;
  double last_report_s = -1;         // -1: never reported
  int64_t reports = 0;
  double reserved_up_bps = 0;        // in-flight reservations at now_s
  double reserved_down_bps = 0;
  double available_up_bps = 0;       // reported - reserved, >= 0
  double available_down_bps = 0;
};

struct ServerView {
  std::string name;
  std::string host;
  int64_t model_version = 0;
  int64_t pending = 0;
  int64_t in_flight = 0;
  // Server groups (docs/user-guide/sharded-servers.md): a group's shards, in byte
  // order; a shard's group.
  std::vector<std::string> shards;
  std::string group;
  // Its hot-standby replica (§5.3), if it has one: where, the updates the
  // replica reported applied, how many the server applied that the replica
  // has not yet (copies in flight or punted to a later batch), and a bound
  // on ||w_server - w_replica|| (momentum 0): the sum of their norms and of
  // the updates on their way to the server that one side may hold without
  // the other (copies punted, or applied at the replica first).
  std::string replica_host;
  int64_t replica_applied = 0;
  int64_t replica_lag = 0;
  double divergence_estimate = 0;
};

// One failover (mlfabric.md §3.3): server `server` moved from `from_host`
// to its replica's host `to_host`, and what it cost. The pushes in flight
// to the old server end by what the replica holds: applied where the
// replica had (or then received) their copy, failed otherwise. Updates the
// old server applied whose copies had not reached the replica are sent to
// it from their sources (which still hold them); `lost_updates` counts
// those that never arrived (their source was gone too), with the sum of
// their norms, a bound on what the promoted model lacks.
struct FailoverView {
  std::string server;
  std::string from_host;
  std::string to_host;
  std::string reason;
  double at_s = 0;
  int64_t model_version = 0;        // the old server's, at the failover
  int64_t in_flight_applied = 0;    // in flight, held by the replica: applied
  int64_t in_flight_failed = 0;     // in flight, not held by the replica: failed
  int64_t in_flight_awaiting = 0;   // in flight, decided by a copy still moving
  int64_t catch_up_copies = 0;      // applied at the old server, sent on after
  int64_t lost_updates = 0;
  double lost_norm = 0;
};

struct JobView {
  uint32_t id = 0;
  JobConfig params;  // token blanked
  std::vector<ServerView> servers;
  // Workers that pushed: clocks, median timings, straggler flags.
  std::vector<WorkerTiming> workers;
  // ssp jobs: workers waiting at a get for the slowest to catch up.
  struct SspWait {
    std::string worker;
    int64_t clock = 0;
    int64_t slowest_clock = 0;
    std::string slowest_worker;
    double since_s = 0;
  };
  std::vector<SspWait> ssp_waiting;
  std::vector<FailoverView> failovers;  // oldest first
  // Its live workers and their generation (job_membership.h), with the
  // last changes, oldest first.
  std::vector<std::string> members;
  uint64_t generation = 1;
  std::vector<MembershipChange> membership_changes;
  int64_t ssp_waits = 0;          // gets that had to wait, since start
  int64_t ssp_wait_timeouts = 0;  // of which gave up after ssp_max_wait_s
  int64_t applied = 0;
  int64_t dropped = 0;
  int64_t failed = 0;
};

// A scheduled transfer (one link pair: src uplink -> dst downlink).
struct TransferView {
  uint64_t transfer_id = 0;
  uint64_t batch_id = 0;
  std::string job;
  std::string server;
  std::string src;
  std::string dst;
  int64_t bytes = 0;
  double start_s = 0;
  double end_s = 0;
  double deadline_s = 0;  // fails as timed out if not completed by then
  double planned_at_s = 0;  // when its batch was planned (batch.now_s)
  std::vector<core::RateSegment> segments;
};

// One server's batch: inputs summary, the network view it was planned on,
// the plan, and how long planning took.
struct BatchView {
  uint64_t id = 0;
  std::string job;
  std::string server;
  std::string server_host;
  double planned_at_s = 0;   // batch.now_s
  double compute_ms = 0;     // wall time of PlanBatch
  int worker_thread = 0;     // planning thread index
  int64_t updates = 0;
  int64_t scheduled = 0;
  int64_t dropped = 0;
  std::string error;         // planner error, if any
  std::vector<core::HostLink> network;  // per-host view handed to the planner
  std::vector<TransferView> transfers;
  std::vector<core::Drop> drops;
};

// A push that ended without being applied.
struct DropView {
  uint64_t transfer_id = 0;
  std::string job;
  std::string server;
  std::string src;
  std::string outcome;   // "dropped" | "failed"
  std::string category;  // stale, deadline_lookahead, timed_out, host_down, ...
  std::string reason;    // full text sent to the application
  double at_s = 0;
};

// An applied push: its staleness (updates applied since v(g), §3.1) and how
// long it took from SubmitUpdate to the server's commit, in three parts:
// waiting for its batch to be planned, the plan's own time until its bytes
// (alone or summed on the way) reach the server, and how much later than
// planned the server's daemon reported the commit (negative: sooner).
struct DelayView {
  uint64_t transfer_id = 0;
  std::string job;
  std::string server;
  std::string src;
  int64_t delay = 0;
  double latency_s = 0;
  double queued_s = 0;
  double planned_s = 0;
  double late_s = 0;
  double at_s = 0;
};

// The same parts summed over every applied push of a job that was planned
// (all time; a push applied without a plan, such as after a failover, is
// not counted), for the mean of each.
struct PushPhases {
  int64_t count = 0;
  double latency_s = 0;
  double queued_s = 0;
  double planned_s = 0;
  double late_s = 0;
};

// Per-link usage at one instant, sampled every `kLinkSamplePeriodS`.
struct LinkSample {
  double at_s = 0;
  struct Use {
    std::string host;
    double up_reserved_bps = 0;
    double down_reserved_bps = 0;
    double up_reported_bps = 0;
    double down_reported_bps = 0;
  };
  std::vector<Use> links;
};

// Histogram of delays: counts[i] counts delays <= bounds[i] and > bounds[i-1];
// the last count is the overflow (> bounds.back()).
struct DelayHistogram {
  std::vector<int64_t> bounds;
  std::vector<int64_t> counts;
  int64_t total = 0;
  int64_t sum = 0;
};

// One batch cycle (batch_loop.h): from cutting the batches to the last
// command queued, lock waits included. Kept for the last kRecentCycles.
struct CycleView {
  double start_s = 0;
  double total_ms = 0;    // the whole cycle
  // Its parts: waiting for the service's lock (held by the daemons' calls),
  // cutting the batches under it, the planners' wall time (in parallel,
  // without the lock), and queuing the plans' commands under it. The rest
  // of total_ms (the outbox's wake-ups, the clock) is small.
  double lock_wait_ms = 0;
  double cut_ms = 0;
  double plan_ms = 0;
  double dispatch_ms = 0;
  // How far after the cut its batches were planned for (plan_lead.h).
  double lead_ms = 0;
  int32_t batches = 0;    // servers planned
  int64_t updates = 0;    // updates in those batches
};

struct ClusterSnapshot {
  double now_s = 0;
  double started_s = 0;
  std::string planner;
  double batch_interval_ms = 0;
  int planner_threads = 0;
  SchedulerStats stats;
  std::vector<HostView> hosts;
  std::vector<JobView> jobs;
  std::vector<BatchView> recent_batches;   // oldest first
  std::vector<TransferView> in_flight;
  std::vector<DropView> recent_drops;      // oldest first
  std::map<std::string, int64_t> drops_by_category;  // dropped and failed, all time
  std::vector<DelayView> recent_delays;    // oldest first
  std::map<std::string, PushPhases> push_phases;  // by job
  DelayHistogram delay_histogram;
  std::vector<LinkSample> link_samples;    // oldest first
  std::vector<CycleView> recent_cycles;    // oldest first; cycles that planned something
};

// What an admin may change about a job at run time; unset fields stay.
struct JobParamsUpdate {
  std::optional<int64_t> tau_max;
  std::optional<int64_t> staleness_k;
  std::optional<double> divergence_max;
  std::optional<double> momentum;
  std::optional<int64_t> priority_class;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_SNAPSHOT_H_
