// Registration with the parameters of mlfabric.md Table 1:
//
//   RegistrationParams params;
//   params.client.name = "worker-1";        // + job, token, daemon socket
//   params.delay_bound = 30;                // tau_max; -1 = the job's
//   ASSIGN_OR_RETURN(std::unique_ptr<Worker> w, RegisterAsWorker(params));
//   ASSIGN_OR_RETURN(std::unique_ptr<Server> s, RegisterAsServer(params));       // name = server
//   ASSIGN_OR_RETURN(std::unique_ptr<Replica> r, RegisterAsReplica("ps0", params));
//
// The bounds are properties of the job and are enforced by the scheduler
// (tau_max in the scheduler config's job entry; mlfabric-run --delay_bound
// writes it and exports it to every rank as MLFABRIC_DELAY_BOUND /
// MLFABRIC_DIVERGENCE_BOUND). Registering with a bound that contradicts the
// job's is an error naming both values, so a program never trains under a
// bound it did not ask for. The wrappers are otherwise Worker::Connect and
// Server::Connect.
//
// Replica: registers with the scheduler as ROLE_REPLICA of `server` and
// applies the updates its daemon delivers, in the scheduled order. Today's
// daemon does not yet forward replica transfers (DESIGN.md §5.3 lands in the
// data plane later), so a replica registers and serves but receives nothing.
// Thread safety: as Worker/Server; a Replica's callback runs on Serve()'s thread.
#ifndef MLFABRIC_API_REGISTRATION_H_
#define MLFABRIC_API_REGISTRATION_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/mlfabric.h"

namespace mlfabric {

struct RegistrationParams {
  ClientOptions client;
  int64_t delay_bound = -1;        // tau_max in model versions; -1 = the job's
  double divergence_bound = -1;    // Div_max (L2); -1 = the job's / none
};

absl::StatusOr<std::unique_ptr<Worker>> RegisterAsWorker(const RegistrationParams& params);
absl::StatusOr<std::unique_ptr<Server>> RegisterAsServer(const RegistrationParams& params);

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

absl::StatusOr<std::unique_ptr<Replica>> RegisterAsReplica(const std::string& server,
                                                           const RegistrationParams& params);

// Checks `params` against the job's bounds exported by the launcher.
absl::Status CheckBounds(const RegistrationParams& params);

}  // namespace mlfabric

#endif  // MLFABRIC_API_REGISTRATION_H_
