// JobMembership: who a job's live workers are, and a generation number that
// changes with them (elastic training). A synchronous-round job sizes its
// rounds by its members (RoundSize, cluster_state.h), so a job whose worker
// dies goes on with the survivors instead of waiting for a push that never
// comes. Every round records the generation it opened under (RoundState).
//
// A worker joins when it registers (RegisterEntity, ROLE_WORKER) and leaves
// when its application is reported gone (ReportEntityGone) or its host dies
// (its schedule stream ended, or its daemon registered again). The
// generation starts at 1 and grows by one with every change; each change is
// kept, with when and why, in a bounded history for the admin endpoint.
//
//   JobMembership members;
//   members.Join("w1", 10.0, "registered on host h1");   // generation 2
//   members.Leave("w1", 12.5, "its host h1 is down");    // generation 3
//   members.size();                                      // 0
//   members.JoinedAt("w1");                              // 0: no member
//
// Pure: no clock, no I/O. Thread safety: none (the scheduler service's lock).
#ifndef MLFABRIC_SCHEDULER_SERVICE_JOB_MEMBERSHIP_H_
#define MLFABRIC_SCHEDULER_SERVICE_JOB_MEMBERSHIP_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>

namespace mlfabric {

// One change of a job's members.
struct MembershipChange {
  double at_s = 0;
  std::string worker;
  bool joined = false;  // false: left
  std::string reason;
  uint64_t generation = 0;  // the generation it made
};

class JobMembership {
 public:
  // The changes kept (the newest ones).
  static constexpr size_t kHistoryKept = 64;

  // `worker` joins; false (and no new generation) if it is a member already
  // (an application registering again).
  bool Join(const std::string& worker, double now_s, const std::string& reason);
  // `worker` leaves; false if it is no member.
  bool Leave(const std::string& worker, double now_s, const std::string& reason);

  bool Contains(const std::string& worker) const { return members_.count(worker) > 0; }
  // The generation `worker`'s current membership began with (its latest
  // join); 0 if it is no member. A worker is a member of generation g when
  // JoinedAt(worker) is in [1, g]: one that left and joined again after g
  // is not, though it is a member now.
  uint64_t JoinedAt(const std::string& worker) const;
  // The members of generation `generation` that are members still.
  size_t MembersSince(uint64_t generation) const;
  size_t size() const { return members_.size(); }
  const std::set<std::string>& members() const { return members_; }
  uint64_t generation() const { return generation_; }
  // Oldest first, at most kHistoryKept.
  const std::deque<MembershipChange>& history() const { return history_; }
  // Why `worker` last left ("" if it never did or has joined again).
  std::string WhyLeft(const std::string& worker) const;

 private:
  void Record(const std::string& worker, bool joined, double now_s, const std::string& reason);

  std::set<std::string> members_;
  std::map<std::string, uint64_t> joined_at_;  // by member
  uint64_t generation_ = 1;
  std::deque<MembershipChange> history_;
  std::map<std::string, MembershipChange> left_;  // workers not rejoined, by name
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_JOB_MEMBERSHIP_H_
