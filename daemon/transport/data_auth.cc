#include "daemon/transport/data_auth.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/secrets.h"

namespace mlfabric::transport {
namespace {

constexpr char kMagic[4] = {'M', 'L', 'F', 'A'};
constexpr uint8_t kVersion = 1;
constexpr size_t kNonceBytes = 32;
constexpr size_t kHelloFixedBytes = 8 + kNonceBytes;
constexpr size_t kChallengeBytes = 4 + kNonceBytes + kMacBytes;  // + kX25519Bytes sealed
constexpr uint8_t kHelloSealed = 1;  // hello flags: data_plane_encryption
constexpr std::chrono::milliseconds kJobKeyWait(2000);

// Bounds every read and write of the handshake; cleared afterwards, so the
// session's own reads block as before.
class SocketTimeouts {
 public:
  SocketTimeouts(int fd, int seconds) : fd_(fd) { Set(seconds); }
  ~SocketTimeouts() { Set(0); }

 private:
  void Set(int seconds) {
    timeval tv{seconds, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  const int fd_;
};

absl::Status WriteAll(int fd, std::string_view bytes, const std::string& peer) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat("authentication handshake with ", peer,
                                                 ": write failed: ", std::strerror(errno)));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status ReadExactly(int fd, char* out, size_t size, const std::string& peer,
                         const char* what) {
  size_t have = 0;
  while (have < size) {
    const ssize_t n = ::recv(fd, out + have, size - have, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      return absl::UnavailableError(absl::StrCat(
          "authentication handshake with ", peer, ": the connection closed before its ", what,
          " (is data-plane authentication on at both ends?)"));
    }
    if (n < 0) {
      return absl::UnavailableError(
          absl::StrCat("authentication handshake with ", peer, ": no ", what, " within ",
                       kHandshakeTimeoutS, " s (", std::strerror(errno), ")"));
    }
    have += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string Mac(const std::string& key, std::string_view label, const SessionAuth& auth) {
  return HmacSha256(key, "mlfabric-data-v1 " + std::string(label) + "|" + auth.nonces + "|" +
                             auth.initiator);
}

std::string JobMac(const std::string& key, const SessionAuth& auth, uint32_t job) {
  char le[4] = {static_cast<char>(job), static_cast<char>(job >> 8), static_cast<char>(job >> 16),
                static_cast<char>(job >> 24)};
  return HmacSha256(key, "mlfabric-data-v1 job|" + auth.nonces + "|" + std::string(le, 4));
}

}  // namespace

void DataKeys::SetClusterKey(std::string key) {
  MutexLock lock(&mu_);
  cluster_key_ = std::move(key);
}

void DataKeys::SetJobKey(uint32_t job, std::string key) {
  {
    MutexLock lock(&mu_);
    job_keys_[job] = std::move(key);
  }
  cv_.SignalAll();
}

void DataKeys::SetEncryption(bool on) {
  MutexLock lock(&mu_);
  encryption_ = on;
}

bool DataKeys::encryption() const {
  MutexLock lock(&mu_);
  return encryption_ && !cluster_key_.empty();
}

bool DataKeys::enabled() const {
  MutexLock lock(&mu_);
  return !cluster_key_.empty();
}

std::string DataKeys::cluster_key() const {
  MutexLock lock(&mu_);
  return cluster_key_;
}

std::optional<std::string> DataKeys::JobKey(uint32_t job, std::chrono::milliseconds wait) const {
  MutexLock lock(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (job_keys_.count(job) == 0 && !cv_.WaitWithDeadline(&mu_, deadline)) {
  }
  auto it = job_keys_.find(job);
  if (it == job_keys_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<SessionAuth> InitiatorHandshake(int fd, const DataKeys& keys,
                                               const std::string& my_host,
                                               const std::string& peer) {
  SessionAuth auth;
  const std::string key = keys.cluster_key();
  if (key.empty()) return auth;
  auth.enabled = true;
  auth.initiator = my_host.substr(0, 255);
  const bool sealed = keys.encryption();
  const std::string nonce = RandomBytes(kNonceBytes);
  std::optional<X25519KeyPair> ephemeral;
  if (sealed) ephemeral = NewX25519KeyPair();
  SocketTimeouts timeouts(fd, kHandshakeTimeoutS);
  std::string hello(kMagic, 4);
  hello.push_back(static_cast<char>(kVersion));
  hello.push_back(static_cast<char>(auth.initiator.size()));
  hello.push_back(static_cast<char>(sealed ? kHelloSealed : 0));
  hello.push_back('\0');
  hello += nonce;
  if (sealed) hello += ephemeral->public_key;
  hello += auth.initiator;
  if (absl::Status s = WriteAll(fd, hello, peer); !s.ok()) return s;

  std::string challenge(kChallengeBytes + (sealed ? kX25519Bytes : 0), '\0');
  if (absl::Status s = ReadExactly(fd, challenge.data(), challenge.size(), peer, "challenge");
      !s.ok()) {
    return s;
  }
  if (std::memcmp(challenge.data(), kMagic, 4) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "authentication handshake with ", peer, ": it did not answer as an MLfabric daemon"));
  }
  const std::string peer_public = sealed ? challenge.substr(4 + kNonceBytes, kX25519Bytes) : "";
  auth.nonces = nonce + challenge.substr(4, kNonceBytes);
  if (sealed) auth.nonces += ephemeral->public_key + peer_public;
  if (!ConstantTimeEquals(std::string_view(challenge).substr(challenge.size() - kMacBytes),
                          Mac(key, "acceptor", auth))) {
    return absl::PermissionDeniedError(absl::StrCat(
        "authentication handshake with ", peer,
        ": it does not hold this cluster's data key (not a daemon of this cluster)"));
  }
  if (absl::Status s = WriteAll(fd, Mac(key, "initiator", auth), peer); !s.ok()) return s;
  char verdict[2];
  if (absl::Status s = ReadExactly(fd, verdict, 2, peer, "verdict"); !s.ok()) return s;
  if (verdict[0] != 0) {
    std::string reason(static_cast<uint8_t>(verdict[1]), '\0');
    (void)ReadExactly(fd, reason.data(), reason.size(), peer, "reason");
    return absl::PermissionDeniedError(
        absl::StrCat("authentication handshake with ", peer, ": refused: ", reason));
  }
  if (sealed) {
    absl::StatusOr<std::string> shared = X25519SharedSecret(*ephemeral, peer_public);
    if (!shared.ok()) {
      return absl::PermissionDeniedError(absl::StrCat("authentication handshake with ", peer, ": ",
                                                      shared.status().message()));
    }
    AttachCipher(fd, SessionCipher::Derive(/*initiator=*/true, *shared, key, auth.nonces));
    auth.sealed = true;
  }
  return auth;
}

absl::StatusOr<SessionAuth> AcceptorHandshake(int fd, const DataKeys& keys,
                                              const std::string& peer) {
  SessionAuth auth;
  const std::string key = keys.cluster_key();
  if (key.empty()) return auth;
  auth.enabled = true;
  SocketTimeouts timeouts(fd, kHandshakeTimeoutS);
  char hello[kHelloFixedBytes];
  if (absl::Status s = ReadExactly(fd, hello, sizeof(hello), peer, "hello"); !s.ok()) return s;
  if (std::memcmp(hello, kMagic, 4) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("data session from ", peer,
                     " did not start with the authentication handshake"));
  }
  if (static_cast<uint8_t>(hello[4]) != kVersion) {
    return absl::PermissionDeniedError(
        absl::StrCat("data session from ", peer, ": handshake version ",
                     static_cast<int>(static_cast<uint8_t>(hello[4])), " is not supported"));
  }
  // The hello says whether the initiator seals; the challenge follows it
  // (so the initiator can read the verdict) and the verdict refuses a
  // setting that differs from ours.
  const bool sealed = (static_cast<uint8_t>(hello[6]) & kHelloSealed) != 0;
  std::string peer_public(sealed ? kX25519Bytes : 0, '\0');
  if (absl::Status s = ReadExactly(fd, peer_public.data(), peer_public.size(), peer, "hello");
      !s.ok()) {
    return s;
  }
  std::string host(static_cast<uint8_t>(hello[5]), '\0');
  if (absl::Status s = ReadExactly(fd, host.data(), host.size(), peer, "hello"); !s.ok()) return s;
  auth.initiator = host;
  const std::string nonce = RandomBytes(kNonceBytes);
  std::optional<X25519KeyPair> ephemeral;
  if (sealed) ephemeral = NewX25519KeyPair();
  auth.nonces = std::string(hello + 8, kNonceBytes) + nonce;
  if (sealed) auth.nonces += peer_public + ephemeral->public_key;
  const std::string challenge = std::string(kMagic, 4) + nonce +
                                (sealed ? ephemeral->public_key : "") + Mac(key, "acceptor", auth);
  if (absl::Status s = WriteAll(fd, challenge, peer); !s.ok()) return s;
  char proof[kMacBytes];
  if (absl::Status s = ReadExactly(fd, proof, sizeof(proof), peer, "proof"); !s.ok()) return s;
  std::string reason;
  absl::StatusOr<std::string> shared;
  if (!ConstantTimeEquals(std::string_view(proof, kMacBytes), Mac(key, "initiator", auth))) {
    reason = "wrong cluster data key";
  } else if (sealed != keys.encryption()) {
    reason = absl::StrCat("data_plane_encryption is ", keys.encryption() ? "on" : "off",
                          " here and ", sealed ? "on" : "off",
                          " at the initiator (both must have it from the same scheduler)");
  } else if (sealed && !(shared = X25519SharedSecret(*ephemeral, peer_public)).ok()) {
    reason = std::string(shared.status().message());
  }
  if (!reason.empty()) {
    std::string verdict = {1, static_cast<char>(std::min<size_t>(reason.size(), 255))};
    (void)WriteAll(fd, verdict + reason.substr(0, 255), peer);
    return absl::PermissionDeniedError(absl::StrCat("data session from ", peer, " (says it is '",
                                                    host, "'): ", reason));
  }
  // Attached before the verdict leaves: the initiator's first sealed
  // packet may follow it at once.
  if (sealed) {
    AttachCipher(fd, SessionCipher::Derive(/*initiator=*/false, *shared, key, auth.nonces));
    auth.sealed = true;
  }
  if (absl::Status s = WriteAll(fd, std::string(2, '\0'), peer); !s.ok()) {
    DetachCipher(fd);
    return s;
  }
  return auth;
}

absl::StatusOr<std::string> JobProof(const SessionAuth& auth, const DataKeys& keys, uint32_t job) {
  std::optional<std::string> key = keys.JobKey(job);
  if (!key.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this daemon holds no key for job ", job, " (none of its applications is in the job)"));
  }
  return JobMac(*key, auth, job);
}

absl::Status AcceptJobProof(SessionAuth& auth, const DataKeys& keys, uint32_t job,
                            std::string_view proof) {
  std::optional<std::string> key = keys.JobKey(job, kJobKeyWait);
  if (!key.has_value()) {
    return absl::PermissionDeniedError(
        absl::StrCat("job ", job, ": this daemon holds no key for it, so it takes none of its data"));
  }
  if (!ConstantTimeEquals(proof, JobMac(*key, auth, job))) {
    return absl::PermissionDeniedError(absl::StrCat(
        "job ", job, ": wrong proof from '", auth.initiator, "' (it does not hold the job's key)"));
  }
  auth.jobs.insert(job);
  return absl::OkStatus();
}

}  // namespace mlfabric::transport
