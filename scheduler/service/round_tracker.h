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
// A round opens with its first accepted push (OpenRound: RoundState::size,
// with the membership generation then) and keeps that size: every member
// is announced to the server's daemon with it, and the daemon sums against
// it. Only the members of that generation contribute: a worker that joins
// while the round is open counts from the next one (AdmitToRound).
// A worker leaving mid-round is MemberLeft's: under member_loss "shrink"
// the round closes with the pushes in and those the members of its
// generation left still owe, and a round already announced to its server's
// daemon is lowered there by a ShrinkRound command (RoundTable::Shrink), so
// it completes with the survivors.
//
// Servers registered with an explicit M (AllReduce roots): their members
// are their ranks (ServerState::ranks, the workers whose pushes their
// rounds admitted), not all the job's workers. With the job's config
// saying "member_loss": "shrink" (ElasticRanks), their rounds shrink as
// member-sized ones do; otherwise a rank that leaves fails the round it
// leaves open, at once, and the next rounds wait for M pushes again.
//
//   OpenRound(job, &server, record.version);          // at SubmitUpdate
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

// Round `round` of `server` opens with its first accepted push
// (SubmitUpdate), if it is the server's open or next round: it takes the
// size in force (RoundSize) and the job's membership generation then
// (RoundState), so a worker that registers while it is open changes
// neither and counts from a later round.
void OpenRound(const JobState& job, ServerState* server, int64_t round);

// True when `record` joined its round; otherwise it has ended (dropped or
// failed, through `state`) and *record must not be used again. A push whose
// worker is no contributor of the generation the round opened under is
// dropped, the reason naming both generations: "stale_generation: ..." (it
// joined, or left and joined again, after the round opened) or
// "not_a_member: ..." (it is no member of a member-sized round's job).
bool AdmitToRound(ClusterState* state, ServerState* server, int32_t round_size,
                  UpdateRecord* record);

// Job membership (job_membership.h) and its rounds. Worker `worker` of job
// `job_name` registered on `host`: it joins (no change if a member). A
// round already sized keeps its size; the next one counts the newcomer.
void MemberJoined(ClusterState* state, const std::string& job_name, const std::string& worker,
                  const std::string& host);
// Worker `worker` left, `why`: a new generation. At each server whose
// rounds the members size (MemberSizedRounds) or that counts it among its
// ranks, its pushes not yet in a round fail, and the rounds it leaves open
// follow the job's member_loss (a server with M not ElasticRanks: fail):
// kFail fails each once, naming the worker, why it left and the new
// generation; kShrink lets a round go on when its pushes in plus those the
// members left owe still reach its size, and fails it otherwise. A round
// not yet announced (its pushes still waiting for a batch) is resized to
// the members of its generation left, so it completes with them.
void MemberLeft(ClusterState* state, const std::string& job_name, const std::string& worker,
                const std::string& why);
// Host `host` is down (after ClusterState::MarkHostDown): its members leave.
void MembersOnHostLeft(ClusterState* state, const std::string& host, const std::string& why);

// "float32", ... for error messages.
const char* DTypeName(v1::DType dtype);

// The most dimensions a push's shape may name (SubmitUpdate refuses more).
constexpr int kMaxShapeDims = 64;

// Why `record` cannot join synchronous round `round`, which sums
// `round_state`'s bytes, type and shape ("" when it can): opaque bytes are
// never summed; a record whose bytes or dtype differ from the round's
// first push, or that names a shape other than the one the round's first
// push naming a shape named, fails with "mismatch: ..." naming both sides
// (AllReduce's callers get FailedPrecondition with it). A record, or a
// round, without a shape agrees with any shape, as a rank that names none
// under MPI's agreement (api/call_agreement.h). Pure.
std::string RoundMismatch(const RoundState& round_state, const UpdateRecord& record,
                          int64_t round);

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_ROUND_TRACKER_H_
