// Registration with the parameters of mlfabric.md Table 1:
//
//   RegistrationParams params;
//   params.client.name = "worker-1";        // + job, token, daemon socket
//   params.delay_bound = 30;                // tau_max; -1 = the job's
//   ASSIGN_OR_RETURN(std::unique_ptr<Worker> w, RegisterAsWorker(params));
//   ASSIGN_OR_RETURN(std::unique_ptr<Server> s, RegisterAsServer(params));       // name = server
//   (a hot-standby replica registers with the same params: api/replica.h)
//
// The bounds are properties of the job and are enforced by the scheduler
// (tau_max in the scheduler config's job entry; mlfabric-run --delay_bound
// writes it and exports it to every rank as MLFABRIC_DELAY_BOUND /
// MLFABRIC_DIVERGENCE_BOUND). Registering with a bound that contradicts the
// job's is an error naming both values, so a program never trains under a
// bound it did not ask for. The wrappers are otherwise Worker::Connect and
// Server::Connect.
//
// Thread safety: as Worker/Server.
#ifndef MLFABRIC_API_REGISTRATION_H_
#define MLFABRIC_API_REGISTRATION_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/mlfabric.h"

namespace mlfabric {

// Table 1's registration (MLfabric §4): an application's connection and its
// bounds.
struct RegistrationParams {
  ClientOptions client;  // the daemon, the job and this application's name
  int64_t delay_bound = -1;        // tau_max in model versions; -1 = the job's
  double divergence_bound = -1;    // Div_max (L2); -1 = the job's / none
  // RegisterAsReplica: the replica starts from a snapshot of its server's
  // model, installed through Replica::RegisterInstallCallback before the
  // copies of later updates, so it may register mid-training (or stand by
  // for a promoted server) and still hold the server's model. Without it
  // the replica starts from its own initial model.
  bool replica_snapshot = false;
};

// A worker with the params' bounds (after CheckBounds).
absl::StatusOr<std::unique_ptr<Worker>> RegisterAsWorker(const RegistrationParams& params);
// A server of the params' job.
absl::StatusOr<std::unique_ptr<Server>> RegisterAsServer(const RegistrationParams& params);

// Checks `params` against the job's bounds exported by the launcher.
absl::Status CheckBounds(const RegistrationParams& params);

}  // namespace mlfabric

#endif  // MLFABRIC_API_REGISTRATION_H_
