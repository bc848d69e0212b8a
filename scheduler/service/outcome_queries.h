// How pushes ended, by their application's id: a worker
// application whose daemon died with pushes in flight connects to the
// daemon that replaced it and asks, through it, how each push ended
// (QueryOutcomesRequest; api/mlfabric.h, WorkerOptions::reconnect_s). The
// outcome was decided here as usual; only its way back to the application
// was lost with the daemon.
//
//   std::vector<v1::PushState> states = PushStates(state, "demo", "w1", {uid1, uid2});
//   if (AnyInFlight(states)) ... wait and ask again ...
//
// A uid is known for the last OutcomeLog::kPushUids pushes submitted (or
// reported in doubt by a daemon to a restarted scheduler) and only to the
// job and worker that submitted it. Ended: the outcome the push's source
// was sent. In flight: still planned, moving, awaiting its server, or in
// doubt after a scheduler restart. Unknown: never submitted here (its
// submission died with the daemon), or submitted to a scheduler that
// restarted since and ended it, or forgotten.
//
// Pure: reads the cluster state; the caller holds the scheduler's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_OUTCOME_QUERIES_H_
#define MLFABRIC_SCHEDULER_SERVICE_OUTCOME_QUERIES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/scheduler.pb.h"
#include "scheduler/service/cluster_state.h"

namespace mlfabric {

// The most uids one query may name.
inline constexpr size_t kMaxOutcomeQueryPushes = 65536;
// The longest a query waits for pushes in flight.
inline constexpr double kMaxOutcomeQueryWaitS = 60;

// The state of each push, in the order of `uids`.
std::vector<v1::PushState> PushStates(const ClusterState& state, const std::string& job,
                                      const std::string& worker,
                                      const std::vector<uint64_t>& uids);
bool AnyInFlight(const std::vector<v1::PushState>& states);

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_OUTCOME_QUERIES_H_
