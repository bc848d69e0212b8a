#include "scheduler/service/outcome_log.h"

#include <utility>

#include "common/map_util.h"

namespace mlfabric {
namespace {

// Inserts `value` at `key` unless the key is there, and forgets the oldest
// keys beyond `limit`.
template <typename Value>
void KeepFirst(std::map<uint64_t, Value>* entries, std::deque<uint64_t>* order, size_t limit,
               uint64_t key, Value value) {
  if (!entries->emplace(key, std::move(value)).second) return;
  order->push_back(key);
  while (order->size() > limit) {
    entries->erase(order->front());
    order->pop_front();
  }
}

}  // namespace

void OutcomeLog::Remember(uint64_t transfer_id, RecentOutcome outcome) {
  KeepFirst(&outcomes_, &outcome_order_, kRecentOutcomes, transfer_id, std::move(outcome));
}

const RecentOutcome* OutcomeLog::Find(uint64_t transfer_id) const {
  return FindOrNull(outcomes_, transfer_id);
}

void OutcomeLog::RememberUid(uint64_t uid, uint64_t transfer_id, const std::string& job,
                             const std::string& worker) {
  if (uid == 0) return;
  KeepFirst(&uids_, &uid_order_, kPushUids, uid, PushUid{transfer_id, job, worker});
}

const OutcomeLog::PushUid* OutcomeLog::FindUid(uint64_t uid) const {
  return FindOrNull(uids_, uid);
}

}  // namespace mlfabric
