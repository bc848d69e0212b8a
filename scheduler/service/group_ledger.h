// GroupLedger: the pushes to server groups in flight (server_groups.h), and
// the index from each of their transfers back to the push they carry.
//
// A group push is one entry with one part per shard, each its own transfer;
// a group aggregate is one entry under an id of its own, whose parts are the
// aggregator's sums and whose feeds are the constituents' parts on their way
// to the aggregator. A daemon reports on a part or a feed by its transfer id
// only, so the ledger keeps, beside the entries, which entry each part and
// feed belongs to. Adding parts and feeds through the ledger, and taking an
// entry out whole (Take), keeps that index and the entries consistent: no
// part or feed is left naming an entry that is gone.
//
//   GroupLedger groups;
//   groups.AddPart(push_id, std::move(part));          // DispatchGroupPush
//   GroupPush& group = groups.Open(aggregate_id);      // DispatchGroupAggregate
//   groups.AddFeed(aggregate_id, feed);
//   GroupLedger::PartOf owner = groups.FindPart(id);   // a part's report
//   if (std::optional<GroupPush> done = groups.Take(push_id)) ...
//
// How a group push ends (outcomes, cancellations at the shards) is not the
// ledger's: ClusterState and server_groups.cc decide, and use it to find
// and forget.
//
// Thread safety: none; ClusterState owns one, used under the scheduler
// service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_GROUP_LEDGER_H_
#define MLFABRIC_SCHEDULER_SERVICE_GROUP_LEDGER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/map_util.h"
#include "absl/functional/function_ref.h"
#include "scheduler/service/snapshot.h"

namespace mlfabric {

// A push to a server group in flight (server_groups.h): one part per
// shard, each its own transfer, held at its shard until every part is in.
struct GroupPart {
  uint64_t id = 0;     // the part's transfer id
  std::string server;  // the shard
  std::string host;
  int64_t begin = 0;   // bytes [begin, end) of the push
  int64_t end = 0;
  bool ready = false;    // all its bytes are at the shard's daemon
  bool applied = false;
  int64_t version = 0;   // the shard's model version after applying it
  TransferView planned;  // source -> the shard's host
};
struct GroupPush {
  std::vector<GroupPart> parts;
  bool released = false;  // every part was ready: the shards may apply it
  // A group aggregate (server_groups.h; §5.2 with §10.2): under an id of
  // its own, the pushes `constituents` (commit order) summed at
  // `aggregator`; each part is that sum's bytes for one shard, and
  // `feeds` are the constituents' parts on their way to the aggregator.
  // Empty `constituents`: the entry is a push's own (keyed by the push).
  std::vector<uint64_t> constituents;
  std::string aggregator;
  uint64_t sequence = 0;  // the group's commit position
  std::vector<TransferView> feeds;
};

class GroupLedger {
 public:
  // Entry `id` (a push's id, or a group aggregate's own), created empty if
  // it is not in flight yet.
  GroupPush& Open(uint64_t id);
  // Appends `part` to entry `push_id` (opened if new) and indexes its
  // transfer id; returns the part as stored.
  GroupPart& AddPart(uint64_t push_id, GroupPart part);
  // Appends `feed` (a constituent's part on its way to the aggregator) to
  // group aggregate `aggregate_id` (opened if new) and indexes its transfer.
  void AddFeed(uint64_t aggregate_id, TransferView feed);

  // Entry `id`, or nullptr if it is not in flight.
  GroupPush* Find(uint64_t id) { return FindOrNull(pushes_, id); }
  const GroupPush* Find(uint64_t id) const { return FindOrNull(pushes_, id); }
  bool Contains(uint64_t id) const { return pushes_.count(id) != 0; }
  // Whether `id` is a group aggregate's entry (GroupPush::constituents).
  bool IsAggregate(uint64_t id) const;

  // The entry that part `part_id` belongs to, its id and the part itself;
  // `push` is nullptr when no entry in flight has that part.
  struct PartOf {
    uint64_t push_id = 0;
    GroupPush* push = nullptr;
    GroupPart* part = nullptr;
  };
  PartOf FindPart(uint64_t part_id);
  // The group aggregate that feed `feed_id` goes to, if it is a feed (its
  // aggregate may be gone already).
  std::optional<uint64_t> AggregateFed(uint64_t feed_id) const;
  // Whether transfer `transfer_id` is a part or a feed of an entry here: a
  // daemon's report on it is server_groups.h's to handle.
  bool IsPartOrFeed(uint64_t transfer_id) const;
  // The group aggregates summed at `host` whose sums are not all out yet
  // (not released): they cannot complete without it.
  std::vector<uint64_t> AggregatesUnreleasedAt(const std::string& host) const;

  // Takes entry `id` out, with the index of its parts and feeds; nullopt
  // if it is not in flight.
  std::optional<GroupPush> Take(uint64_t id);

  // Calls `visit` for every entry, by id. `visit` must not add or take
  // entries.
  void ForEach(absl::FunctionRef<void(uint64_t id, const GroupPush& push)> visit) const;
  // Entries in flight.
  size_t size() const { return pushes_.size(); }
  // Nothing in flight: no entry, and no part or feed indexed.
  bool empty() const { return pushes_.empty() && parts_.empty() && feeds_.empty(); }

 private:
  std::map<uint64_t, GroupPush> pushes_;  // by push id (or group aggregate id)
  std::map<uint64_t, uint64_t> parts_;    // part transfer id -> push id
  std::map<uint64_t, uint64_t> feeds_;    // part to an aggregator -> group aggregate
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_GROUP_LEDGER_H_
