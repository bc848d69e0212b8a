#include "daemon/transport/framing.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

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
  absl::StatusOr<PacketHeader> header = ParseHeader(head_, sizeof(head_), kMaxPayloadBytes);
  if (!header.ok()) return header;
  const bool sealed = (header->flags & kFlagSealed) != 0;
  if (cipher_ == nullptr) {
    if (sealed) {
      return absl::InvalidArgumentError(
          "a sealed packet on a session that is not encrypted (is data_plane_encryption the same "
          "at both ends?)");
    }
    return header;
  }
  if (!sealed) return absl::InvalidArgumentError("a plaintext packet on an encrypted session");
  std::memcpy(sealed_head_, head_, sizeof(head_));
  sealed_length_ = header->length;
  if (header->length == 0) {
    // Nothing to decrypt, but the tag still vouches for the header.
    uint8_t tag[kTagBytes];
    RETURN_IF_ERROR(ReadInto(tag, sizeof(tag), nullptr, 0, "tag"));
    RETURN_IF_ERROR(cipher_->receive.Open(
        std::string_view(reinterpret_cast<const char*>(sealed_head_), kHeaderBytes), nullptr, 0,
        tag));
  }
  return header;
}

absl::Status FrameReader::ReadInto(uint8_t* a, size_t a_size, uint8_t* b, size_t b_size,
                                   const char* what) {
  const size_t size = a_size + b_size;
  size_t got = 0;
  while (got < size) {
    iovec iov[3];
    int count = 0;
    if (got < a_size) iov[count++] = {a + got, a_size - got};
    if (b_size > 0) {
      const size_t into_b = got > a_size ? got - a_size : 0;
      iov[count++] = {b + into_b, b_size - into_b};
    }
    iov[count++] = {head_, sizeof(head_)};
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = count;
    const ssize_t n = ::recvmsg(fd_, &message, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("truncated frame: ", what, " cut after ", got, " of ", size, " bytes (",
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

absl::Status FrameReader::ReadPayload(void* out, size_t size) {
  auto* dst = static_cast<uint8_t*>(out);
  if (cipher_ == nullptr) return ReadInto(dst, size, nullptr, 0, "payload");
  if (size != sealed_length_) {
    return absl::InternalError(absl::StrCat("sealed payload read of ", size,
                                            " bytes; the header says ", sealed_length_));
  }
  uint8_t tag[kTagBytes];
  RETURN_IF_ERROR(ReadInto(dst, size, tag, sizeof(tag), "payload"));
  return cipher_->receive.Open(
      std::string_view(reinterpret_cast<const char*>(sealed_head_), kHeaderBytes), dst, size,
      tag);
}

absl::Status WritePacket(SendWatchdog& watchdog, int fd, PacketHeader header, const void* payload,
                         uint32_t length, std::optional<uint32_t> crc) {
  uint8_t head[kHeaderBytes];
  // Sealed or not is the socket's, whatever header a relay copied.
  header.flags &= static_cast<uint16_t>(~kFlagSealed);
  if (std::shared_ptr<SessionCipher> cipher = CipherOf(fd)) {
    if (cipher->closed.load()) return absl::UnavailableError("the encrypted session is closing");
    header.flags |= kFlagSealed;
    header.length = length;
    header.crc32c = 0;  // the tag replaces it, and a CRC would tell of the plaintext
    EncodeHeader(header, head);
    std::lock_guard<std::mutex> lock(cipher->send_mu);
    cipher->ciphertext.resize(length);
    uint8_t tag[kTagBytes];
    RETURN_IF_ERROR(cipher->send.Seal(std::string_view(reinterpret_cast<const char*>(head),
                                                       kHeaderBytes),
                                      payload, length, cipher->ciphertext.data(), tag));
    iovec iov[3] = {{head, sizeof(head)}, {cipher->ciphertext.data(), length}, {tag, kTagBytes}};
    if (length == 0) {
      iov[1] = iov[2];
      return watchdog.SendAll(fd, iov, 2);
    }
    return watchdog.SendAll(fd, iov, 3);
  }
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

absl::StatusOr<size_t> WriteFrames(SendWatchdog& watchdog, int fd,
                                   absl::Span<const Frame> frames) {
  if (frames.empty()) return size_t{0};
  if (CipherOf(fd) != nullptr) {
    // Sealed: one packet at a time, while the kernel takes more at once.
    for (size_t i = 0; i < frames.size(); ++i) {
      if (i > 0) {
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, 0) <= 0 || (p.revents & POLLOUT) == 0) return i;
      }
      const Frame& f = frames[i];
      RETURN_IF_ERROR(WritePacket(watchdog, fd, f.header, f.payload, f.length, f.crc));
    }
    return frames.size();
  }
  // Plaintext: every header, then one gather write of all frames (on the
  // stack: this runs per packet run, and allocating cost the sender ~10%
  // of its CPU per byte).
  constexpr size_t kMaxFrames = 128;  // IOV_MAX is 1024: two entries a frame
  const size_t n = std::min(frames.size(), kMaxFrames);
  uint8_t heads[kMaxFrames * kHeaderBytes];
  iovec iov_store[2 * kMaxFrames];
  size_t frame_end[kMaxFrames];  // index in iov one past each frame
  size_t entries = 0;
  for (size_t i = 0; i < n; ++i) {
    PacketHeader header = frames[i].header;
    header.flags &= static_cast<uint16_t>(~kFlagSealed);
    uint8_t* head = heads + i * kHeaderBytes;
    if (frames[i].crc.has_value()) {
      header.length = frames[i].length;
      header.crc32c = *frames[i].crc;
      EncodeHeader(header, head);
    } else {
      EncodePacketHeader(header, frames[i].payload, frames[i].length, head);
    }
    iov_store[entries++] = {head, kHeaderBytes};
    if (frames[i].length > 0) {
      iov_store[entries++] = {const_cast<void*>(frames[i].payload), frames[i].length};
    }
    frame_end[i] = entries;
  }
  iovec* const iov = iov_store;
  msghdr message{};
  message.msg_iov = iov;
  message.msg_iovlen = entries;
  ssize_t taken = ::sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (taken < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("send failed: ", std::strerror(errno)));
    }
    taken = 0;
  }
  // The frames the kernel took whole, and the one it took part of (or the
  // first, if it took nothing: that one is written whatever it takes).
  size_t left = static_cast<size_t>(taken);
  size_t entry = 0;
  while (entry < entries && left >= iov[entry].iov_len) left -= iov[entry++].iov_len;
  size_t whole = 0;
  while (whole < n && frame_end[whole] <= entry) ++whole;
  if (whole == n) return n;
  const size_t start = whole == 0 ? 0 : frame_end[whole - 1];
  const bool begun = entry > start || left > 0;
  if (whole > 0 && !begun) return whole;
  // Finish frame `whole` (begun, or the first): the rest of its entries.
  iov[entry].iov_base = static_cast<uint8_t*>(iov[entry].iov_base) + left;
  iov[entry].iov_len -= left;
  RETURN_IF_ERROR(watchdog.SendAll(fd, iov + entry,
                                   static_cast<int>(frame_end[whole] - entry)));
  return whole + 1;
}

absl::Status SetPeerTimeout(int fd, double seconds) {
  if (!(seconds >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("peer timeout: ", seconds, " s is not >= 0"));
  }
  if (seconds == 0) return absl::OkStatus();
  const int probe_s = std::max(1, static_cast<int>(std::lround(seconds)));  // whole seconds
  const int one = 1, probes = 2;
  const unsigned int user_timeout_ms =
      static_cast<unsigned int>(std::lround(3 * std::max(seconds, 1.0) * 1000));
  struct Option {
    int level, name;
    const void* value;
    socklen_t size;
    const char* what;
  };
  const Option options[] = {
      {SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one), "SO_KEEPALIVE"},
      {IPPROTO_TCP, TCP_KEEPIDLE, &probe_s, sizeof(probe_s), "TCP_KEEPIDLE"},
      {IPPROTO_TCP, TCP_KEEPINTVL, &probe_s, sizeof(probe_s), "TCP_KEEPINTVL"},
      {IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes), "TCP_KEEPCNT"},
      {IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms),
       "TCP_USER_TIMEOUT"},
  };
  for (const Option& option : options) {
    if (::setsockopt(fd, option.level, option.name, option.value, option.size) != 0) {
      return absl::InternalError(
          absl::StrCat("peer timeout: setsockopt ", option.what, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
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
