// Synchronous rounds (Mercury PS, mercury.md §IV Key idea 3; mlfabric.md §6):
// a server registered with round_size M > 0 (or any server of a sync-mode
// job, with M = the job's live members, job_membership.h) sums round v, the
// M pushes computed from model version v, one per worker, at its daemon. A
// push that cannot belong to the open round is dropped or failed here with
// the reason (stale, future, duplicate, surplus, opaque, size/type
// mismatch); a member that fails takes its round down
// (ClusterState::FailRound), so no worker waits for a sum that can never be
// complete.
//
// A round is sized when its first push is admitted (RoundState::size, with
// the membership generation then) and keeps that size: every member is
// announced to the server's daemon with it, and the daemon sums against it.
// A worker leaving mid-round is MemberLeft's; the daemon cannot yet be told
// a smaller size for a round it was announced, so under member_loss
// "shrink" such a round completes only if the pushes in and those the
// members left still owe reach its size (a follow-up: a daemon command that
// lowers an announced round's size, so it completes with the survivors).
//
// Not yet elastic: servers registered with an explicit M (AllReduce roots).
// Their members are the ranks, not the job's workers, so a rank that dies
// still fails its round (its push never comes, round_timeout_s) and the
// next rounds wait for M pushes again. A follow-up maps the ranks to the
// job's membership so those rounds shrink too.
//
//   if (AdmitToRound(&state, &server, RoundSize(job, server), &record)) { plan it }
//   MemberLeft(&state, "job", "w3", "its application left host h3");
//
// Thread safety: none; called under the scheduler service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_ROUND_TRACKER_H_
#define MLFABRIC_SCHEDULER_SERVICE_ROUND_TRACKER_H_

#include <cstdint>
#include <string>

#include "scheduler/service/cluster_state.h"

namespace mlfabric {

// True when `record` joined its round; otherwise it has ended (dropped or
// failed, through `state`) and *record must not be used again.
bool AdmitToRound(ClusterState* state, ServerState* server, int32_t round_size,
                  UpdateRecord* record);

// Job membership (job_membership.h) and its rounds. Worker `worker` of job
// `job_name` registered on `host`: it joins (no change if a member). A
// round already sized keeps its size; the next one counts the newcomer.
void MemberJoined(ClusterState* state, const std::string& job_name, const std::string& worker,
                  const std::string& host);
// Worker `worker` left, `why`: a new generation. At each server whose
// rounds the members size (MemberSizedRounds), its pushes not yet in a
// round fail, and the rounds it leaves open follow the job's member_loss:
// kFail fails each once, naming the worker, why it left and the new
// generation; kShrink lets a round go on when its pushes in plus those the
// members left owe still reach its size, and fails it otherwise. A round
// not sized yet (its pushes still waiting for a batch) is sized by the
// members left when they are admitted, so it completes with them.
void MemberLeft(ClusterState* state, const std::string& job_name, const std::string& worker,
                const std::string& why);
// Host `host` is down (after ClusterState::MarkHostDown): its members leave.
void MembersOnHostLeft(ClusterState* state, const std::string& host, const std::string& why);

// "float32", ... for error messages.
const char* DTypeName(v1::DType dtype);

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_ROUND_TRACKER_H_
