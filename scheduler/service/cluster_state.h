// ClusterState: everything the scheduler knows about hosts, jobs, servers
// and pushes, and the outcome state machine that ends every push exactly
// once (docs/architecture.md §3 step 7): applied (with its version and delay),
// dropped (with the planner's reason) or failed (with the error).
//
// A push is kPending from SubmitUpdate until a batch plans it, then
// kInFlight until the server's daemon reports it applied, or it fails
// (host down, timed out, its aggregate or round failed). Complete() is the
// only way out: it sends the source its PushOutcome, tells a server's
// daemon to skip a commit position that will never be filled, and takes
// down what cannot finish without the push (its aggregate, its round).
//
// Its state has owners. ClusterState itself owns the jobs (as configured)
// and the pushes not yet ended, since the outcome state machine is the
// only way a push leaves; each other concern is a part with its own
// contract and test, reached through an accessor:
//   hosts()       HostTable        registered hosts, alive or not
//   aggregates()  AggregateLedger  in-network aggregates and chain hops (§5.2)
//   groups()      GroupLedger      pushes to server groups and their parts
//   replicas()    ReplicaLedger    replica copies, their feeds, snapshots (§5.3)
//   restart()     RestartLedger    a restarted scheduler's pushes in doubt
//   outcomes()    OutcomeLog       how the last pushes ended, and their uids
//
//   ClusterState state(config, clock, &outbox, &history);
//   state.hosts().Register("w1") = ...;     // by the registration handlers
//   state.Complete(id, v1::OUTCOME_DROPPED, "stale: ...", 0);
//   state.MarkHostDown("w1", "daemon disconnected");
//
// Thread safety: none. The scheduler service owns one and calls it only
// under its own lock; commands go to the outbox, which has its own.
#ifndef MLFABRIC_SCHEDULER_SERVICE_CLUSTER_STATE_H_
#define MLFABRIC_SCHEDULER_SERVICE_CLUSTER_STATE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "common/clock.h"
#include "common/map_util.h"
#include "proto/scheduler.pb.h"
#include "scheduler/core/types.h"
#include "scheduler/service/admin_history.h"
#include "scheduler/service/aggregate_ledger.h"
#include "scheduler/service/command_outbox.h"
#include "scheduler/service/group_ledger.h"
#include "scheduler/service/host_table.h"
#include "scheduler/service/job_membership.h"
#include "scheduler/service/outcome_log.h"
#include "scheduler/service/pending_replica.h"
#include "scheduler/service/replica_ledger.h"
#include "scheduler/service/restart_ledger.h"
#include "scheduler/service/scheduler_config.h"
#include "scheduler/service/snapshot.h"
#include "scheduler/service/straggler_tracker.h"
#include "scheduler/service/update_record.h"

