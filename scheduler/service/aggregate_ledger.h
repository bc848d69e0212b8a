// AggregateLedger: the in-network aggregates in flight (§5.2), and the index
// from each hop of a streaming chain back to the aggregate it feeds.
//
// An aggregate is planned as one record: its constituents are summed at
// `host` and delivered to the server as one transfer. A streaming chain's
// aggregate also has hops, partial sums that stream from aggregator to
// aggregator, each its own transfer; a daemon reports a hop's failure by
// the hop's transfer id only. Adding hops through the ledger, and taking an
// aggregate out whole (Take), keeps the hop index and the records
// consistent: no hop is left naming an aggregate that is gone.
//
//   AggregateLedger aggregates;
//   AggregateRecord& aggregate = aggregates.Open(id);    // DispatchAggregate
//   aggregates.AddHop(id, std::move(hop));
//   std::optional<uint64_t> fed = aggregates.AggregateOfHop(hop_id);  // a report
//   if (std::optional<AggregateRecord> done = aggregates.Take(id)) ...
//
// How an aggregate ends (its constituents' outcomes, cancellation at the
// server) is not the ledger's: ClusterState decides, and uses it to find
// and forget.
//
// Thread safety: none; ClusterState owns one, used under the scheduler
// service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_AGGREGATE_LEDGER_H_
#define MLFABRIC_SCHEDULER_SERVICE_AGGREGATE_LEDGER_H_

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

// An in-network aggregate (§5.2): its constituents go to `host`, which sums
// them and sends one transfer to the server, delivered at one sequence
// number and applied as constituents.size() updates. A streaming chain's
// aggregate (core/aggregation.h) also has `hops`: the partial sums that
// stream from aggregator to aggregator before `host` (their transfer ids,
// hosts and schedules), each one an aggregation at its host too.
struct AggregateRecord {
  struct Hop {
    uint64_t id = 0;
    std::string host;      // where this partial sum is summed and sent from
    TransferView planned;  // host -> the next aggregator
  };
  uint64_t id = 0;
  std::string job;
  std::string server;
  std::string host;                    // the aggregator
  std::vector<uint64_t> constituents;  // in commit order
  uint64_t sequence = 0;
  TransferView planned;  // aggregator -> server
  std::vector<Hop> hops;  // upstream first
  // It fails with this reason once the server's daemon confirms it skipped
  // its commit position (FailAggregateWhenCancelled), or is applied.
  std::string cancel_pending;
  double cancel_deadline_s = 0;
};

class AggregateLedger {
 public:
  // A new aggregate under transfer id `id` (ids are never reused), for the
  // dispatcher to fill in.
  AggregateRecord& Open(uint64_t id);
  AggregateRecord* Find(uint64_t id) { return FindOrNull(aggregates_, id); }
  const AggregateRecord* Find(uint64_t id) const { return FindOrNull(aggregates_, id); }
  // Appends `hop` to aggregate `aggregate_id`'s chain and indexes it. No-op
  // for an aggregate that is not in the ledger.
  void AddHop(uint64_t aggregate_id, AggregateRecord::Hop hop);
  // The aggregate that hop `hop_id` feeds, if it is a hop in flight.
  std::optional<uint64_t> AggregateOfHop(uint64_t hop_id) const;
  // Aggregate `id`'s hops are done (its sum reached the server): their
  // reports no longer name it. The record stays until Take.
  void ForgetHops(uint64_t id);
  // Takes aggregate `id` out, with its hops' index; nullopt if it is gone.
  std::optional<AggregateRecord> Take(uint64_t id);

  // The aggregates for which `pred` holds, by id: to act on them after the
  // walk (acting may end aggregates, so not during it).
  std::vector<uint64_t> Select(absl::FunctionRef<bool(const AggregateRecord&)> pred) const;
  void ForEach(absl::FunctionRef<void(const AggregateRecord&)> visit) const;
  size_t size() const { return aggregates_.size(); }
  size_t hops() const { return hop_to_aggregate_.size(); }

 private:
  std::map<uint64_t, AggregateRecord> aggregates_;
  std::map<uint64_t, uint64_t> hop_to_aggregate_;  // chain hop id -> aggregate id
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_AGGREGATE_LEDGER_H_
