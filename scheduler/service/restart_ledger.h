// RestartLedger: a restarted scheduler's account of its predecessor's
// pushes (docs/architecture.md §3a "Scheduler restart"; in_doubt.h): what the daemons
// tell it as they register again, kept until each push ends exactly once.
//
// It keeps, by push (or copy) transfer id:
// - the pushes in doubt at their sources (their schedule streams broke
//   while they were in flight);
// - what the servers' daemons applied (with the version, and when this
//   scheduler heard it), or were handed and have not acknowledged yet
//   ("delivering");
// - what the replicas' daemons applied or were applying (when heard), the
//   replica copies they kept for their pushes' outcomes, and the pushes
//   whose copies are sent again from their sources instead (§5.3);
// - the pushes whose sources hold their bytes for a replica copy.
//
// The ledger only keeps these records; in_doubt.cc decides, from them and
// the rest of ClusterState, how each push ends, and erases what it decided
// through the Erase*If calls.
//
//   RestartLedger& ledger = state.restart();
//   ledger.AddInDoubt(push);                          // a source registers
//   ledger.MarkAppliedElsewhere(push.transfer_id, 12, now_s);
//   ledger.EraseInDoubtIf([&](const InDoubtPush& p) {
//     if (auto version = ledger.AppliedVersion(p.transfer_id)) { ...; return true; }
//     return false;
//   });
//   ledger.Prune(now_s, keep_s);                      // each batch cycle
//
// Thread safety: none. ClusterState owns one; the scheduler service calls
// it only under its own lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_RESTART_LEDGER_H_
#define MLFABRIC_SCHEDULER_SERVICE_RESTART_LEDGER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/functional/function_ref.h"
#include "proto/scheduler.pb.h"
#include "scheduler/service/pending_replica.h"

namespace mlfabric {

// A push whose source's schedule stream broke while it was in flight: the
// source's daemon names it when it registers again, and waits for its
// outcome (in_doubt.h).
struct InDoubtPush {
  uint64_t transfer_id = 0;
  uint64_t local_id = 0;
  std::string src_host;
  std::string job;
  std::string server;
  double since_s = 0;
  PendingReplica copy;  // as submitted, should its replica need a copy
};

// A replica copy whose bytes a replica's daemon kept when its schedule
// stream broke, waiting for its push's outcome (in_doubt.h).
struct HeldAtReplica {
  std::string job;
  std::string replica_host;
  v1::ExpectDelivery copy;  // as first announced
  bool incomplete = false;  // dropped there, bytes incomplete: only counted
  double since_s = 0;
};

// An applied push whose replica copy was punted (§5.3) and whose bytes its
// source still held when it registered again (in_doubt.h): the copy is
// planned again once the server's replica is registered.
struct HeldAtSource {
  std::string job;
  std::string server;
  PendingReplica copy;
  double since_s = 0;
  // A push in doubt that turned out applied: its source was told to hold
  // it, and the replica may have its copy already (kept there, or applied).
  bool from_doubt = false;
};

class RestartLedger {
 public:
  // Pushes in doubt at their sources, by transfer id.

  // Records `push` (by push.transfer_id) in doubt, replacing what a
  // previous registration of its source said of it.
  void AddInDoubt(InDoubtPush push);
  bool IsInDoubt(uint64_t push) const;
  size_t InDoubtCount() const { return in_doubt_.size(); }
  // Calls `ended` on each push in doubt, in transfer id order, and forgets
  // those it returns true for. `ended` may use the rest of the ledger, but
  // not add or erase pushes in doubt.
  void EraseInDoubtIf(absl::FunctionRef<bool(const InDoubtPush&)> ended);

  // What the servers' daemons applied or are applying.

  // A server's daemon applied `push` as model version `version` (heard at
  // `now_s`, which Prune ages): the push is no longer being delivered.
  void MarkAppliedElsewhere(uint64_t push, int64_t version, double now_s);
  // The version a server's daemon applied `push` as, if one did.
  std::optional<int64_t> AppliedVersion(uint64_t push) const;
  // A server's daemon handed `push` to its application, which has not
  // acknowledged it yet: its outcome waits for that acknowledgement. A push
  // already known applied stays so (a later log entry of the same push
  // does not undo what an acknowledgement told).
  void MarkDelivering(uint64_t push);
  // The application's acknowledgement came, or said it was not applied.
  void EndDelivering(uint64_t push) { delivering_.erase(push); }
  bool IsDelivering(uint64_t push) const;

  // What the replicas' daemons applied, kept or were receiving.

  // A replica's daemon applied (or was applying) the copy of `push`,
  // reported as it registered at `now_s`.
  void MarkAtReplica(uint64_t push, double now_s);
  bool IsAtReplica(uint64_t push) const;
  // A replica's daemon kept copy `copy_id` for its push's outcome; replaces
  // what a previous registration said of it.
  void KeepAtReplica(uint64_t copy_id, HeldAtReplica held);
  size_t HeldAtReplicaCount() const { return held_at_replicas_.size(); }
  // Whether a replica keeps a copy that carries `push` (its own, or an
  // aggregate's with it among the constituents): whole, and/or with its
  // bytes incomplete.
  struct KeptCopies {
    bool whole = false;
    bool incomplete = false;
  };
  KeptCopies KeptCopiesOf(uint64_t push) const;
  // Calls `settled` on each kept copy, in copy id order, and forgets those
  // it returns true for. `settled` may use the rest of the ledger, but not
  // add or erase kept copies.
  void EraseHeldAtReplicaIf(
      absl::FunctionRef<bool(uint64_t copy_id, const HeldAtReplica&)> settled);
  // The copy of `push` is sent again from its source, so a kept copy of it
  // that was still arriving is not counted missed.
  void MarkRecopiedFromSource(uint64_t push) { recopied_from_source_.insert(push); }
  bool WasRecopiedFromSource(uint64_t push) const;

  // Pushes whose sources hold their bytes for a replica copy.

  // `push`'s source holds its bytes (`held`), replacing what was known of
  // the hold, except that a hold from doubt stays one: a source that names
  // such a push again (registering after another broken stream) holds it
  // for the same uncertain copy.
  void HoldAtSource(uint64_t push, HeldAtSource held);
  bool IsHeldAtSource(uint64_t push) const;
  size_t HeldAtSourceCount() const { return held_at_sources_.size(); }
  // Calls `settled` on each push held at its source, in push order, and
  // forgets those it returns true for. `settled` may use the rest of the
  // ledger, but not add or erase holds at sources.
  void EraseHeldAtSourceIf(absl::FunctionRef<bool(uint64_t push, const HeldAtSource&)> settled);

  // Forgets what the servers' and replicas' daemons applied that was heard
  // more than `keep_s` before `now_s` (kept that long for sources that
  // register after them), and, once no kept copy is left to count, which
  // pushes were copied again from their sources.
  void Prune(double now_s, double keep_s);

 private:
  struct Applied {
    int64_t version = 0;
    double heard_s = 0;
  };

  std::map<uint64_t, InDoubtPush> in_doubt_;
  std::map<uint64_t, Applied> applied_elsewhere_;
  std::set<uint64_t> delivering_;
  std::map<uint64_t, double> at_replicas_;  // push -> when heard
  std::map<uint64_t, HeldAtReplica> held_at_replicas_;  // by copy transfer id
  std::set<uint64_t> recopied_from_source_;
  std::map<uint64_t, HeldAtSource> held_at_sources_;  // by push id
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_RESTART_LEDGER_H_
