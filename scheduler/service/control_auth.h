// ControlAuth: who may call the scheduler, and the keys it hands out
// (docs/architecture.md §3a). No gRPC here: the gRPC face (grpc_service.cc)
// reads the call's metadata and certificate and asks this and the service.
//
//   host registration   the cluster secret (metadata x-mlfabric-cluster-secret)
//                       or, with mutual TLS, a client certificate whose common
//                       name is the host's name
//   every later call    x-mlfabric-host and x-mlfabric-session: the session
//                       token the host's registration returned (checked when
//                       hosts are authenticated at all: a secret or mTLS)
//   job-scoped calls    x-mlfabric-job-token: the job's token, every call
//
// It also derives the data plane's keys (daemon/transport/data_auth.h): one
// cluster key every registered host gets, and one key per job, which only a
// host with an entity in the job, or work of it, gets. They derive from the
// cluster secret when there is one, so they survive a scheduler restart;
// otherwise from a random secret of this process.
//
// Thread safety: const after construction and AddJob; any thread.
#ifndef MLFABRIC_SCHEDULER_SERVICE_CONTROL_AUTH_H_
#define MLFABRIC_SCHEDULER_SERVICE_CONTROL_AUTH_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/service/scheduler_config.h"

namespace mlfabric {

// The metadata keys (lowercase, as gRPC requires).
inline constexpr char kClusterSecretMetadata[] = "x-mlfabric-cluster-secret";
inline constexpr char kHostMetadata[] = "x-mlfabric-host";
inline constexpr char kSessionMetadata[] = "x-mlfabric-session";
inline constexpr char kJobTokenMetadata[] = "x-mlfabric-job-token";

class ControlAuth {
 public:
  explicit ControlAuth(const SchedulerConfig& config);

  // Job `id`'s data key is derived from its name and token.
  void AddJob(uint32_t id, const std::string& name, const std::string& token);

  // Hosts must prove who they are (a cluster secret or mutual TLS).
  bool hosts_authenticated() const { return !cluster_secret_.empty() || mutual_tls_; }
  bool mutual_tls() const { return mutual_tls_; }

  // RegisterHost's check. `secret`: what the call presented; `cert_names`:
  // its verified client certificate's common names (mutual TLS).
  // Unauthenticated / PermissionDenied naming what was wrong.
  absl::Status CheckRegistration(const std::string& host, const std::string& secret,
                                 const std::vector<std::string>& cert_names) const;

  // The data plane's keys; "" when data_plane_auth is off.
  const std::string& data_key() const { return data_key_; }
  // Whether data sessions seal their payloads (data_plane_encryption).
  bool data_encryption() const { return data_encryption_; }
  std::string JobDataKey(uint32_t job_id) const;
  const std::map<uint32_t, std::string>& job_keys() const { return job_keys_; }

  // A fresh session token (128 random bits, hex).
  static std::string NewSessionToken();

 private:
  const std::string cluster_secret_;
  const bool mutual_tls_;
  const bool data_plane_auth_;
  const bool data_encryption_;
  std::string base_;  // what the data keys derive from
  std::string data_key_;
  std::map<uint32_t, std::string> job_keys_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_CONTROL_AUTH_H_
