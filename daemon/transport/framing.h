// Mercury framing on a TCP socket (mercury.md §IV; docs/architecture.md §5): what the
// daemon's sessions read and write, packet by packet.
//
//   FrameReader reader(socket.native_handle());
//   ASSIGN_OR_RETURN(PacketHeader header, reader.ReadHeader());
//   RETURN_IF_ERROR(reader.ReadPayload(buffer, header.length));
//
//   RETURN_IF_ERROR(WritePacket(watchdog, fd, header, payload, length));
//
// A frame cut short is InvalidArgument naming how far it got (the session
// is closed, nothing else is touched); a clean close before a header is
// Unavailable.
// On a socket with a cipher attached (payload_cipher.h) both seal and open
// every packet; a plaintext packet there, or a sealed one on a plaintext
// socket, is InvalidArgument and a bad tag DataLoss (the session closes).
// Thread safety: a FrameReader belongs to one reading thread; WritePacket
// may be called from any thread, one writer per socket at a time.
#ifndef MLFABRIC_DAEMON_TRANSPORT_FRAMING_H_
#define MLFABRIC_DAEMON_TRANSPORT_FRAMING_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <boost/asio/ip/tcp.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/transport/packet.h"
#include "daemon/transport/packet_writer.h"
#include "daemon/transport/payload_cipher.h"
#include "daemon/transport/send_watchdog.h"

namespace mlfabric::transport {

// Reads Mercury frames from a blocking socket. While data streams, a packet
// costs one system call instead of two: each payload read scatters
// whatever of the next header has already arrived into the header buffer.
// The socket's cipher is looked up once, when the reader is made (after
// the session's handshake).
class FrameReader {
 public:
  explicit FrameReader(int fd) : fd_(fd), cipher_(CipherOf(fd)) {}

  // The next header; Unavailable on a clean close before any byte of it.
  absl::StatusOr<PacketHeader> ReadHeader();
  // Exactly `size` payload bytes into `out` (and maybe the start of the
  // next header). Sealed, `size` must be the header's whole length: the
  // payload is decrypted in place and its tag checked.
  absl::Status ReadPayload(void* out, size_t size);

 private:
  // Reads a_size bytes into a, then b_size into b; bytes beyond them (the
  // start of the next header) land in head_.
  absl::Status ReadInto(uint8_t* a, size_t a_size, uint8_t* b, size_t b_size, const char* what);

  const int fd_;
  const std::shared_ptr<SessionCipher> cipher_;  // null: plaintext
  uint8_t head_[kHeaderBytes];
  size_t have_ = 0;  // bytes of the next header already read
  // Sealed sessions: the last header (the tag covers it) and its length.
  uint8_t sealed_head_[kHeaderBytes];
  uint32_t sealed_length_ = 0;
};

// Writes a packet: header and payload in one gather write, straight from
// the payload's buffer, bounded by `watchdog`. `crc`, when given, is the
// payload's CRC-32C computed earlier (otherwise it is computed here).
absl::Status WritePacket(SendWatchdog& watchdog, int fd, PacketHeader header, const void* payload,
                         uint32_t length, std::optional<uint32_t> crc = std::nullopt);

// Coalesced writes (packet_writer.h, PacketWriter::WriteFramesToPeer):
// frames[0] whole, bounded by `watchdog`, then what the socket takes of the
// rest without waiting: one gather write of them all on a plaintext
// socket, each packet sealed and written while the socket stays writable
// on an encrypted one (a packet is sealed only when it is sent, so the
// sequence of nonces never skips). A frame begun is finished. Returns how
// many frames were written whole.
absl::StatusOr<size_t> WriteFrames(SendWatchdog& watchdog, int fd, absl::Span<const Frame> frames);

// "ip:port" -> endpoint; InvalidArgument naming the address otherwise.
absl::StatusOr<boost::asio::ip::tcp::endpoint> ParseEndpoint(const std::string& address);

// Bounds how long a blocking read or write on TCP socket `fd` waits for a
// peer whose host has stopped answering (cut off, or gone without closing
// the connection): about 3 × `seconds` (0: the kernel's defaults, a read
// on a quiet connection waits for ever). Keepalive probes after `seconds`
// without traffic, two of them `seconds` apart; and TCP_USER_TIMEOUT for
// bytes sent and not acknowledged, the connect's too. The blocked call
// then fails with ETIMEDOUT. A peer that is alive but slow to answer is
// not affected: its kernel acknowledges the probes. Set it before connect
// to bound the connect as well. InvalidArgument for a negative `seconds`;
// the kernel's refusal names the option.
absl::Status SetPeerTimeout(int fd, double seconds);

}  // namespace mlfabric::transport

#endif  // MLFABRIC_DAEMON_TRANSPORT_FRAMING_H_