namespace mlfabric {

// One synchronous round of a Mercury-PS server: the pushes computed from
// model version `version`, summed at the server's daemon.
struct RoundState {
  std::set<std::string> workers;  // who has a push in it
  // Set when its first push is accepted (OpenRound, round_tracker.h), and
  // kept: the pushes it closes with (its server's daemon is told this size
  // with every member) and the job's membership generation then
  // (job_membership.h). Only members of that generation contribute to it:
  // a worker that joins (or joins again) later counts from a later round.
  // Before the round is announced to its server's daemon (no push
  // admitted yet), a member leaving may lower its size (member_loss
  // shrink); the generation stays.
  int32_t size = 0;
  uint64_t generation = 0;
  int64_t bytes = -1;             // every member's size and type
  v1::DType dtype = v1::DTYPE_FLOAT32;
  std::string failed;  // why the round failed, if it did
  // The tensor shape of its first admitted push that named one, and that
  // push's worker: later pushes naming a shape must name the same.
  std::optional<std::vector<int64_t>> shape;
  std::string shape_worker;
};

// A worker's grant to send its push of `round` at once, on the plan of its
// last round (round_grants.h): what the scheduler checks the push against
// and whether the plan still holds (the membership generation and the
// links' capacities it saw).
struct IssuedGrant {
  uint64_t transfer_id = 0;
  int64_t round = 0;
  int64_t bytes = 0;
  double rate_bps = 0;
  std::string src_host;
  uint64_t generation = 0;
  double src_uplink_bps = 0;
  double dst_downlink_bps = 0;
};

// A hot-standby replica's view of one server (§5.3).
struct ReplicaTrack {
  std::vector<PendingReplica> pending;   // copies punted to a later batch
  std::map<uint64_t, double> in_flight;  // copy transfer id -> update norm
  uint64_t next_sequence = 1;            // the replica's own commit order
  int64_t applied = 0;
  // Updates the server applied that the replica never will: their copies
  // were still arriving when a scheduler restart broke the replica's
  // stream (in_doubt.h). A failover counts them lost.
  int64_t missed = 0;
  double missed_norm = 0;
  // A replica that installs snapshots (replica_sync.h) starts from the
  // server's model taken after the last position assigned before its
  // first copy: wanted at registration, sent at the next batch cycle
  // (snapshot_id while it moves), synced once the replica installed it.
  // A replica not synced is not promoted.
  bool snapshot_wanted = false;
  uint64_t snapshot_id = 0;
  uint64_t snapshot_sequence = 0;  // its position at the replica
  bool synced = true;
};

// One shard of a server group (server_groups.h): bytes [begin, end) of the
// group's model, held by the server application `server`.
struct ShardSlot {
  std::string server;  // empty: not registered yet
  int64_t begin = 0;
  int64_t end = 0;
  // Group positions this shard's daemon must skip, with why, told once the
  // shard registers (again): another shard caught up on a push at them
  // while this one was not registered with this scheduler (in_doubt.h).
  std::vector<std::pair<uint64_t, std::string>> owed_skips;
};

struct ServerState {
  std::string host;
  // A server group (mlfabric.md §10.2): this entry, under the
  // group's name, stands for the model split across `shards` (by index):
  // pushes, batches, sequence numbers and versions are the group's, and
  // `host` is shard 0's. Empty for a server that is no group.
  std::vector<ShardSlot> shards;
  std::string group;  // a shard: the group it belongs to
  ReplicaTrack replica;
  int64_t model_version = 0;
  uint64_t next_sequence = 1;
  std::vector<uint64_t> pending;  // transfer ids in arrival order
  int64_t in_flight = 0;
  int32_t round_size = 0;                 // as registered; see RoundSize
  int32_t backup_workers = 0;             // as registered (round servers)
  bool plan_on_arrival = false;           // as registered (exchange servers)
  // A server registered with round_size (an AllReduce root): the workers
  // whose pushes its rounds admitted, its ranks (ElasticRanks).
  std::set<std::string> ranks;
  std::map<int64_t, RoundState> rounds;   // by the members' version
  std::map<std::string, IssuedGrant> grants;  // by worker: its next round's
};

struct WorkerInfo {
  std::string host;
  int64_t delay_bound = -1;  // -1 = the job's
  double divergence_bound = -1;
};

struct JobState {
  uint32_t id = 0;
  JobConfig config;
  std::map<std::string, ServerState> servers;
  std::map<std::string, WorkerInfo> workers;  // every worker that registered
  JobMembership membership;  // the live ones, and their generation
  std::map<std::string, std::string> replica_hosts;  // server -> its replica's host
  std::set<std::string> snapshot_replicas;  // servers whose replica installs snapshots
  std::vector<FailoverView> failovers;  // oldest first (failover.h)
  int64_t applied = 0;
  int64_t dropped = 0;
  int64_t failed = 0;
};

// Job policies (pure).
// The round size in force for a server: the pushes a round sums and closes
// with. M = as registered (less its ranks that left, ElasticRanks), else
// the number of live members of a sync-mode job (job_membership.h) once a
// worker registered; less the backup workers (the server's, else the sync
// job's), at least 1. 0: not a synchronous-round server. A round keeps the
// size it opened with (RoundState::size), or a smaller one (MemberLeft).
int32_t RoundSize(const JobState& job, const ServerState& server);
// Whether the server's rounds are sized by the job's members (a sync-mode
// job's server registered without M).
bool MemberSizedRounds(const JobState& job, const ServerState& server);
// Whether a server registered with M (an AllReduce root, any job mode)
// follows its ranks' membership: only when the job's config says
// "member_loss": "shrink" in so many words. Its rounds then have M less
// its ranks (ServerState::ranks) that left the job; a rank that never
// pushed is not known, so it counts until it has. Otherwise M is kept and
// a rank that leaves fails the round it leaves open (round_tracker.h).
bool ElasticRanks(const JobState& job, const ServerState& server);
// The server's ranks that are no live members of the job (0 unless
// ElasticRanks).
int32_t RanksLeft(const JobState& job, const ServerState& server);
// The tightest delay bound among the job's live members (job_membership.h:
// a worker that left bounds nothing) and its tau_max (an ssp job's K bounds
// iterations instead, scheduler_service.h AwaitClock).
int64_t DelayBound(const JobState& job);
// The tightest divergence bound (§5.3) among the job's divergence_max and
// its live members' own; 0 = none.
double DivergenceBound(const JobState& job);

// The epoch of a scheduler started at Unix time `wall_s`: whole seconds
// since 2024-01-01 UTC, 0 before that, at most 2^28 - 1 (until 2032).
uint64_t SchedulerEpoch(double wall_s);
inline constexpr int kEpochShift = 32;

class ClusterState {
 public:
  ClusterState(const SchedulerConfig& config, const Clock* clock, CommandOutbox* outbox,
               AdminHistory* history);

