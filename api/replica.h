// Replica: a hot-standby copy of a parameter server (mlfabric.md §5.3). It
// registers with the scheduler as ROLE_REPLICA of `server`; the scheduler
// plans replica transfers of the server's applied updates within the job's
// divergence bound, and the replica's daemon delivers them in the replica's
// commit order to the update callback, exactly as a server's daemon does.
//
//   RegistrationParams params;                 // job, token, daemon socket
//   ASSIGN_OR_RETURN(std::unique_ptr<Replica> r, RegisterAsReplica("ps0", params));
//   r->RegisterUpdateCallback([&](const Server::Update& u) { return Apply(u); });
//   RETURN_IF_ERROR(r->Serve());               // until Stop() or the daemon goes away
//
// Thread safety: the callback runs on Serve()'s thread; Stop() may be called
// from any thread.
#ifndef MLFABRIC_API_REPLICA_H_
#define MLFABRIC_API_REPLICA_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/mlfabric.h"
#include "api/registration.h"

namespace mlfabric {

class Replica {
 public:
  using UpdateCallback = Server::UpdateCallback;
  ~Replica();
  void RegisterUpdateCallback(UpdateCallback callback) { on_update_ = std::move(callback); }
  const std::string& server() const { return server_; }
  // Applies delivered updates until Stop() or the daemon goes away.
  absl::Status Serve();
  void Stop();

 private:
  friend absl::StatusOr<std::unique_ptr<Replica>> RegisterAsReplica(const std::string&,
                                                                    const RegistrationParams&);
  Replica() = default;
  std::string server_;
  std::unique_ptr<LocalChannel> channel_;
  UpdateCallback on_update_;
  std::atomic<bool> stopping_{false};
};

// Registers as the replica of `server` (params.client.name is ignored: a
// replica is named by its server). Errors: the daemon unreachable, the job
// or token refused, bounds contradicting the job's (CheckBounds).
absl::StatusOr<std::unique_ptr<Replica>> RegisterAsReplica(const std::string& server,
                                                           const RegistrationParams& params);

}  // namespace mlfabric

#endif  // MLFABRIC_API_REPLICA_H_
