// Optional payload encryption on data sessions (docs/architecture.md §3a).
//
// When the scheduler's data_plane_encryption is on, the session handshake
// (data_auth.h) adds an ephemeral X25519 exchange, and both ends derive
// one AES-256-GCM key per direction from the shared secret, the cluster's
// data key and the handshake transcript. From then on every packet on the
// socket is sealed:
//
//   header (44 bytes, flag kFlagSealed, crc32c = 0) | ciphertext | tag (16)
//
// The header is the AEAD's associated data, so it is authenticated but
// readable (the daemons route on it); the payload is encrypted, and the
// tag replaces the CRC-32C. The nonce is a per-direction packet counter
// that both ends keep, never sent: a packet dropped, replayed, reordered
// or altered fails the next tag check and closes the session. Keys are
// fresh per session (forward secret: the cluster key alone cannot decrypt
// a recorded session, so a daemon of the cluster that is outside job J
// cannot read J's model off the wire).
//
// The cipher belongs to the socket, as kernel TLS would: the handshake
// attaches it to the file descriptor, and WritePacket and FrameReader
// (framing.h) find it there, so none of the writers above them (peer
// connections, get replies, relays, round sums, aborts) changes.
//
//   ASSIGN_OR_RETURN(auto cipher, SessionCipher::Derive(true, secret, cluster_key, transcript));
//   AttachCipher(fd, cipher);      // every packet on fd is now sealed
//   ...
//   DetachCipher(fd);              // before the socket closes: writes fail from now on
//
// Thread safety: the send direction is used under `send_mu` (held across
// seal and send, so the counter order is the wire order); the receive
// direction belongs to the session's one reader. The fd registry may be
// used from any thread.
#ifndef MLFABRIC_DAEMON_TRANSPORT_PAYLOAD_CIPHER_H_
#define MLFABRIC_DAEMON_TRANSPORT_PAYLOAD_CIPHER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// OpenSSL's cipher context, kept out of this header.
typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;

namespace mlfabric::transport {

inline constexpr size_t kTagBytes = 16;

// One direction of a session: AES-256-GCM with an implicit 96-bit nonce
// (32 zero bits | 64-bit packet counter, starting at 0).
class CipherDirection {
 public:
  explicit CipherDirection(std::string_view key);  // 32 bytes
  ~CipherDirection();
  CipherDirection(const CipherDirection&) = delete;
  CipherDirection& operator=(const CipherDirection&) = delete;

  // Encrypts `length` bytes of `in` into `out` (may equal `in`) and writes
  // the tag; `aad` is authenticated with them.
  absl::Status Seal(std::string_view aad, const void* in, size_t length, uint8_t* out,
                    uint8_t tag[kTagBytes]);
  // Decrypts `length` bytes in place and checks the tag. DataLoss naming
  // the packet number when it does not match (the session must close: the
  // counters are out of step from then on).
  absl::Status Open(std::string_view aad, uint8_t* data, size_t length,
                    const uint8_t tag[kTagBytes]);

  uint64_t packets() const { return counter_; }

 private:
  void NextNonce(uint8_t nonce[12]);

  EVP_CIPHER_CTX* ctx_;
  uint64_t counter_ = 0;
};

// Both directions of one session, as seen from one end.
class SessionCipher {
 public:
  // The two keys are HMAC-SHA256(cluster_key, label | shared_secret |
  // transcript) for label "i2a" and "a2i"; `initiator` says which one this
  // end sends with.
  static std::shared_ptr<SessionCipher> Derive(bool initiator, std::string_view shared_secret,
                                               std::string_view cluster_key,
                                               std::string_view transcript);

  SessionCipher(std::string_view send_key, std::string_view receive_key)
      : send(send_key), receive(receive_key) {}

  // Set by DetachCipher: the socket is closing, and a write on it fails
  // (it must never go out in plaintext instead).
  std::atomic<bool> closed{false};
  std::mutex send_mu;              // held across a packet's seal and send
  CipherDirection send;            // guarded by send_mu
  std::vector<uint8_t> ciphertext; // guarded by send_mu: the sealed payload
  CipherDirection receive;         // the session's reader only
};

// The cipher attached to socket `fd`, or null (plaintext). An entry is
// bound to the socket itself (its inode), so a descriptor number reused by
// a later socket never inherits a stale cipher; entries of sockets gone
// are dropped when the next cipher is attached.
std::shared_ptr<SessionCipher> CipherOf(int fd);
void AttachCipher(int fd, std::shared_ptr<SessionCipher> cipher);
// Marks `fd`'s cipher closed (call it before closing a sealed socket): a
// writer racing the close gets an error rather than sending in plaintext.
void DetachCipher(int fd);

}  // namespace mlfabric::transport

#endif  // MLFABRIC_DAEMON_TRANSPORT_PAYLOAD_CIPHER_H_