  // Jobs, as configured (the scheduler's config file), by name.
  JobState* FindJob(const std::string& job) { return FindOrNull(jobs_, job); }
  const JobState* FindJob(const std::string& job) const { return FindOrNull(jobs_, job); }
  const std::map<std::string, JobState>& jobs() const { return jobs_; }
  // Visits every server of every job, to change it in place.
  void ForEachServer(absl::FunctionRef<void(const std::string& job_name, JobState& job,
                                            const std::string& server_name, ServerState& server)>
                         visit);
  // The job `name`, made with a default configuration if there is none
  // (unit tests; a scheduler's jobs come from its configuration).
  JobState& GetOrAddJob(const std::string& name) { return jobs_[name]; }

  // The pushes not yet ended, by transfer id (see the banner): added when
  // accepted (SubmitUpdate, or a restart's in-doubt push planned again),
  // taken out only by Complete, or by a failover that hands a push's fate
  // to its replica copy (TakePush).
  UpdateRecord& AddPush(UpdateRecord record);
  UpdateRecord* FindPush(uint64_t transfer_id) { return FindOrNull(updates_, transfer_id); }
  const UpdateRecord* FindPush(uint64_t transfer_id) const {
    return FindOrNull(updates_, transfer_id);
  }
  const std::map<uint64_t, UpdateRecord>& pushes() const { return updates_; }
  std::optional<UpdateRecord> TakePush(uint64_t transfer_id);
  // Visits every push not yet ended, to change it in place.
  void ForEachPush(absl::FunctionRef<void(UpdateRecord& record)> visit);
  // A planned distribution's stream (server or distributor -> requester).
  struct DistributionLeg {
    std::string src, dst;
    std::vector<core::RateSegment> segments;
    double end_s = 0;
  };
  // The in-network aggregates in flight and their chains' hops (§5.2).
  AggregateLedger& aggregates() { return aggregates_; }
  const AggregateLedger& aggregates() const { return aggregates_; }
  // Replica copies in flight, their feeds, the pushes they decide after a
  // failover (out of pushes(), so that nothing else ends them first), and
  // replica snapshots moving.
  ReplicaLedger& replicas() { return replicas_; }
  const ReplicaLedger& replicas() const { return replicas_; }
  // A restarted scheduler's account of the pushes of its predecessor's
  // plans (restart_ledger.h; in_doubt.h decides them).
  RestartLedger& restart() { return restart_; }
  const RestartLedger& restart() const { return restart_; }
  // Pushes to server groups in flight, and their parts and feeds.
  GroupLedger& groups() { return groups_; }
  const GroupLedger& groups() const { return groups_; }
  SchedulerStats stats;
  // Workers' iteration clocks and timings: a push counts when accepted,
  // its transfer time when it ends (Complete).
  StragglerTracker stragglers;

  // Transfer ids and incarnations: the scheduler's epoch (SchedulerEpoch of
  // its start) in bits 32-59, so a restarted scheduler's ids never equal its
  // predecessor's (unless both started in the same second). Below it a
  // transfer id counts; an incarnation has 32 random bits (never one this
  // scheduler issued before), so it cannot be guessed (the
  // session token is what authenticates a host's calls). Bits 60-63 stay
  // clear: daemons mark their own ids there.
  uint64_t NewTransferId() { return next_transfer_id_++; }
  uint64_t NewIncarnation();
  uint64_t epoch() const { return epoch_; }
  uint64_t NewBatchId() { return next_batch_id_++; }
  double NowSeconds() const { return clock_->NowSeconds(); }

