// Mercury packet framing (docs/architecture.md §5, mercury.md §IV): every byte that
// moves between daemons travels as a fixed 44-byte little-endian header
// followed by `length` payload bytes.
//
//   offset size field
//        0    4 magic      "MLFB" (0x42464C4D as little-endian u32)
//        4    1 version    kProtocolVersion
//        5    1 kind       PacketKind
//        6    2 flags      PacketFlags bits
//        8    2 priority   tensor priority, lower = more urgent
//       10    2 reserved   zero
//       12    4 job        numeric job id from the scheduler
//       16    8 transfer   cluster-unique transfer id
//       24    4 tensor     tensor id within the transfer (in the data
//                          packets of a get reply: for a synchronous
//                          round's sum, the pushes it sums; else 0)
//       28    4 length     payload bytes
//       32    8 offset     byte offset of the payload within the transfer
//       40    4 crc32c     CRC-32C of the payload
//
// Parsing is a pure function over bytes (it is fuzzed): anything malformed
// yields an error that names the field, never a crash.
#ifndef MLFABRIC_DAEMON_TRANSPORT_PACKET_H_
#define MLFABRIC_DAEMON_TRANSPORT_PACKET_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mlfabric::transport {

inline constexpr uint32_t kPacketMagic = 0x42464C4Du;
inline constexpr uint8_t kProtocolVersion = 1;
inline constexpr size_t kHeaderBytes = 44;
inline constexpr uint32_t kDefaultPayloadBytes = 32 * 1024;
inline constexpr uint32_t kMinPayloadBytes = 4 * 1024;
inline constexpr uint32_t kMaxPayloadBytes = 1024 * 1024;
// Control payloads (kBegin, kGetRequest, ...) are small serialized protos.
inline constexpr uint32_t kMaxControlBytes = 64 * 1024;

enum class PacketKind : uint8_t {
  kData = 0,          // a slice of a transfer's bytes
  kBegin = 1,         // a transfer starts: payload = TransferBegin proto
  kGetRequest = 2,    // a worker's daemon asks for a model
  kGetReply = 3,      // the model's header: payload = GetReplyBegin proto
  kAbort = 4,         // the sender gives up on a transfer: payload = reason
  // The sender proves it belongs to job `job` (data_auth.h): payload =
  // HMAC-SHA256 of the session's nonces under the job's key.
  kJobProof = 5,
};
inline constexpr uint8_t kMaxPacketKind = 5;

// Header flag bits.
// kFlagSealed: the payload is AES-256-GCM ciphertext followed by a 16-byte
// tag, and crc32c is 0 (payload_cipher.h). Only a session with a cipher
// takes it, and such a session takes nothing else (framing.h).
inline constexpr uint16_t kFlagSealed = 1u << 0;

struct PacketHeader {
  uint8_t version = kProtocolVersion;
  PacketKind kind = PacketKind::kData;
  uint16_t flags = 0;
  uint16_t priority = 0;
  uint32_t job = 0;
  uint64_t transfer = 0;
  uint32_t tensor = 0;
  uint32_t length = 0;
  uint64_t offset = 0;
  uint32_t crc32c = 0;
};

// Writes `header` into out[0..kHeaderBytes).
void EncodeHeader(const PacketHeader& header, uint8_t* out);

// Fills in length and crc32c from the payload, then encodes.
void EncodePacketHeader(PacketHeader header, const void* payload, uint32_t length, uint8_t* out);

// Parses and checks magic, version, kind, reserved bits and length against
// `max_payload_bytes` (control kinds against kMaxControlBytes).
absl::StatusOr<PacketHeader> ParseHeader(const uint8_t* data, size_t size,
                                         uint32_t max_payload_bytes);

// Checks the payload against the header's CRC-32C. A sealed packet's
// integrity was checked by its tag when it was read: nothing to do.
absl::Status VerifyPayload(const PacketHeader& header, const void* payload);

}  // namespace mlfabric::transport

#endif  // MLFABRIC_DAEMON_TRANSPORT_PACKET_H_
