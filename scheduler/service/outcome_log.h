// OutcomeLog: how the last pushes ended, kept after the pushes themselves
// are forgotten, and the applications' own names for their pushes.
//
// A push ends once (ClusterState::Complete), but the source may not hear
// it: its daemon's stream broke, the scheduler restarted, or the
// application lost its daemon. Such a source asks again, by transfer id
// (a daemon registering again, in_doubt.h) or by the application's push
// uid (an outcome query, outcome_queries.h). The log answers both for a
// bounded window: the last kRecentOutcomes outcomes and the last kPushUids
// uids, oldest forgotten first.
//
//   OutcomeLog log;
//   log.RememberUid(/*uid=*/0xfeed, /*transfer_id=*/42, "demo", "w1");
//   log.Remember(42, {v1::OUTCOME_APPLIED, "", /*applied_version=*/7});
//   const OutcomeLog::PushUid* named = log.FindUid(0xfeed);   // -> 42
//   const RecentOutcome* ended = log.Find(named->transfer_id);  // applied
//
// In both, the first entry for a key stands: a push is told one outcome,
// and a uid names the push that first claimed it.
//
// Thread safety: none; owned by ClusterState, under the service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_OUTCOME_LOG_H_
#define MLFABRIC_SCHEDULER_SERVICE_OUTCOME_LOG_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "proto/scheduler.pb.h"

namespace mlfabric {

// How a push ended, as its source was told (Complete).
struct RecentOutcome {
  v1::Outcome outcome = v1::OUTCOME_UNSPECIFIED;
  std::string reason;
  int64_t applied_version = 0;
  int64_t delay = 0;
  // The source was told to hold the push for a replica copy to come: told
  // again if it did not hear, or it would free the bytes the copy needs.
  bool hold_for_replica = false;
};

class OutcomeLog {
 public:
  // The window kept: enough for every push of a busy scheduler's last
  // minutes, bounded so that a long run does not grow the scheduler.
  static constexpr size_t kRecentOutcomes = 65536;
  static constexpr size_t kPushUids = 2 * kRecentOutcomes;

  // A push by its application's id (SubmitUpdateRequest.push_uid).
  struct PushUid {
    uint64_t transfer_id = 0;
    std::string job;
    std::string worker;
  };

  // Keeps how push `transfer_id` ended; the first outcome recorded stands.
  void Remember(uint64_t transfer_id, RecentOutcome outcome);
  // How push `transfer_id` ended, or null if it has not or was forgotten.
  const RecentOutcome* Find(uint64_t transfer_id) const;
  size_t outcomes() const { return outcomes_.size(); }

  // Names push `transfer_id` by its application's id `uid` (0: nothing);
  // the first push of a uid stands.
  void RememberUid(uint64_t uid, uint64_t transfer_id, const std::string& job,
                   const std::string& worker);
  const PushUid* FindUid(uint64_t uid) const;
  size_t uids() const { return uids_.size(); }

 private:
  std::map<uint64_t, RecentOutcome> outcomes_;  // by transfer id
  std::deque<uint64_t> outcome_order_;          // oldest first
  std::map<uint64_t, PushUid> uids_;            // by push uid
  std::deque<uint64_t> uid_order_;              // oldest first
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_OUTCOME_LOG_H_
