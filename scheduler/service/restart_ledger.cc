#include "scheduler/service/restart_ledger.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace mlfabric {
namespace {

// Erases the entries of `map` that `erase` returns true for, in key order.
template <typename Map, typename Pred>
void EraseIf(Map* map, Pred erase) {
  for (auto it = map->begin(); it != map->end();) {
    it = erase(*it) ? map->erase(it) : std::next(it);
  }
}

}  // namespace

void RestartLedger::AddInDoubt(InDoubtPush push) {
  const uint64_t id = push.transfer_id;
  in_doubt_[id] = std::move(push);
}

bool RestartLedger::IsInDoubt(uint64_t push) const { return in_doubt_.count(push) > 0; }

void RestartLedger::EraseInDoubtIf(absl::FunctionRef<bool(const InDoubtPush&)> ended) {
  EraseIf(&in_doubt_, [&](const auto& entry) { return ended(entry.second); });
}

void RestartLedger::MarkAppliedElsewhere(uint64_t push, int64_t version, double now_s) {
  delivering_.erase(push);
  applied_elsewhere_[push] = {version, now_s};
}

std::optional<int64_t> RestartLedger::AppliedVersion(uint64_t push) const {
  auto applied = applied_elsewhere_.find(push);
  if (applied == applied_elsewhere_.end()) return std::nullopt;
  return applied->second.version;
}

void RestartLedger::MarkDelivering(uint64_t push) {
  if (applied_elsewhere_.count(push) == 0) delivering_.insert(push);
}

bool RestartLedger::IsDelivering(uint64_t push) const { return delivering_.count(push) > 0; }

void RestartLedger::MarkAtReplica(uint64_t push, double now_s) { at_replicas_[push] = now_s; }

bool RestartLedger::IsAtReplica(uint64_t push) const { return at_replicas_.count(push) > 0; }

void RestartLedger::KeepAtReplica(uint64_t copy_id, HeldAtReplica held) {
  held_at_replicas_[copy_id] = std::move(held);
}

RestartLedger::KeptCopies RestartLedger::KeptCopiesOf(uint64_t push) const {
  KeptCopies kept;
  for (const auto& [copy_id, at] : held_at_replicas_) {
    const auto& in = at.copy.constituents();
    if (at.copy.source_transfer_id() != push &&
        std::find(in.begin(), in.end(), push) == in.end()) {
      continue;
    }
    (at.incomplete ? kept.incomplete : kept.whole) = true;
  }
  return kept;
}

void RestartLedger::EraseHeldAtReplicaIf(
    absl::FunctionRef<bool(uint64_t copy_id, const HeldAtReplica&)> settled) {
  EraseIf(&held_at_replicas_,
          [&](const auto& entry) { return settled(entry.first, entry.second); });
}

bool RestartLedger::WasRecopiedFromSource(uint64_t push) const {
  return recopied_from_source_.count(push) > 0;
}

void RestartLedger::HoldAtSource(uint64_t push, HeldAtSource held) {
  HeldAtSource& entry = held_at_sources_[push];
  const bool from_doubt = entry.from_doubt || held.from_doubt;
  entry = std::move(held);
  entry.from_doubt = from_doubt;
}

bool RestartLedger::IsHeldAtSource(uint64_t push) const {
  return held_at_sources_.count(push) > 0;
}

void RestartLedger::EraseHeldAtSourceIf(
    absl::FunctionRef<bool(uint64_t push, const HeldAtSource&)> settled) {
  EraseIf(&held_at_sources_,
          [&](const auto& entry) { return settled(entry.first, entry.second); });
}

void RestartLedger::Prune(double now_s, double keep_s) {
  EraseIf(&applied_elsewhere_,
          [&](const auto& entry) { return now_s - entry.second.heard_s > keep_s; });
  EraseIf(&at_replicas_, [&](const auto& entry) { return now_s - entry.second > keep_s; });
  // The marks only keep the settling of kept copies from counting a
  // recopied push missed (in_doubt.cc CountMissed): with no kept copy
  // left, they have done their work.
  if (held_at_replicas_.empty()) recopied_from_source_.clear();
}

}  // namespace mlfabric
