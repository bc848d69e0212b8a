// Mercury framing on a TCP socket (mercury.md §IV; DESIGN.md §5): what the
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
#include "daemon/transport/packet.h"
#include "daemon/transport/send_watchdog.h"

namespace mlfabric::transport {

// Reads Mercury frames from a blocking socket. While data streams, a packet
// costs one system call instead of two: each payload read scatters
// whatever of the next header has already arrived into the header buffer.
class FrameReader {
 public:
  explicit FrameReader(int fd) : fd_(fd) {}

  // The next header; Unavailable on a clean close before any byte of it.
  absl::StatusOr<PacketHeader> ReadHeader();
  // Exactly `size` payload bytes into `out` (and maybe the start of the
  // next header).
  absl::Status ReadPayload(void* out, size_t size);

 private:
  const int fd_;
  uint8_t head_[kHeaderBytes];
  size_t have_ = 0;  // bytes of the next header already read
};

// Writes a packet: header and payload in one gather write, straight from
// the payload's buffer, bounded by `watchdog`. `crc`, when given, is the
// payload's CRC-32C computed earlier (otherwise it is computed here).
absl::Status WritePacket(SendWatchdog& watchdog, int fd, PacketHeader header, const void* payload,
                         uint32_t length, std::optional<uint32_t> crc = std::nullopt);

// "ip:port" -> endpoint; InvalidArgument naming the address otherwise.
absl::StatusOr<boost::asio::ip::tcp::endpoint> ParseEndpoint(const std::string& address);

}  // namespace mlfabric::transport

#endif  // MLFABRIC_DAEMON_TRANSPORT_FRAMING_H_
