// ReplicaSnapshots: the server's side of a new replica's snapshot
// (scheduler/service/replica_sync.h). The scheduler names a cut in the
// server's commit order (SnapshotToReplica.after_sequence); once every
// update up to it was handed to the server application, and before the
// next one, the application is asked for a model snapshot, and its answer
// is sent to the replica's daemon as one transfer: the 8-byte model
// version (little-endian), then the model.
//
//   snapshots.AddLocked(command);                          // kSnapshot
//   snapshots.FireLocked(key, next_position, app);         // at each hand-over
//   if (snapshots.Answer(id, version, model, error)) ...   // LocalModelReply
//
// A snapshot that cannot be taken or sent (the application left or
// refused, the send failed) is reported failed; the scheduler takes
// another.
//
// Thread safety: the `...Locked` methods require the receive side's lock
// (receive_lock.h); Answer takes only its own, a leaf. Both are checked
// by tools/thread_safety_check.
#ifndef MLFABRIC_DAEMON_ENGINE_REPLICA_SNAPSHOTS_H_
#define MLFABRIC_DAEMON_ENGINE_REPLICA_SNAPSHOTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "daemon/apps/app_sessions.h"
#include "daemon/control/completion_reporter.h"
#include "daemon/engine/model_request_ids.h"
#include "daemon/engine/receive_lock.h"
#include "daemon/engine/send_scheduler.h"
#include "ipc/local_ipc.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

// Model requests for snapshots use ids with this bit set (one of the
// request id spaces of model_request_ids.h).
inline constexpr uint64_t kSnapshotRequestBit = kReplicaRequestBit;

class ReplicaSnapshots {
 public:
  ReplicaSnapshots(SendScheduler* send, CompletionReporter* reporter);
  ReplicaSnapshots(const ReplicaSnapshots&) = delete;
  ReplicaSnapshots& operator=(const ReplicaSnapshots&) = delete;

  // A snapshot to take once `key` ("<job id>/<server>") has handed every
  // position up to command.after_sequence() over.
  void AddLocked(const v1::SnapshotToReplica& command) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // `key`'s next position to hand over is `next_position`: asks `app` (its
  // server application; null: none connected, the snapshots fail) for the
  // snapshots due, before that position is handed over.
  void FireLocked(const std::string& key, uint64_t next_position,
                  const std::shared_ptr<AppSession>& app)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // The server of `key` left: its snapshots not yet asked for fail.
  void FailServerLocked(const std::string& key, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // Forgets the snapshots not yet asked for (a restarted scheduler).
  void ResetLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side) { due_.clear(); }

  // The application's answer to request `request_id`; false if it was not
  // a snapshot's (its id lacks kSnapshotRequestBit). Sends it (or reports
  // it failed); an answer to a snapshot asked before is ignored.
  bool Answer(uint64_t request_id, int64_t version, std::shared_ptr<SharedBuffer> model,
              const std::string& error);

 private:
  SendScheduler* const send_;
  CompletionReporter* const reporter_;
  std::map<std::string, std::vector<v1::SnapshotToReplica>> due_ ABSL_GUARDED_BY(receive_side);
  Mutex mu_;  // a leaf
  std::map<uint64_t, v1::SnapshotToReplica> asked_ ABSL_GUARDED_BY(mu_);  // by request id
  uint64_t next_request_ ABSL_GUARDED_BY(mu_) = kSnapshotRequestBit;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_REPLICA_SNAPSHOTS_H_
