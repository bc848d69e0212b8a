#include "scheduler/service/outcome_queries.h"

#include <algorithm>

namespace mlfabric {

std::vector<v1::PushState> PushStates(const ClusterState& state, const std::string& job,
                                      const std::string& worker,
                                      const std::vector<uint64_t>& uids) {
  std::vector<v1::PushState> states;
  states.reserve(uids.size());
  for (uint64_t uid : uids) {
    v1::PushState& push = states.emplace_back();
    push.set_push_uid(uid);
    push.set_state(v1::PushState::STATE_UNKNOWN);
    const OutcomeLog::PushUid* named = state.outcomes().FindUid(uid);
    // Another job's or worker's push is none of this worker's business.
    if (named == nullptr || named->job != job || named->worker != worker) continue;
    const uint64_t transfer = named->transfer_id;
    push.set_transfer_id(transfer);
    if (const RecentOutcome* ended = state.outcomes().Find(transfer)) {
      push.set_state(v1::PushState::STATE_ENDED);
      push.set_outcome(ended->outcome);
      push.set_reason(ended->reason);
      push.set_applied_version(ended->applied_version);
      push.set_delay(ended->delay);
    } else if (state.pushes().count(transfer) > 0 || state.restart().IsInDoubt(transfer)) {
      push.set_state(v1::PushState::STATE_IN_FLIGHT);
    }
  }
  return states;
}

bool AnyInFlight(const std::vector<v1::PushState>& states) {
  return std::any_of(states.begin(), states.end(), [](const v1::PushState& push) {
    return push.state() == v1::PushState::STATE_IN_FLIGHT;
  });
}

}  // namespace mlfabric
