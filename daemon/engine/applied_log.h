// AppliedLog: the pushes this host's server applications applied, as the
// daemon saw their acknowledgements, so that a restarted scheduler can end
// every push that was in flight during its outage exactly once: a push is
// applied if a server's daemon logged it, and failed only when the server's
// daemon says it did not (scheduler/service/in_doubt.h).
//
//   log.Handed(transfer_id, {constituent ids...});   // handed to the app
//   log.Acked(transfer_id, /*applied=*/true, version);
//   log.Applied(member, version);                     // a round's members
//   request.applied = log.Report();                   // at RegisterHost
//
// A delivery carries one push, or an aggregate's constituents (applied as
// consecutive versions ending at the acknowledged one, in commit order).
// The log keeps the last `capacity` pushes; a scheduler outage is short
// next to that many updates.
//
// Thread safety: none; the daemon calls it under its lock.
#ifndef MLFABRIC_DAEMON_ENGINE_APPLIED_LOG_H_
#define MLFABRIC_DAEMON_ENGINE_APPLIED_LOG_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <vector>

namespace mlfabric::daemon {

class AppliedLog {
 public:
  struct Entry {
    uint64_t push = 0;
    int64_t model_version = 0;
    // false: handed to the application, its acknowledgement still to come.
    bool acknowledged = true;
  };

  explicit AppliedLog(size_t capacity = 65536) : capacity_(capacity) {}

  // Delivery `transfer_id`, carrying `pushes` (itself, or an aggregate's
  // constituents in commit order), was handed to a server application.
  void Handed(uint64_t transfer_id, std::vector<uint64_t> pushes);
  // Its acknowledgement: applied as model version `version`, or refused.
  // Returns the pushes it carried (none if it was never handed over).
  std::vector<uint64_t> Acked(uint64_t transfer_id, bool applied, int64_t version);
  // One push applied as `version` (a synchronous round's member).
  void Applied(uint64_t push, int64_t version);

  // Every push logged, applied or handed over and unacknowledged.
  std::vector<Entry> Report() const;
  bool Contains(uint64_t push) const;

 private:
  void Add(uint64_t push, int64_t version);

  const size_t capacity_;
  std::deque<Entry> applied_;                           // oldest first
  std::set<uint64_t> applied_ids_;                      // of applied_
  std::map<uint64_t, std::vector<uint64_t>> handed_;    // by delivery
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_APPLIED_LOG_H_
