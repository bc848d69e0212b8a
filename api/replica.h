// Replica: a hot-standby copy of a parameter server (mlfabric.md §5.3). It
// registers with the scheduler as ROLE_REPLICA of `server`; the scheduler
// plans replica transfers of the server's applied updates within the job's
// divergence bound, and the replica's daemon delivers them in the replica's
// commit order to the update callback, exactly as a server's daemon does.
//
//   RegistrationParams params;                 // job, token, daemon socket
//   ASSIGN_OR_RETURN(std::unique_ptr<Replica> r, RegisterAsReplica("ps0", params));
//   r->RegisterUpdateCallback([&](const Server::Update& u) { return Apply(u); });
//   r->RegisterRequestCallback([&] { return Snapshot(); });     // once promoted
//   r->RegisterPromotionCallback([&](const Replica::Promotion& p) {
//     version = std::max(version, p.model_version);            // versions go on
//   });
//   RETURN_IF_ERROR(r->Serve());               // until Stop() or the daemon goes away
//
// Failover (mlfabric.md §3.3; scheduler/service/failover.h): when the
// server's host goes down or its application leaves, the scheduler makes
// the replica the server. Serve() then runs the promotion callback once,
// and from there on applies the server's updates through the update
// callback and answers the workers' gets through the request callback,
// exactly as Server::Serve does. Workers change nothing: their pushes and
// gets go to the new server. A replica without a request callback answers
// gets with an error.
//
// Thread safety: the callbacks run on Serve()'s thread; Stop() may be
// called from any thread.
#ifndef MLFABRIC_API_REPLICA_H_
#define MLFABRIC_API_REPLICA_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/mlfabric.h"
#include "api/registration.h"

namespace mlfabric {

// A hot-standby replica of a server (MLfabric §5.3): it applies copies of
// the server's updates within the job's divergence bound, and takes over as
// the server when the server fails (RegisterAsReplica).
class Replica {
 public:
  using UpdateCallback = Server::UpdateCallback;    // as the server's
  using RequestCallback = Server::RequestCallback;  // as the server's
  // What the scheduler says when it makes this replica the server.
  struct Promotion {
    std::string server;    // the server this replica now is
    std::string old_host;  // where the server was
    std::string reason;    // why it failed over
    // The old server's model version: continue version numbers from here
    // (the update callback's return values), so that workers never see
    // the version go back.
    int64_t model_version = 0;
  };
  // Called once, when this replica becomes the server.
  using PromotionCallback = std::function<void(const Promotion&)>;
  // A snapshot of the server's model (RegistrationParams::replica_snapshot):
  // replace the model with these bytes, at `version`; the updates after it
  // follow through the update callback.
  struct Install {
    int64_t version = 0;            // the snapshot's model version
    const uint8_t* data = nullptr;  // its bytes, valid during the callback
    size_t bytes = 0;               // how many
  };
  // Installs a snapshot; an error fails the replica's start.
  using InstallCallback = std::function<absl::Status(const Install&)>;
  ~Replica();
  // Applies a copy of one of the server's updates, in the server's order.
  void RegisterUpdateCallback(UpdateCallback callback) { on_update_ = std::move(callback); }
  // Answers gets once this replica is the server.
  void RegisterRequestCallback(RequestCallback callback) { on_request_ = std::move(callback); }
  // Learns of the promotion (see PromotionCallback).
  void RegisterPromotionCallback(PromotionCallback callback) {
    on_promotion_ = std::move(callback);
  }
  // Required with RegistrationParams::replica_snapshot (Serve() refuses to
  // start without it).
  void RegisterInstallCallback(InstallCallback callback) { on_install_ = std::move(callback); }
  // Snapshots installed so far.
  int64_t installs() const { return installs_; }
  // True once the scheduler made this replica the server (read it from
  // Serve()'s thread, or after Serve() returned).
  bool promoted() const { return promoted_; }
  // The server this replica stands by for.
  const std::string& server() const { return server_; }
  // Applies delivered updates until Stop() or the daemon goes away.
  absl::Status Serve();
  // Makes Serve() return; may be called from any thread.
  void Stop();

 private:
  friend absl::StatusOr<std::unique_ptr<Replica>> RegisterAsReplica(const std::string&,
                                                                    const RegistrationParams&);
  Replica() = default;
  // The ack of a snapshot delivery, after the install callback.
  v1::LocalMessage InstallSnapshot(const v1::LocalUpdate& update, int fd);
  std::string server_;
  std::unique_ptr<LocalChannel> channel_;
  UpdateCallback on_update_;
  RequestCallback on_request_;
  PromotionCallback on_promotion_;
  InstallCallback on_install_;
  bool snapshots_ = false;  // registered with replica_snapshot
  int64_t installs_ = 0;
  bool promoted_ = false;
  std::atomic<bool> stopping_{false};
};

// Registers as the replica of `server` (params.client.name is ignored: a
// replica is named by its server). Errors: the daemon unreachable, the job
// or token refused, bounds contradicting the job's (CheckBounds).
absl::StatusOr<std::unique_ptr<Replica>> RegisterAsReplica(const std::string& server,
                                                           const RegistrationParams& params);

}  // namespace mlfabric

#endif  // MLFABRIC_API_REPLICA_H_
