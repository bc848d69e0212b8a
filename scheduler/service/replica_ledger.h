// ReplicaLedger: the hot-standby replicas' transfers in flight (§5.3):
// replica copies (a push's bytes, or a sum of several, on their way to a
// server's replica), the feeds of replica aggregates, the pushes whose
// outcome waits for their copy after a failover (failover.h), and the
// model snapshots moving to new replicas (replica_sync.h).
//
// A daemon reports on a feed by its transfer id only, so the ledger keeps
// which aggregate copy each feed goes to, and forgets a copy's feeds with
// it (TakeCopy). Pushes decided by a copy are out of ClusterState::pushes(),
// so that nothing else ends them first; they are kept here by copy id
// until the copy ends (an aggregate copy decides all its pushes in flight).
//
//   ReplicaLedger replicas;
//   replicas.AddCopy(copy_id, ReplicaCopy{job, server, push, src, replica, seq});
//   if (std::optional<ReplicaCopy> copy = replicas.TakeCopy(copy_id)) {
//     for (UpdateRecord& push : replicas.TakeDecidedBy(copy_id)) ...
//   }
//
// What a copy's end means (the replica's counts, outcomes, cancellations)
// is ClusterState's (EndReplicaCopy); the ledger only finds and forgets.
//
// Thread safety: none; ClusterState owns one, used under the scheduler
// service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_REPLICA_LEDGER_H_
#define MLFABRIC_SCHEDULER_SERVICE_REPLICA_LEDGER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/map_util.h"
#include "absl/functional/function_ref.h"
#include "scheduler/core/types.h"
#include "scheduler/service/update_record.h"

namespace mlfabric {

// A replica copy in flight: push `source`'s bytes from `src_host` to the
// replica, delivered there at `sequence`.
struct ReplicaCopy {
  std::string job;
  std::string server;
  uint64_t source = 0;
  std::string src_host;
  std::string replica_host;
  uint64_t sequence = 0;
  // Still moving when its replica became the server (failover.h): its
  // source's update is in the old server's model, so losing the copy loses
  // the update (counted in the job's last failover).
  bool failover = false;
  // Announced to the promoted replica's daemon under the server's own name
  // (sent after the promotion), not "replica:<server>".
  bool to_promoted = false;
  // Sent alongside its push, before the server applied it: the replica's
  // daemon holds it until Complete releases it (the push applied) or
  // cancels it (the push failed), or the replica is promoted.
  bool held = false;
  // Its source's host went down while it was held: released only if its
  // bytes are all in at the replica (ReleaseDelivery.cancel_if_incomplete).
  bool source_down = false;
  // An aggregate of copies (§5.3 with the replica's aggregators): the
  // pushes summed into it, in commit order, and the hosts that send them
  // to the aggregator (`src_host`), each as its own transfer
  // (ReplicaLedger::AddFeed). `source` is 0. It is `held` while some
  // of its pushes are still in flight (`unsettled`): released once all
  // applied, cancelled as soon as one does not (the others' copies are
  // then sent again, or counted missed). `applied_members`: the pushes
  // known applied at the server, with their norms.
  std::vector<uint64_t> constituents;
  std::vector<double> norms;  // per constituent
  std::vector<std::string> feeders;
  std::set<uint64_t> unsettled;
  std::map<uint64_t, double> applied_members;
  // Its planned transfers (a direct copy's one; an aggregate's feeds and
  // the aggregate), reserved on their links while it lasts, as a push's
  // are (ClusterState::Reservations): the next batches plan around them.
  struct Leg {
    std::string src, dst;
    std::vector<core::RateSegment> segments;
  };
  std::vector<Leg> legs;
  // The updates it carries.
  int64_t Updates() const {
    return constituents.empty() ? 1 : static_cast<int64_t>(constituents.size());
  }
};

// A model snapshot moving to a new replica (replica_sync.h): of server
// `server` of job `job`.
struct ReplicaSnapshot {
  std::string job;
  std::string server;
};

class ReplicaLedger {
 public:
  // Replica copies, by copy transfer id.
  //
  // Records copy `copy_id` (replacing one of that id); returns it as stored.
  ReplicaCopy& AddCopy(uint64_t copy_id, ReplicaCopy copy);
  // Copy `copy_id`, or nullptr if it is not in flight.
  ReplicaCopy* FindCopy(uint64_t copy_id) { return FindOrNull(copies_, copy_id); }
  const ReplicaCopy* FindCopy(uint64_t copy_id) const { return FindOrNull(copies_, copy_id); }
  bool HasCopy(uint64_t copy_id) const { return copies_.count(copy_id) != 0; }
  // Takes copy `copy_id` out, with the feeds that go to it; nullopt if it
  // is not in flight. The pushes it decides stay (TakeDecidedBy).
  std::optional<ReplicaCopy> TakeCopy(uint64_t copy_id);
  // The direct copies (not aggregates) of push `push`, by id.
  std::vector<uint64_t> CopiesOf(uint64_t push) const;
  // Whether some copy in flight carries push `push`'s update, directly or
  // summed in an aggregate.
  bool CarriesPush(uint64_t push) const;
  // Calls `visit` for every copy, by id. `visit` may change the copy but
  // must not add or take copies (collect ids, act after).
  void ForEachCopy(absl::FunctionRef<void(uint64_t copy_id, ReplicaCopy& copy)> visit);
  void ForEachCopy(
      absl::FunctionRef<void(uint64_t copy_id, const ReplicaCopy& copy)> visit) const;
  size_t copy_count() const { return copies_.size(); }

  // Feeds: a punted copy's transfer to its aggregator, feeding aggregate
  // copy `aggregate_id` (which may be recorded after its feeds).
  void AddFeed(uint64_t feed_id, uint64_t aggregate_id);
  // The aggregate copy that feed `feed_id` goes to, if it is a feed.
  std::optional<uint64_t> AggregateFed(uint64_t feed_id) const;
  size_t feed_count() const { return feeds_.size(); }

  // Pushes in flight to a server that failed over whose fate is their
  // replica copy's (failover.h): applied if the copy is, failed if not.
  //
  // Push `push` ends as copy `copy_id` does.
  void AddDecidedByCopy(uint64_t copy_id, UpdateRecord push);
  // Takes out the pushes that copy `copy_id` decides, in the order added.
  std::vector<UpdateRecord> TakeDecidedBy(uint64_t copy_id);
  size_t CountDecidedBy(uint64_t copy_id) const { return decided_by_copy_.count(copy_id); }
  size_t decided_count() const { return decided_by_copy_.size(); }

  // Replica snapshots moving (replica_sync.h), by transfer id.
  void AddSnapshot(uint64_t transfer_id, ReplicaSnapshot snapshot);
  // Takes snapshot `transfer_id` out; nullopt if it is not moving.
  std::optional<ReplicaSnapshot> TakeSnapshot(uint64_t transfer_id);
  size_t snapshot_count() const { return snapshots_.size(); }

 private:
  std::map<uint64_t, ReplicaCopy> copies_;  // by copy transfer id
  // A punted copy's transfer to its aggregator -> the replica aggregate it
  // feeds (a key of copies_).
  std::map<uint64_t, uint64_t> feeds_;
  // By copy id (an aggregate copy decides all its pushes in flight).
  std::multimap<uint64_t, UpdateRecord> decided_by_copy_;
  std::map<uint64_t, ReplicaSnapshot> snapshots_;  // transfer id -> its server
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_REPLICA_LEDGER_H_