  // The hosts that registered, and which are alive (host_table.h).
  HostTable& hosts() { return hosts_; }
  const HostTable& hosts() const { return hosts_; }
  const HostState* AliveHost(const std::string& host) const { return hosts_.Alive(host); }
  // Queues a command for `host` if it is alive (a dead host's part is failed).
  void Enqueue(const std::string& host, v1::DaemonCommand command);

  // The outcome state machine (see the banner). Unknown ids are ignored:
  // a push ends once.
  void Complete(uint64_t transfer_id, v1::Outcome outcome, const std::string& reason,
                int64_t applied_version);
  // How the last pushes ended, for sources that may not have heard
  // (in_doubt.h), and the applications' uids for them (outcome_queries.h).
  OutcomeLog& outcomes() { return outcomes_; }
  const OutcomeLog& outcomes() const { return outcomes_; }
  // Fails an aggregate and every constituent still in flight, and tells the
  // aggregator and the server's daemon to forget it.
  void FailAggregate(uint64_t aggregate_id, const std::string& reason);
  // Fails round `round` of a synchronous-round server and every push in it.
  void FailRound(const std::string& job, const std::string& server, int64_t round,
                 const std::string& reason);
  // The host's stream ended or it registered again: every push from or to
  // it, every aggregate on it and every replica copy through it fails.
  void MarkHostDown(const std::string& host, const std::string& reason);
  // Fails in-flight pushes past their deadline (slow or vanished daemons),
  // and those whose failure waited for a failover that did not come.
  void ExpireOverdue(double now_s);
  // Push `transfer_id`'s transfer to its server failed with `reason`. It
  // fails now, unless its replica holds or is receiving its copy: then it
  // waits `grace_s` for a failover, which would make it applied.
  void FailTransfer(uint64_t transfer_id, const std::string& reason, double grace_s);
  // Push `transfer_id` is to fail with `reason` (a timeout, its source's
  // host down) while its bytes may be at its server's daemon: that daemon
  // is told to skip its commit position and confirm, and the push fails
  // when it does (FailTransfer), or is applied if the application had it
  // already; so it is never reported failed and then applied. Without a
  // position at a live server (pending, aggregated, a round member) it
  // fails now. A daemon that does not answer within 2 x keepalive_s +
  // transfer_slack_s is not waited for longer (ExpireOverdue).
  void FailWhenCancelled(uint64_t transfer_id, const std::string& reason);
  // The same for an in-network aggregate (its aggregator's or a hop's host
  // down, a constituent timed out or its source down): its whole sum may be
  // at the server's daemon already.
  void FailAggregateWhenCancelled(uint64_t aggregate_id, const std::string& reason);
  // Waiting for its server's daemon to confirm a cancellation (its own or
  // its aggregate's).
  bool AwaitingCancel(const UpdateRecord& record) const;

  // §5.3 bookkeeping: tells the replica's daemon to skip a copy that will
  // never arrive; forgets a server's punted copies and frees their bytes.
  void CancelReplicaCopy(uint64_t copy_id, const ReplicaCopy& copy, const std::string& reason);
  // A replica copy ended, applied at the replica or not (reported by its
  // daemon, or a host it needed went down): the replica's counts, the push
  // it decides (ReplicaLedger::TakeDecidedBy), and a failover's loss.
  // `model_version`: the replica's, when applied.
  void EndReplicaCopy(uint64_t copy_id, bool applied, const std::string& reason,
                      int64_t model_version);
  // Push `record`, decided by its copy after a failover, ends as it did.
  void EndDecidedByCopy(UpdateRecord record, bool applied, const std::string& reason,
                        int64_t model_version);
  void DropReplicaPending(ServerState* server, const std::string& reason);
  // Push `transfer_id` ended: its held replica copies are released to the
  // replica (applied) or cancelled there (not applied).
  void SettleHeldCopies(uint64_t transfer_id, bool applied, const std::string& reason);

