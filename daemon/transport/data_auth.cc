#include "daemon/transport/data_auth.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/secrets.h"

namespace mlfabric::transport {
namespace {

constexpr char kMagic[4] = {'M', 'L', 'F', 'A'};
constexpr uint8_t kVersion = 1;
constexpr size_t kNonceBytes = 32;
constexpr size_t kHelloFixedBytes = 8 + kNonceBytes;
constexpr size_t kChallengeBytes = 4 + kNonceBytes + kMacBytes;
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
  std::lock_guard<std::mutex> lock(mu_);
  cluster_key_ = std::move(key);
}

void DataKeys::SetJobKey(uint32_t job, std::string key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_keys_[job] = std::move(key);
  }
  cv_.notify_all();
}

bool DataKeys::enabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !cluster_key_.empty();
}

std::string DataKeys::cluster_key() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cluster_key_;
}

std::optional<std::string> DataKeys::JobKey(uint32_t job, std::chrono::milliseconds wait) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, wait, [&] { return job_keys_.count(job) > 0; });
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
  const std::string nonce = RandomBytes(kNonceBytes);
  SocketTimeouts timeouts(fd, kHandshakeTimeoutS);
  std::string hello(kMagic, 4);
  hello.push_back(static_cast<char>(kVersion));
  hello.push_back(static_cast<char>(auth.initiator.size()));
  hello.append(2, '\0');
  hello += nonce;
  hello += auth.initiator;
  if (absl::Status s = WriteAll(fd, hello, peer); !s.ok()) return s;

  char challenge[kChallengeBytes];
  if (absl::Status s = ReadExactly(fd, challenge, sizeof(challenge), peer, "challenge"); !s.ok()) {
    return s;
  }
  if (std::memcmp(challenge, kMagic, 4) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "authentication handshake with ", peer, ": it did not answer as an MLfabric daemon"));
  }
  auth.nonces = nonce + std::string(challenge + 4, kNonceBytes);
  if (!ConstantTimeEquals(std::string_view(challenge + 4 + kNonceBytes, kMacBytes),
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
  std::string host(static_cast<uint8_t>(hello[5]), '\0');
  if (absl::Status s = ReadExactly(fd, host.data(), host.size(), peer, "hello"); !s.ok()) return s;
  auth.initiator = host;
  const std::string nonce = RandomBytes(kNonceBytes);
  auth.nonces = std::string(hello + 8, kNonceBytes) + nonce;
  if (absl::Status s = WriteAll(fd, std::string(kMagic, 4) + nonce + Mac(key, "acceptor", auth), peer);
      !s.ok()) {
    return s;
  }
  char proof[kMacBytes];
  if (absl::Status s = ReadExactly(fd, proof, sizeof(proof), peer, "proof"); !s.ok()) return s;
  if (!ConstantTimeEquals(std::string_view(proof, kMacBytes), Mac(key, "initiator", auth))) {
    const std::string reason = "wrong cluster data key";
    std::string verdict = {1, static_cast<char>(reason.size())};
    (void)WriteAll(fd, verdict + reason, peer);
    return absl::PermissionDeniedError(absl::StrCat("data session from ", peer, " (says it is '",
                                                    host, "'): ", reason));
  }
  if (absl::Status s = WriteAll(fd, std::string(2, '\0'), peer); !s.ok()) return s;
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
