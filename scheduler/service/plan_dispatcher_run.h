// PlanDispatcher::Run, one Apply's working state, shared by the files that
// carry a plan out: plan_dispatcher.cc (a server's batch, its aggregates and
// replica copies) and plan_dispatcher_groups.cc (a server group's batch).
// Internal to the dispatcher; nothing else includes it.
//
// Thread safety: none; used under the scheduler service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_PLAN_DISPATCHER_RUN_H_
#define MLFABRIC_SCHEDULER_SERVICE_PLAN_DISPATCHER_RUN_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "scheduler/service/commands.h"
#include "scheduler/service/plan_dispatcher.h"

namespace mlfabric {

class PlanDispatcher::Run {
 public:
  Run(const PlanDispatcher& dispatcher, const BatchWork& work, JobState* job)
      : config_(dispatcher.config_),
        state_(*dispatcher.state_),
        work_(work),
        job_(*job),
        server_(job->servers[work.server]) {}

  BatchView Dispatch(const std::string& planner_name);

 private:
  // A single server's plan's transfers by the update they carry. Streaming
  // chains (core/aggregation.h): a hop's partial sum feeds the aggregate
  // named by its `into`; aggregate_of maps to the last aggregate, the one
  // that reaches the server.
  struct PlanIndex {
    std::map<std::string, const core::Transfer*> direct, to_aggregator, aggregate_of;
    std::map<std::string, const core::Transfer*> feeds;  // "agg:<n>" -> the hop into it
  };
  static PlanIndex IndexPlan(const core::Plan& plan);

