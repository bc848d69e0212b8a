// Authentication of data sessions between daemons (docs/architecture.md §3a).
//
// The scheduler hands every registered host the cluster's data key, and a
// host that has an entity in job J (or is given work of J) the key of J.
// A session starts with a handshake that proves both ends hold the cluster
// key, over fresh nonces from both sides (so nothing can be replayed):
//
//   initiator -> acceptor  hello      "MLFA" v1 | host length | flags | 0 | nonce_i (32)
//                                     | [x25519_i (32)] | host
//   acceptor  -> initiator challenge  "MLFA" | nonce_a (32) | [x25519_a (32)]
//                                     | HMAC(K, "acceptor" ...)
//   initiator -> acceptor  proof      HMAC(K, "initiator" ...)
//   acceptor  -> initiator verdict    0 (accepted) or 1, reason length, reason
//
// The MACs cover both nonces, both public keys and the initiator's name.
// With data_plane_encryption (flags bit 0) both sides send an ephemeral
// X25519 public key and, once accepted, attach a SessionCipher to the
// socket (payload_cipher.h): every packet after the handshake is sealed.
// Both ends learn the setting from the same scheduler; an acceptor whose
// setting differs from the hello's refuses the session and says why.
//
// Before the first packet of job J on a session, the initiator sends a
// kJobProof frame: HMAC(K_J, "job" | nonce_i | nonce_a | J). The acceptor
// takes no packet of a job the session has not proven, and the daemon
// checks that a packet's job is the job of the transfer (or server) it
// names, so a daemon outside J can neither inject into J's transfers nor
// read J's model. The handshake is once per session, not per packet.
//
//   transport::DataKeys keys;                     // filled from the scheduler
//   ASSIGN_OR_RETURN(SessionAuth auth, InitiatorHandshake(fd, keys, "w1", "s1 at 10.0.0.1:7000"));
//   if (!auth.Allows(job)) { ASSIGN_OR_RETURN(std::string proof, JobProof(auth, keys, job)); ... }
//
// With no cluster key (the scheduler's data_plane_auth = false) there is no
// handshake and every job is allowed: both ends learn the same setting from
// the same scheduler.
// Thread safety: DataKeys may be used from any thread; a SessionAuth
// belongs to its session.
#ifndef MLFABRIC_DAEMON_TRANSPORT_DATA_AUTH_H_
#define MLFABRIC_DAEMON_TRANSPORT_DATA_AUTH_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "daemon/transport/payload_cipher.h"

namespace mlfabric::transport {

// The keys this host holds.
class DataKeys {
 public:
  // "" turns authentication off.
  void SetClusterKey(std::string key);
  void SetJobKey(uint32_t job, std::string key);
  // Seal every packet of every session (needs the cluster key).
  void SetEncryption(bool on);
  bool enabled() const;
  bool encryption() const;
  std::string cluster_key() const;
  // The key of `job`, waiting up to `wait` for it to arrive (a command that
  // carries it may be a moment behind a peer's first packet).
  std::optional<std::string> JobKey(uint32_t job,
                                    std::chrono::milliseconds wait = std::chrono::milliseconds(0)) const;

 private:
  mutable Mutex mu_;
  mutable CondVar cv_;  // a job key was set
  std::string cluster_key_ ABSL_GUARDED_BY(mu_);
  bool encryption_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint32_t, std::string> job_keys_ ABSL_GUARDED_BY(mu_);
};

// One session's authentication state.
struct SessionAuth {
  bool enabled = false;       // false: no handshake was made, every job allowed
  std::string nonces;         // nonce_i | nonce_a
  std::string initiator;      // the initiator's host name, as it gave it
  std::set<uint32_t> jobs;    // proven on this session
  bool sealed = false;        // a cipher is attached to the socket

  bool Allows(uint32_t job) const { return !enabled || jobs.count(job) > 0; }
};

// How long either side waits for the other's handshake message.
inline constexpr int kHandshakeTimeoutS = 10;

// The initiator's side, on a connected blocking socket. `peer` names the
// other end in errors. PermissionDenied when the peer does not prove the
// cluster key or refuses ours; Unavailable when the connection fails.
// Both sides attach the session's cipher to `fd` when it is sealed; the
// owner of the socket calls DetachCipher(fd) before closing it.
absl::StatusOr<SessionAuth> InitiatorHandshake(int fd, const DataKeys& keys,
                                               const std::string& my_host,
                                               const std::string& peer);
// The acceptor's side; `peer` is the remote address, for errors. On a
// refusal the initiator is told why before the error is returned.
absl::StatusOr<SessionAuth> AcceptorHandshake(int fd, const DataKeys& keys,
                                              const std::string& peer);

// The payload of a kJobProof frame for `job`; FailedPrecondition when this
// host holds no key for the job.
absl::StatusOr<std::string> JobProof(const SessionAuth& auth, const DataKeys& keys, uint32_t job);
// Checks a kJobProof payload and marks `job` proven. PermissionDenied
// naming the job when the proof is wrong or this host has no key for it.
absl::Status AcceptJobProof(SessionAuth& auth, const DataKeys& keys, uint32_t job,
                            std::string_view proof);

}  // namespace mlfabric::transport

#endif  // MLFABRIC_DAEMON_TRANSPORT_DATA_AUTH_H_