  // Server groups' share of the outcome state machine (server_groups.h
  // builds on these). Whether `id` is a group aggregate's
  // (GroupPush::constituents).
  bool IsGroupAggregate(uint64_t id) const;
  // Group aggregate `id` fails: its sums not released are cancelled at their
  // shards (and the aggregation at the aggregator), and every constituent
  // still in flight fails with `reason` (said to have been applied at some
  // shards if it was released: those keep it, as a group push's). Its
  // bookkeeping is forgotten first, so re-entry through Complete is a no-op.
  void FailGroupAggregate(uint64_t id, const std::string& reason);
  // Complete's share: push `push_id` (at group sequence `sequence`) ended;
  // its parts not yet released are cancelled at their shards, and the push's
  // bookkeeping is forgotten. False if it is no group push.
  bool EndGroupPush(uint64_t push_id, uint64_t sequence, const std::string& reason);

  // In-flight reservations on each host's uplink/downlink, as segments:
  // planned pushes, aggregates, replica copies and (ReserveDistribution)
  // model distributions that have not ended. With `hosts`, only the links
  // of those hosts: a get's distribution needs its server's and requesters'
  // links, and collecting every host's made each one cost a pass over all
  // of them (with many shards, most of the scheduler's time, under its lock).
  void Reservations(std::map<std::string, std::vector<core::RateSegment>>* up,
                    std::map<std::string, std::vector<core::RateSegment>>* down,
                    const absl::flat_hash_set<std::string>* hosts = nullptr) const;

  // A model distribution's planned streams (§10.3), reserved until they
  // end so that the pushes and distributions planned meanwhile know the
  // links they take. Forgets legs that ended.
  void ReserveDistribution(std::vector<DistributionLeg> legs);

 private:
  // MarkHostDown's steps. Fails the aggregates (Alg. 3's, a streaming
  // chain's, a server group's) the host sums or forwards.
  void FailAggregatesOn(const std::string& host_name, const std::string& reason);
  // The pushes whose source or server (a shard's too) is on the host, taken
  // out of their servers' pending lists, for the caller to fail.
  std::vector<uint64_t> TakeUpdatesThrough(const std::string& host_name);
  // Ends the replica copies from, to or fed by the host (or leaves a held
  // one to its pushes' outcomes), and a replica on the host's punted copies.
  void EndReplicaCopiesOn(const std::string& host_name, const std::string& reason);
  void RecordDrop(const UpdateRecord& record, v1::Outcome outcome, const std::string& category,
                  const std::string& reason);
  // Complete's steps. An in-flight push leaves its server's count, and a
  // failed one's sequence number is skipped there.
  void LeaveServer(uint64_t transfer_id, const UpdateRecord& record, JobState* job,
                   v1::Outcome outcome, const std::string& reason);
  // The outcome the push's source is told (counted; a punted replica copy
  // is queued for a later batch and its bytes held).
  v1::DaemonCommand OutcomeCommand(uint64_t transfer_id, const UpdateRecord& record,
                                   JobState* job, v1::Outcome outcome, const std::string& reason,
                                   int64_t applied_version);
  // An applied push's delay and timing, for the admin history.
  void RecordAppliedDelay(uint64_t transfer_id, const UpdateRecord& record, int64_t delay);
  // EndReplicaCopy's steps. At the server's replica track: the copy is no
  // longer in flight (returns the norm it had), and an applied one counts.
  double EndReplicaCopyAtServer(uint64_t copy_id, const ReplicaCopy& copy, JobState* job,
                                bool applied, int64_t model_version);
  // A copy that failed: cancelled, its applied pushes counted as missed by
  // the replica (or lost, after a failover), its unsettled ones punted.
  void FailReplicaCopy(uint64_t copy_id, const ReplicaCopy& copy, JobState* job, double norm,
                       const std::string& reason);

  const SchedulerConfig& config_;
  const Clock* clock_;
  CommandOutbox* outbox_;
  AdminHistory* history_;
  std::map<std::string, JobState> jobs_;
  std::map<uint64_t, UpdateRecord> updates_;  // pushes not yet ended
  std::vector<DistributionLeg> distribution_legs_;  // ReserveDistribution
  AggregateLedger aggregates_;
  RestartLedger restart_;
  GroupLedger groups_;
  ReplicaLedger replicas_;
  uint64_t epoch_ = 0;
  uint64_t next_transfer_id_ = 1;
  std::set<uint64_t> incarnations_;  // issued by this scheduler
  uint64_t next_batch_id_ = 1;
  HostTable hosts_;
  OutcomeLog outcomes_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_CLUSTER_STATE_H_