  // Fills view_: the batch and how its planning went, as the admin history
  // shows it.
  void RecordBatch();
  // Carries out update `id_text` of a single server's plan, in commit order:
  // direct, or to the first aggregator of its aggregate (opened on its first
  // constituent). An update that failed meanwhile is skipped.
  void DispatchUpdate(const std::string& id_text, const PlanIndex& index,
                      const HostState& server_host);
  // A transfer of `plan` as the admin history and the timeout check see it.
  TransferView Planned(uint64_t id, const std::string& src, const std::string& dst,
                       int64_t bytes, const core::Transfer& transfer, double deadline_s) const;
  void DispatchDirect(UpdateRecord& record, const core::Transfer& transfer,
                      const HostState& server_host);
  // The size the server's daemon sums round `round` against: the one it
  // opened with (RoundState::size), not the batch's, should the job's
  // membership have changed since; 0 for a batch of no rounds.
  int32_t AnnouncedRoundSize(int64_t round) const;
  // Sends the update to its first aggregator: `hop`, or (a streaming
  // chain's member at the host its partial sum passes) its own host.
  void DispatchViaAggregator(UpdateRecord& record, const core::Transfer* hop,
                             uint64_t aggregate_id, double aggregate_end_s);
  // Opens the aggregate the first time one of its constituents comes up in
  // the commit order; returns its id, or 0 when it cannot be carried out.
  // `chain`: a streaming chain's hops before `transfer`, upstream first
  // (empty for Alg. 3's aggregates).
  uint64_t OpenAggregate(const core::Transfer& transfer,
                         const std::vector<const core::Transfer*>& chain,
                         const HostState& server_host);
  // At the server: what its daemon expects of the aggregate (`first`: its
  // first constituent's push).
  void ExpectAggregate(const core::Transfer& transfer, const AggregateRecord& aggregate,
                       const UpdateRecord& first);
  // The aggregate's tasks: one per hop of `chain`, upstream first, each
  // recorded in `aggregate`, and the last, `transfer`, to the server.
  void SendAggregateTasks(const core::Transfer& transfer,
                          const std::vector<const core::Transfer*>& chain,
                          const HostState& server_host, const UpdateRecord& first,
                          AggregateRecord* aggregate);
  // The constituents of `transfer` still in flight, as transfer ids.
  std::vector<uint64_t> LiveConstituents(const core::Transfer& transfer) const;
  // A server group's batch (server_groups.h): each push's parts, one per
  // shard, held at the shards under the push's group sequence number.
  void DispatchGroup(const core::Plan& plan);
  // For a push of a group batch: each shard's part (the plan's transfer,
  // from `unused`, to the shard's host of the shard's size) and that host.
  // Returns why the push cannot go, or "" when every shard has its part.
  std::string MatchGroupParts(std::vector<const core::Transfer*> unused,
                              std::vector<const core::Transfer*>* parts,
                              std::vector<const HostState*>* hosts);
  // Sends a group push's `parts` to the shards' `hosts`, held there under
  // the push's group sequence number.
  void DispatchGroupPush(uint64_t id, UpdateRecord& record,
                         const std::vector<const core::Transfer*>& parts,
                         const std::vector<const HostState*>& hosts);
  // One of a group batch's aggregates: `sums` (one per shard, from one
  // aggregator) of the pushes they name, whose parts go there as `feeds`.
  void DispatchGroupAggregate(
      const std::vector<const core::Transfer*>& sums,
      const std::map<std::string, std::vector<const core::Transfer*>>& feeds);
  // The plan's transfers for one group aggregate: per shard, its sum (from
  // the aggregator) and the shard's host; per member, its parts on their
  // way to the aggregator, part i for shard i.
  struct GroupAggregateParts {
    std::vector<const core::Transfer*> sum_of;
    std::vector<const HostState*> hosts;
    std::vector<std::vector<const core::Transfer*>> part_of;
  };
  // Finds them, in the plan's order, for the live `members`; returns why
  // the aggregate cannot go, or "" when every shard has its sum and parts.
  std::string MatchGroupAggregate(
      const std::vector<const core::Transfer*>& sums,
      const std::map<std::string, std::vector<const core::Transfer*>>& feeds,
      const std::vector<uint64_t>& members, GroupAggregateParts* out);
  // Each shard's sum: expected at the shard (held under the group's
  // sequence number) and summed at the aggregator from the `feed` ids.
  void SendGroupSums(uint64_t id, const GroupAggregateParts& parts,
                     const std::vector<std::vector<uint64_t>>& feed, double deadline_s,
                     const GroupPush* group);
  // Each member's parts, sent to the aggregator as feed[m][i]; the member
  // is in flight in aggregate `id`.
  void SendGroupFeeds(uint64_t id, const GroupAggregateParts& parts,
                      const std::vector<std::vector<uint64_t>>& feed, const HostState& aggregator,
                      double end_s, double deadline_s, const GroupPush* group);
  // §5.3: sends the plan's replica copies and marks the punted ones.
  void DispatchReplica(const core::Plan& plan);
  // One of the replica's aggregates: copies sent to the aggregator, summed
  // there, delivered at the replica as one (their pushes in order).
  void DispatchReplicaAggregate(const core::Transfer& aggregate,
                                const std::map<std::string, const core::Transfer*>& feeds,
                                const std::string& replica_name, const HostState& replica_host);
  // A member of a replica aggregate: a punted copy (its push applied) or a
  // copy of this batch's push (in flight: the aggregate is held at the
  // replica until every one of them applied, and cancelled as soon as one
  // does not), with the plan's transfer that feeds it to the aggregator.
  struct ReplicaMember {
    PendingReplica what;
    const core::Transfer* feed;
    bool in_flight;
  };
  // The aggregate's members that can still go, in its order. A punted copy
  // the plan gives no feed waits for the next batch.
  std::vector<ReplicaMember> ReplicaMembers(
      const core::Transfer& aggregate, const std::map<std::string, const core::Transfer*>& feeds);
  // Removes and returns push `source`'s punted copy (nullopt: none).
  std::optional<PendingReplica> TakePunted(uint64_t source);
  // What the replica's daemon expects of copy `copy` at the replica's next
  // position (advances it).
  commands::Expect ReplicaExpect(uint64_t copy, const std::string& src_host,
                                 const PendingReplica& what);
  void FailAll(const std::set<uint64_t>& ids, const std::string& reason);
  // What `server`'s daemon expects of push `record` at its commit position:
  // transfer `transfer_id` of `bytes` bytes (the push, or a group's part).
  commands::Expect PushExpect(const UpdateRecord& record, uint64_t transfer_id,
                              const std::string& server, int64_t bytes) const;

  const SchedulerConfig& config_;
  ClusterState& state_;
  const BatchWork& work_;
  JobState& job_;
  ServerState& server_;
  BatchView view_;
  std::map<const core::Transfer*, uint64_t> aggregate_ids_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_PLAN_DISPATCHER_RUN_H_
