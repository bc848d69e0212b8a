#include "scheduler/service/replica_ledger.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace mlfabric {

ReplicaCopy& ReplicaLedger::AddCopy(uint64_t copy_id, ReplicaCopy copy) {
  return copies_.insert_or_assign(copy_id, std::move(copy)).first->second;
}

std::optional<ReplicaCopy> ReplicaLedger::TakeCopy(uint64_t copy_id) {
  auto it = copies_.find(copy_id);
  if (it == copies_.end()) return std::nullopt;
  ReplicaCopy copy = std::move(it->second);
  copies_.erase(it);
  // Its feeds report only when they fail, and then name this copy: with it
  // gone, a late report is no longer a replica transfer.
  for (auto feed = feeds_.begin(); feed != feeds_.end();) {
    feed = feed->second == copy_id ? feeds_.erase(feed) : std::next(feed);
  }
  return copy;
}

std::vector<uint64_t> ReplicaLedger::CopiesOf(uint64_t push) const {
  std::vector<uint64_t> ids;
  for (const auto& [copy_id, copy] : copies_) {
    if (copy.source == push) ids.push_back(copy_id);
  }
  return ids;
}

bool ReplicaLedger::CarriesPush(uint64_t push) const {
  return std::any_of(copies_.begin(), copies_.end(), [&](const auto& entry) {
    const std::vector<uint64_t>& in = entry.second.constituents;
    return entry.second.source == push || std::find(in.begin(), in.end(), push) != in.end();
  });
}

void ReplicaLedger::ForEachCopy(
    absl::FunctionRef<void(uint64_t copy_id, ReplicaCopy& copy)> visit) {
  for (auto& [copy_id, copy] : copies_) visit(copy_id, copy);
}

void ReplicaLedger::ForEachCopy(
    absl::FunctionRef<void(uint64_t copy_id, const ReplicaCopy& copy)> visit) const {
  for (const auto& [copy_id, copy] : copies_) visit(copy_id, copy);
}

void ReplicaLedger::AddFeed(uint64_t feed_id, uint64_t aggregate_id) {
  feeds_[feed_id] = aggregate_id;
}

std::optional<uint64_t> ReplicaLedger::AggregateFed(uint64_t feed_id) const {
  auto feed = feeds_.find(feed_id);
  if (feed == feeds_.end()) return std::nullopt;
  return feed->second;
}

void ReplicaLedger::AddDecidedByCopy(uint64_t copy_id, UpdateRecord push) {
  decided_by_copy_.emplace(copy_id, std::move(push));
}

std::vector<UpdateRecord> ReplicaLedger::TakeDecidedBy(uint64_t copy_id) {
  auto [decided, decided_end] = decided_by_copy_.equal_range(copy_id);
  std::vector<UpdateRecord> records;
  for (auto d = decided; d != decided_end; ++d) records.push_back(std::move(d->second));
  decided_by_copy_.erase(decided, decided_end);
  return records;
}

void ReplicaLedger::AddSnapshot(uint64_t transfer_id, ReplicaSnapshot snapshot) {
  snapshots_[transfer_id] = std::move(snapshot);
}

std::optional<ReplicaSnapshot> ReplicaLedger::TakeSnapshot(uint64_t transfer_id) {
  auto it = snapshots_.find(transfer_id);
  if (it == snapshots_.end()) return std::nullopt;
  ReplicaSnapshot snapshot = std::move(it->second);
  snapshots_.erase(it);
  return snapshot;
}

}  // namespace mlfabric
