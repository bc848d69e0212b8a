// ServerEndpoints: the server and replica applications on this host
// (mlfabric.md §3.3, §5.3), by endpoint key "<job id>/<name>" (a replica's
// name is "replica:<server>"), and what each was handed: the updates it
// has not acknowledged yet (their receive buffers, recycled at the
// acknowledgement), the model version its acknowledgements said, and the
// logs of the pushes it applied (for a restarted
// scheduler). It is the daemon::ServerApps the ModelServer answers gets
// through: a snapshot asked for a version not handed over yet goes to the
// application right after the update that makes it.
//
//   ServerEndpoints servers(&lock, &pool, &stopping);
//   servers.PublishLocked(ServerKey(job_id, "ps"), app);     // registered
//   servers.HandLocked(key, update_message, buffer, false);  // in commit order
//   servers.AcknowledgedLocked(ack);                        // the app applied it
//
// An endpoint once expected stays known with no application
// (`EnsureLocked`), so that what is expected for it fails as "not
// connected" instead of waiting; unless an application of that name is
// registering here right now (`BeginRegistrationLocked`): the scheduler
// plans for a server as soon as it registered there, a moment before the
// daemon publishes the endpoint, and what it announces meanwhile waits
// for the end of that registration (Deliveries::RegistrationEndedLocked).
//
// Thread safety: the `...Locked` methods require the receive side's lock
// (receive_lock.h); the ServerApps methods take it.
#ifndef MLFABRIC_DAEMON_ENGINE_SERVER_ENDPOINTS_H_
#define MLFABRIC_DAEMON_ENGINE_SERVER_ENDPOINTS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "daemon/apps/app_sessions.h"
#include "daemon/engine/applied_log.h"
#include "ipc/buffer_pool.h"
#include "daemon/engine/model_server.h"
#include "daemon/engine/receive_lock.h"
#include "ipc/local_ipc.h"
#include "proto/local.pb.h"

namespace mlfabric::daemon {

// "<job id>/<server>": how the daemon's parts name a server endpoint.
std::string ServerKey(uint32_t job_id, const std::string& server);

class ServerEndpoints : public ServerApps {
 public:
  // `stopping` ends AwaitServer's wait; all must outlive this.
  ServerEndpoints(ReceiveLock* lock, BufferPool* pool, const std::atomic<bool>* stopping);
  ServerEndpoints(const ServerEndpoints&) = delete;
  ServerEndpoints& operator=(const ServerEndpoints&) = delete;

  // Where the snapshots a shard keeps for group gets are asked
  // (ModelServer::NewHistoryRequest); set once, before any delivery.
  void SetModelServer(ModelServer* model_server) { model_server_ = model_server; }

  // An application is registering as endpoint name `server` ("ps",
  // "replica:ps") of some job here: between its RegisterEntity request and
  // PublishLocked (or the refusal), when the scheduler may already plan
  // for it. Each Begin has its End.
  void BeginRegistrationLocked(const std::string& server)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side) { ++registering_[server]; }
  void EndRegistrationLocked(const std::string& server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  bool RegisteringLocked(const std::string& server) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side) { return registering_.count(server) > 0; }

  // `app` serves `key` from now on (and waiters are woken).
  void PublishLocked(const std::string& key, std::shared_ptr<AppSession> app)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // The application serving `key`; null if none is connected.
  std::shared_ptr<AppSession> AppLocked(const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  bool KnownLocked(const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side) { return endpoints_.count(key) > 0; }
  // Records `key` as known (with no application if none registered) and
  // returns its application (or null).
  std::shared_ptr<AppSession> EnsureLocked(const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // Every endpoint known here, connected or not.
  std::vector<std::string> KeysLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // `app` went away: forgets what it was handed and, if it served an
  // endpoint, that endpoint's application; returns that endpoint's key.
  std::optional<std::string> ForgetLocked(const std::shared_ptr<AppSession>& app)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // A promoted replica: the application of `from` serves `to` now; returns
  // it (null if none was connected).
  std::shared_ptr<AppSession> RenameLocked(const std::string& from, const std::string& to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);

  // Hands an update (`message`, with `buffer`'s descriptor) to `key`'s
  // application; on success it awaits acknowledgement, and snapshot
  // requests waiting for the version it makes follow it (as does a group
  // shard's history snapshot when `group_part`). The error of the send
  // otherwise. Requires a connected application.
  absl::Status HandLocked(const std::string& key, const v1::LocalMessage& message,
                          std::shared_ptr<SharedBuffer> buffer, bool group_part)
                              ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // The application acknowledged update `ack.transfer_id()`: its buffer is
  // recycled, its version noted; returns the pushes it applied (the
  // applied log's, for the report).
  std::vector<uint64_t> AcknowledgedLocked(const v1::LocalUpdateAck& ack)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // A synchronous round's sum was acknowledged at `version`: each member
  // applied (when `applied`) as of that version.
  void RoundAcknowledgedLocked(const std::string& key, uint64_t delivery,
                               const std::vector<uint64_t>& members, int64_t version,
                               bool applied) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // The version `key`'s acknowledgements said, if any.
  std::optional<int64_t> VersionLocked(const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // The pushes the servers here applied, and those whose copies the
  // replicas here were handed.
  AppliedLog& applied_log() { return applied_log_; }
  AppliedLog& replica_log() { return replica_log_; }

  // daemon::ServerApps (they take the lock).
  bool AwaitServer(const std::string& key, double wait_s) override;
  absl::Status AskSnapshot(const std::string& key, uint64_t request_id,
                           int64_t at_version) override;
  std::string JobOf(const std::string& key) override;

 private:
  // The version `key`'s application will have once it applied every
  // update handed to it (each advancing it by one).
  int64_t HandedVersionLocked(const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  void SendWaitingSnapshotsLocked(const std::string& key, const std::shared_ptr<AppSession>& app)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);

  ReceiveLock* const lock_;
  BufferPool* const pool_;
  const std::atomic<bool>* const stopping_;
  ModelServer* model_server_ = nullptr;
  // null: not connected
  std::map<std::string, std::shared_ptr<AppSession>> endpoints_ ABSL_GUARDED_BY(receive_side);
  // Registrations in progress, by endpoint name (BeginRegistrationLocked).
  std::map<std::string, int> registering_ ABSL_GUARDED_BY(receive_side);
  // Each endpoint's model version as its acknowledgements said: told to a
  // restarted scheduler when the server registers again.
  std::map<std::string, int64_t> versions_ ABSL_GUARDED_BY(receive_side);
  // Updates handed over and not acknowledged, by transfer id.
  std::map<uint64_t, std::pair<std::shared_ptr<AppSession>, std::shared_ptr<SharedBuffer>>>
      awaiting_ack_ ABSL_GUARDED_BY(receive_side);
  // Snapshot requests waiting until the update that makes their version is
  // handed over, by key: (version, request id).
  std::map<std::string, std::vector<std::pair<int64_t, uint64_t>>> snapshot_waiters_
      ABSL_GUARDED_BY(receive_side);
  AppliedLog applied_log_;
  AppliedLog replica_log_;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_SERVER_ENDPOINTS_H_
