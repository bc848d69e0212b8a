// Secrets and their checks (docs/architecture.md §3a): random tokens, HMAC-SHA256 and
// constant-time comparison, on OpenSSL's libcrypto, plus reading a secret
// from a file the way the scheduler and the daemon both do.
//
//   std::string key = RandomBytes(32);
//   std::string mac = HmacSha256(key, message);        // 32 bytes
//   if (!ConstantTimeEquals(mac, received)) return Denied();
//   ASSIGN_OR_RETURN(std::string secret, ReadSecretFile("/etc/mlfabric/cluster.secret"));
//
// Thread safety: every function may be called from any thread.
#ifndef MLFABRIC_COMMON_SECRETS_H_
#define MLFABRIC_COMMON_SECRETS_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace mlfabric {

// `n` bytes from the operating system's CSPRNG (RAND_bytes). Aborts the
// process if the generator fails: nothing secret may be made without it.
std::string RandomBytes(size_t n);
// RandomBytes(n) as 2n lowercase hex digits (tokens that go in files,
// flags and gRPC metadata).
std::string RandomHex(size_t n);
std::string ToHex(std::string_view bytes);

// HMAC-SHA256(key, message): 32 bytes.
std::string HmacSha256(std::string_view key, std::string_view message);
inline constexpr size_t kMacBytes = 32;

// An ephemeral X25519 key pair (RFC 7748), for a session's key agreement:
// both sides send `public_key` (32 bytes) and derive the same 32-byte
// secret, which nobody who only saw the public keys can compute.
struct X25519KeyPair {
  std::string private_key;  // 32 bytes, never leaves the process
  std::string public_key;   // 32 bytes
};
X25519KeyPair NewX25519KeyPair();
inline constexpr size_t kX25519Bytes = 32;
// The shared secret of `mine` and the peer's public key; InvalidArgument
// when the peer's key is malformed or a low-order point (all-zero secret).
absl::StatusOr<std::string> X25519SharedSecret(const X25519KeyPair& mine,
                                               std::string_view peer_public_key);

// a == b in time that depends only on the lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// The secret in `path`, trailing whitespace removed. Errors name the path:
// unreadable, empty, or readable by others than its owner and group (mode
// & 007), which is refused because anyone on the machine could read it.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

}  // namespace mlfabric

#endif  // MLFABRIC_COMMON_SECRETS_H_
