// Synchronous rounds (Mercury PS, mercury.md §IV Key idea 3; mlfabric.md §6):
// a server registered with round_size M > 0 (or any server of a sync-mode
// job, with M = the job's registered workers) sums round v, the M pushes
// computed from model version v, one per worker, at its daemon. A push that
// cannot belong to the open round is dropped or failed here with the reason
// (stale, future, duplicate, surplus, opaque, size/type mismatch); a member
// that fails takes its round down (ClusterState::FailRound), so no worker
// waits for a sum that can never be complete.
//
//   if (AdmitToRound(&state, &server, RoundSize(job, server), &record)) { plan it }
//
// Thread safety: none; called under the scheduler service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_ROUND_TRACKER_H_
#define MLFABRIC_SCHEDULER_SERVICE_ROUND_TRACKER_H_

#include <cstdint>

#include "scheduler/service/cluster_state.h"

namespace mlfabric {

// True when `record` joined its round; otherwise it has ended (dropped or
// failed, through `state`) and *record must not be used again.
bool AdmitToRound(ClusterState* state, ServerState* server, int32_t round_size,
                  UpdateRecord* record);

// "float32", ... for error messages.
const char* DTypeName(v1::DType dtype);

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_ROUND_TRACKER_H_
