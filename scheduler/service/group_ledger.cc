#include "scheduler/service/group_ledger.h"

#include <utility>

namespace mlfabric {

GroupPush& GroupLedger::Open(uint64_t id) { return pushes_[id]; }

GroupPart& GroupLedger::AddPart(uint64_t push_id, GroupPart part) {
  parts_[part.id] = push_id;
  std::vector<GroupPart>& parts = pushes_[push_id].parts;
  parts.push_back(std::move(part));
  return parts.back();
}

void GroupLedger::AddFeed(uint64_t aggregate_id, TransferView feed) {
  feeds_[feed.transfer_id] = aggregate_id;
  pushes_[aggregate_id].feeds.push_back(std::move(feed));
}

bool GroupLedger::IsAggregate(uint64_t id) const {
  const GroupPush* push = Find(id);
  return push != nullptr && !push->constituents.empty();
}

GroupLedger::PartOf GroupLedger::FindPart(uint64_t part_id) {
  PartOf found;
  auto owner = parts_.find(part_id);
  if (owner == parts_.end()) return found;
  GroupPush* push = Find(owner->second);
  if (push == nullptr) return found;
  for (GroupPart& p : push->parts) {
    if (p.id == part_id) found.part = &p;
  }
  // Indexed but not among its entry's parts: treated as unknown.
  if (found.part == nullptr) return found;
  found.push_id = owner->second;
  found.push = push;
  return found;
}

std::optional<uint64_t> GroupLedger::AggregateFed(uint64_t feed_id) const {
  auto feed = feeds_.find(feed_id);
  if (feed == feeds_.end()) return std::nullopt;
  return feed->second;
}

bool GroupLedger::IsPartOrFeed(uint64_t transfer_id) const {
  return parts_.count(transfer_id) != 0 || feeds_.count(transfer_id) != 0;
}

std::vector<uint64_t> GroupLedger::AggregatesUnreleasedAt(const std::string& host) const {
  std::vector<uint64_t> ids;
  for (const auto& [id, group] : pushes_) {
    if (!group.constituents.empty() && !group.released && group.aggregator == host) {
      ids.push_back(id);
    }
  }
  return ids;
}

std::optional<GroupPush> GroupLedger::Take(uint64_t id) {
  auto it = pushes_.find(id);
  if (it == pushes_.end()) return std::nullopt;
  GroupPush push = std::move(it->second);
  pushes_.erase(it);
  for (const GroupPart& part : push.parts) parts_.erase(part.id);
  for (const TransferView& feed : push.feeds) feeds_.erase(feed.transfer_id);
  return push;
}

void GroupLedger::ForEach(
    absl::FunctionRef<void(uint64_t id, const GroupPush& push)> visit) const {
  for (const auto& [id, push] : pushes_) visit(id, push);
}

}  // namespace mlfabric
