// The pushes of this host's workers, from the moment the daemon takes one
// until its outcome is known (and, for an applied push whose replica copy
// comes in a later batch, until that copy is scheduled; §5.3).
//
//   PushTable pushes;
//   const uint64_t local = pushes.Record(push);     // before SubmitUpdate
//   ... SubmitUpdate(local id) ...
//   pushes.Submitted(local, transfer_id);           // or SubmitFailed(local)
//   pushes.Adopt(transfer_id, local);               // a command overtook the reply
//   std::optional<PushTable::Push> p = pushes.Find(transfer_id);
//   pushes.TakeForOutcome(transfer_id, hold_for_replica);
//
// A push is recorded under a local id before its SubmitUpdate so that no
// lock is held across the RPC: a command naming the push (it carries the
// local id) that arrives before the reply finds it by Adopt.
//
// Thread safety: every method from any thread; one leaf lock.
#ifndef MLFABRIC_DAEMON_APPS_PUSH_TABLE_H_
#define MLFABRIC_DAEMON_APPS_PUSH_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "daemon/apps/app_sessions.h"
#include "daemon/transport/packet_checksums.h"
#include "ipc/local_ipc.h"
#include "proto/local.pb.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

class PushTable {
 public:
  struct Push {
    std::shared_ptr<AppSession> app;
    uint64_t request_id = 0;  // the application's id for it
    std::shared_ptr<SharedBuffer> buffer;
    std::vector<v1::TensorInfo> tensors;
    std::shared_ptr<transport::PacketChecksums> checksums;
    std::string server;     // where it goes
    uint64_t local_id = 0;  // set by Record
    // As submitted, so a restarted scheduler can plan a held replica copy.
    int64_t version = 0;
    double norm = 0;
    v1::DType dtype = v1::DTYPE_FLOAT32;
    uint64_t uid = 0;  // the application's id of the push (LocalPush.uid)
  };

  // Records a push about to be submitted; returns its local id (> 0).
  uint64_t Record(Push push);
  // Its SubmitUpdate returned `transfer_id` (no-op if a command adopted it).
  void Submitted(uint64_t local_id, uint64_t transfer_id);
  // Its SubmitUpdate failed: forgotten.
  void SubmitFailed(uint64_t local_id);
  // Whether it is still being submitted: neither submitted nor adopted by a
  // command (a command that names it means the scheduler planned it).
  bool Submitting(uint64_t local_id) const;
  // A command for `transfer_id` carrying `local_id` came first: the push
  // is known by its transfer id from now on. No-op if unknown or known.
  void Adopt(uint64_t transfer_id, uint64_t local_id);

  // The push whose transfer is `transfer_id`.
  std::optional<Push> Find(uint64_t transfer_id) const;
  // Its outcome is known: forgotten, or kept for its replica copy.
  std::optional<Push> TakeForOutcome(uint64_t transfer_id, bool hold_for_replica);
  // The held bytes of applied push `transfer_id`, for its replica copy.
  std::optional<Push> TakeHeld(uint64_t transfer_id);
  // Every submitted push whose outcome is not known (the scheduler is
  // gone): forgotten and returned. Held copies and pushes still being
  // submitted stay.
  std::vector<Push> TakeAllSubmitted();
  // Every submitted push whose outcome is not known, by transfer id: kept
  // (a restarted scheduler tells their outcomes).
  std::vector<std::pair<uint64_t, Push>> Unresolved() const;

  // Every held push (applied, its replica copy not yet sent), by transfer
  // id: kept (a restarted scheduler plans their copies).
  std::vector<std::pair<uint64_t, Push>> Held() const;

  size_t submitted() const;
  size_t held() const;

 private:
  mutable Mutex mu_;
  uint64_t next_local_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Push> submitting_ ABSL_GUARDED_BY(mu_);  // by local id
  std::map<uint64_t, Push> pushes_ ABSL_GUARDED_BY(mu_);      // by transfer id
  std::map<uint64_t, Push> held_ ABSL_GUARDED_BY(mu_);        // by transfer id
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_APPS_PUSH_TABLE_H_
