#include "scheduler/service/aggregate_ledger.h"

#include <utility>

namespace mlfabric {

AggregateRecord& AggregateLedger::Open(uint64_t id) {
  AggregateRecord& aggregate = aggregates_[id];
  aggregate.id = id;
  return aggregate;
}

void AggregateLedger::AddHop(uint64_t aggregate_id, AggregateRecord::Hop hop) {
  AggregateRecord* aggregate = Find(aggregate_id);
  if (aggregate == nullptr) return;
  hop_to_aggregate_[hop.id] = aggregate_id;
  aggregate->hops.push_back(std::move(hop));
}

std::optional<uint64_t> AggregateLedger::AggregateOfHop(uint64_t hop_id) const {
  auto it = hop_to_aggregate_.find(hop_id);
  if (it == hop_to_aggregate_.end()) return std::nullopt;
  return it->second;
}

void AggregateLedger::ForgetHops(uint64_t id) {
  if (const AggregateRecord* aggregate = Find(id)) {
    for (const AggregateRecord::Hop& hop : aggregate->hops) hop_to_aggregate_.erase(hop.id);
  }
}

std::optional<AggregateRecord> AggregateLedger::Take(uint64_t id) {
  auto it = aggregates_.find(id);
  if (it == aggregates_.end()) return std::nullopt;
  ForgetHops(id);
  AggregateRecord taken = std::move(it->second);
  aggregates_.erase(it);
  return taken;
}

std::vector<uint64_t> AggregateLedger::Select(
    absl::FunctionRef<bool(const AggregateRecord&)> pred) const {
  std::vector<uint64_t> ids;
  for (const auto& [id, aggregate] : aggregates_) {
    if (pred(aggregate)) ids.push_back(id);
  }
  return ids;
}

void AggregateLedger::ForEach(absl::FunctionRef<void(const AggregateRecord&)> visit) const {
  for (const auto& [id, aggregate] : aggregates_) visit(aggregate);
}

}  // namespace mlfabric
