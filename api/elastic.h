// Elastic training with the C++ AllReduce API: what Python's
// mlfabric.elastic does under `mlfabric-run --host-discovery-script`
// (docs/operations/many-hosts.md, "Elastic launching"), for a C++ program.
//
// A job's members are its live workers; their names (MLFABRIC_WORKER_NAME,
// which the launcher sets: rank0, rank1, ...) ordered by the numbers in
// them give the ranks. An ElasticAllReducer is an mlfabric-backend
// AllReducer built for one membership generation (its root server
// "<job>-allreduce-root-g<generation>", run by that generation's rank 0),
// and is built again when the membership changes:
//
//   ASSIGN_OR_RETURN(auto elastic, ElasticAllReducer::Create(options));  // joins
//   bool has_state = false;  // a rank that joined a job in progress has none
//   // ... sync: every rank takes the state of elastic->SyncRoot(has_state)
//   while (training) {
//     absl::Status s = elastic->reducer().AllReduce(grads, n, DataType::kFloat32);
//     if (!s.ok()) {
//       std::optional<JobMembers> next = elastic->MembershipChanged(s);
//       if (!next) return s;                    // not a membership change
//       restore the last commit;
//       RETURN_IF_ERROR(elastic->Rebuild(*next));   // a collective of the new members
//       sync from elastic->SyncRoot(has_state); continue;
//     }
//     ... apply, commit (keep a copy), has_state = true;
//     ASSIGN_OR_RETURN(auto changed, elastic->CheckMembership());  // a collective
//     if (changed) { RETURN_IF_ERROR(elastic->Rebuild(*changed)); sync; }
//   }
//
// A membership change is seen two ways:
//  - a collective fails because a member left (the scheduler's words:
//    "worker 'rank2' left the job (...) at membership generation 7"), or
//    because the member that served the root (rank 0) is gone: then every
//    survivor asks the membership itself (MembershipChanged), as there is
//    no rank 0 to agree through;
//  - at a commit, rank 0 asks the membership and broadcasts it
//    (CheckMembership), so that all ranks rebuild for the same one (a
//    joiner waits at its new reducer's root until they do).
// Ranks sharing a host do not sum in shared memory first (local_reduce is
// off: such a group has a fixed membership). A change while the ranks
// rebuild can leave them building for different generations, waiting for
// each other until options.timeout_s.
//
// Thread safety: one thread uses an ElasticAllReducer.
#ifndef MLFABRIC_API_ELASTIC_H_
#define MLFABRIC_API_ELASTIC_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/allreduce.h"
#include "api/mlfabric.h"

namespace mlfabric {

// Whether `status` is a collective's failure because a worker left the job
// (the scheduler's wording: "left the job" and "membership generation").
bool IsMembershipChange(const absl::Status& status);

// Worker names in rank order: digit runs compared as numbers (rank2 before
// rank10), the rest bytewise. Every rank applies it to the same list.
std::vector<std::string> RankOrder(std::vector<std::string> names);

class ElasticAllReducer {
 public:
  // `options`: backend "mlfabric" (others have a fixed size), the daemon
  // and job in `options.client` (empty: the launcher's environment) and
  // this rank's worker name (empty: MLFABRIC_WORKER_NAME; required),
  // timeout_s. rank, size, root_server and root_rank are set here. Waits
  // up to `wait_s` for at least MLFABRIC_SIZE members (the ranks of a
  // starting job register within moments), then builds for the
  // membership.
  static absl::StatusOr<std::unique_ptr<ElasticAllReducer>> Create(AllReduceOptions options,
                                                                   double wait_s = 30);
  ~ElasticAllReducer();
  ElasticAllReducer(const ElasticAllReducer&) = delete;
  ElasticAllReducer& operator=(const ElasticAllReducer&) = delete;

  AllReducer& reducer() { return *reducer_; }
  // The membership the reducer was built for, in rank order.
  const JobMembers& members() const { return members_; }
  const std::string& worker_name() const { return name_; }

  // The job's membership now (asked of the scheduler through the daemon),
  // in rank order.
  absl::StatusOr<JobMembers> Membership();

  // After `error` from a collective: the membership to rebuild for if it
  // was a membership change, else nullopt (the error stands). A worker
  // leaving: the membership now. The root's member (rank 0 of this
  // generation) gone, or the generation moved on (a root already replaced
  // under its name): asked for up to `wait_s` (its leaving may reach the
  // scheduler a moment after its rounds failed). Never on rank 0 itself.
  std::optional<JobMembers> MembershipChanged(const absl::Status& error, double wait_s = 3);

  // Rank 0 asks the membership and broadcasts it: the new membership if its
  // generation is not the reducer's, else nullopt. A collective.
  absl::StatusOr<std::optional<JobMembers>> CheckMembership();

  // Builds the reducer again for `members` (rank = this worker's place in
  // them, in rank order); rank() and size() follow, and MLFABRIC_RANK and
  // MLFABRIC_SIZE in the environment are set to match. A collective of
  // the new members: every one of them calls it.
  absl::Status Rebuild(const JobMembers& members);

  // The rank to take the state from when syncing: the lowest rank whose
  // `has_state` is true (it committed or synced before; a replacement for
  // rank 0 is rank 0 again, without state), else 0. A collective.
  absl::StatusOr<int> SyncRoot(bool has_state);

 private:
  ElasticAllReducer(AllReduceOptions options, std::string name, std::unique_ptr<Worker> asker);

  AllReduceOptions options_;
  const std::string name_;
  std::unique_ptr<Worker> asker_;  // this worker's connection for Membership()
  std::unique_ptr<AllReducer> reducer_;
  JobMembers members_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_API_ELASTIC_H_
