#include "daemon/transport/framing.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace mlfabric::transport {

absl::StatusOr<PacketHeader> FrameReader::ReadHeader() {
  while (have_ < sizeof(head_)) {
    const ssize_t n = ::recv(fd_, head_ + have_, sizeof(head_) - have_, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n == 0 ? "closed" : std::strerror(errno);
      if (have_ == 0) return absl::UnavailableError(why);
      return absl::InvalidArgumentError(
          absl::StrCat("truncated frame: header cut after ", have_, " bytes (", why, ")"));
    }
    have_ += static_cast<size_t>(n);
  }
  have_ = 0;
  return ParseHeader(head_, sizeof(head_), kMaxPayloadBytes);
}

absl::Status FrameReader::ReadPayload(void* out, size_t size) {
  auto* dst = static_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < size) {
    iovec iov[2] = {{dst + got, size - got}, {head_, sizeof(head_)}};
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = 2;
    const ssize_t n = ::recvmsg(fd_, &message, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("truncated frame: payload cut after ", got, " of ", size, " bytes (",
                       n == 0 ? "closed" : std::strerror(errno), ")"));
    }
    const size_t bytes = static_cast<size_t>(n);
    if (bytes > size - got) {
      have_ = bytes - (size - got);
      got = size;
    } else {
      got += bytes;
    }
  }
  return absl::OkStatus();
}

absl::Status WritePacket(SendWatchdog& watchdog, int fd, PacketHeader header, const void* payload,
                         uint32_t length, std::optional<uint32_t> crc) {
  uint8_t head[kHeaderBytes];
  if (crc.has_value()) {
    header.length = length;
    header.crc32c = *crc;
    EncodeHeader(header, head);
  } else {
    EncodePacketHeader(header, payload, length, head);
  }
  iovec iov[2] = {{head, sizeof(head)}, {const_cast<void*>(payload), length}};
  return watchdog.SendAll(fd, iov, length > 0 ? 2 : 1);
}

absl::StatusOr<boost::asio::ip::tcp::endpoint> ParseEndpoint(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "' is not ip:port"));
  }
  boost::system::error_code error;
  auto ip = boost::asio::ip::make_address(address.substr(0, colon), error);
  if (error) return absl::InvalidArgumentError(absl::StrCat("bad address '", address, "'"));
  const int port = std::atoi(address.substr(colon + 1).c_str());
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad port in '", address, "'"));
  }
  return boost::asio::ip::tcp::endpoint(ip, static_cast<uint16_t>(port));
}

}  // namespace mlfabric::transport
