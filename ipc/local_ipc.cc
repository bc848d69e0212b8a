#include "ipc/local_ipc.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace mlfabric {
namespace {

// Buffers up to this size have their pages allocated when mapped: it saves
// the page faults of small and medium tensors (an AllReduce of 1 M floats).
// Larger ones fault in while they stream: allocating them first holds up
// the transfer (a receiving daemon stops reading its socket meanwhile, and
// 1 GiB took seconds, tests/preemption_test).
constexpr size_t kPopulateMaxBytes = size_t{8} << 20;

int PopulateFlag(size_t size) { return size <= kPopulateMaxBytes ? MAP_POPULATE : 0; }

absl::Status ErrnoError(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// A channel's socket may be non-blocking: the daemon waits for it to be
// readable through Boost.Asio, which sets O_NONBLOCK on any descriptor it
// waits on. A read or write that would block then waits here for the
// socket, as a blocking call would, rather than failing: failing ended the
// application's session with part of a message read (the application saw
// "Connection reset by peer") and lost a message to the application whose
// socket buffer was full. It waits up to `timeout_ms` (-1: for ever).
enum class Wait { kRetry, kFailed, kStalled };
Wait WaitFor(int fd, short events, int timeout_ms) {
  if (errno == EINTR) return Wait::kRetry;
  if (errno != EAGAIN && errno != EWOULDBLOCK) return Wait::kFailed;
  pollfd p{fd, events, 0};
  while (true) {
    const int ready = ::poll(&p, 1, timeout_ms);
    if (ready > 0) return Wait::kRetry;  // ready, or hung up: the retried call says which
    if (ready == 0) return Wait::kStalled;
    if (errno != EINTR) return Wait::kFailed;
  }
}

absl::Status Stalled(const char* what, int timeout_ms) {
  return absl::DeadlineExceededError(
      absl::StrCat("the local peer ", what, " for ", timeout_ms / 1000.0, " s mid-message"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<SharedMapping>> SharedMapping::Map(int fd, size_t size) {
  // A received buffer is read (or written) whole: map its pages at once
  // (unless huge, see kPopulateMaxBytes).
  void* mapped =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | PopulateFlag(size), fd, 0);
  if (mapped == MAP_FAILED) {
    absl::Status error = ErrnoError("mmap of received buffer");
    ::close(fd);
    return error;
  }
  return std::shared_ptr<SharedMapping>(
      new SharedMapping(fd, static_cast<uint8_t*>(mapped), size));
}

SharedMapping::~SharedMapping() {
  ::munmap(data_, size_);
  ::close(fd_);
}

SharedBuffer::~SharedBuffer() {
  if (mapping_ != nullptr) return;  // a view: the mapping's last holder unmaps
  if (data_ != nullptr && size_ > 0) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

SharedBuffer::SharedBuffer(SharedBuffer&& other) noexcept
    : fd_(other.fd_), data_(other.data_), size_(other.size_), mapping_(std::move(other.mapping_)) {
  other.fd_ = -1;
  other.data_ = nullptr;
  other.size_ = 0;
  other.mapping_ = nullptr;
}

SharedBuffer& SharedBuffer::operator=(SharedBuffer&& other) noexcept {
  if (this != &other) {
    this->~SharedBuffer();
    new (this) SharedBuffer(std::move(other));
  }
  return *this;
}

SharedBuffer SharedBuffer::View(std::shared_ptr<SharedMapping> mapping, size_t size) {
  SharedBuffer buffer;
  buffer.fd_ = mapping->fd();
  buffer.data_ = mapping->data();
  buffer.size_ = std::min(size, mapping->size());
  buffer.mapping_ = std::move(mapping);
  return buffer;
}

absl::StatusOr<ReceivedFile> StatReceived(int fd, size_t size) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("fstat on received buffer");
  if (static_cast<uint64_t>(st.st_size) < size) {
    return absl::InvalidArgumentError(absl::StrCat("shared buffer holds ", st.st_size,
                                                   " bytes but the message claims ", size));
  }
  return ReceivedFile{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                      static_cast<uint64_t>(st.st_size)};
}

absl::StatusOr<SharedBuffer> SharedBuffer::Create(size_t size) {
  SharedBuffer buffer;
  buffer.fd_ = ::memfd_create("mlfabric-tensor", MFD_CLOEXEC);
  if (buffer.fd_ < 0) return ErrnoError("memfd_create");
  if (size > 0 && ::ftruncate(buffer.fd_, static_cast<off_t>(size)) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot size shared buffer to ", size, " bytes: ", std::strerror(errno)));
  }
  buffer.size_ = size;
  if (size > 0) {
    // MAP_POPULATE: every creator fills the whole buffer (a push's copy, a
    // receive, a sum); allocating its pages in one call costs a fraction of
    // a page fault per 4 KiB on first touch (daemon/README.md). Not for huge
    // buffers: there it would hold up the start of a transfer whose pages
    // are otherwise faulted in while it streams.
    void* mapped = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | PopulateFlag(size),
                          buffer.fd_, 0);
    if (mapped == MAP_FAILED) return ErrnoError("mmap");
    buffer.data_ = static_cast<uint8_t*>(mapped);
  }
  return buffer;
}

absl::StatusOr<SharedBuffer> SharedBuffer::Map(int fd, size_t size) {
  SharedBuffer buffer;
  buffer.fd_ = fd;
  if (absl::StatusOr<ReceivedFile> file = StatReceived(fd, size); !file.ok()) return file.status();
  buffer.size_ = size;
  if (size > 0) {
    // A received buffer is read (or written) whole: map its pages at once
    // (unless huge, as above).
    void* mapped = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | PopulateFlag(size),
                          fd, 0);
    if (mapped == MAP_FAILED) return ErrnoError("mmap of received buffer");
    buffer.data_ = static_cast<uint8_t*>(mapped);
  }
  return buffer;
}

LocalChannel::~LocalChannel() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<int> LocalChannel::Connect(const std::string& path, double timeout_s) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", path));
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ErrnoError("socket");
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
    const int err = errno;
    ::close(fd);
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "cannot reach the MLfabric daemon at ", path, ": ", std::strerror(err),
          " (is mlfabricd running? set MLFABRIC_DAEMON_SOCKET to its --local_socket)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

absl::Status LocalChannel::Send(v1::LocalMessage message, int fd) {
  message.set_has_fd(fd >= 0);
  std::string body;
  if (!message.SerializeToString(&body)) return absl::InternalError("cannot serialize message");
  const uint32_t length = static_cast<uint32_t>(body.size());
  uint8_t prefix[4] = {static_cast<uint8_t>(length), static_cast<uint8_t>(length >> 8),
                       static_cast<uint8_t>(length >> 16), static_cast<uint8_t>(length >> 24)};
  std::lock_guard<std::mutex> lock(send_mu_);
  iovec iov[2] = {{prefix, sizeof(prefix)}, {body.data(), body.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  }
  size_t total = sizeof(prefix) + body.size();
  size_t sent_total = 0;
  while (sent_total < total) {
    ssize_t sent = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      const int stall_ms = stall_ms_.load();
      switch (WaitFor(fd_, POLLOUT, stall_ms)) {
        case Wait::kRetry:
          continue;
        case Wait::kStalled:
          // Part of the message may be out: the stream is cut, the peer
          // sees the channel close.
          Shutdown();
          return Stalled("read nothing", stall_ms);
        case Wait::kFailed:
          break;
      }
      return ErrnoError("send to local peer");
    }
    sent_total += static_cast<size_t>(sent);
    // The descriptor went with the first chunk; send the rest plainly.
    msg.msg_control = nullptr;
    msg.msg_controllen = 0;
    size_t skip = static_cast<size_t>(sent);
    while (msg.msg_iovlen > 0 && skip >= msg.msg_iov[0].iov_len) {
      skip -= msg.msg_iov[0].iov_len;
      ++msg.msg_iov;
      --msg.msg_iovlen;
    }
    if (msg.msg_iovlen > 0) {
      msg.msg_iov[0].iov_base = static_cast<char*>(msg.msg_iov[0].iov_base) + skip;
      msg.msg_iov[0].iov_len -= skip;
    }
  }
  return absl::OkStatus();
}

absl::Status LocalChannel::Receive(v1::LocalMessage* message, int* fd) {
  *fd = -1;
  uint8_t prefix[4];
  size_t got = 0;
  // Read the prefix with recvmsg so an attached descriptor is collected.
  while (got < sizeof(prefix)) {
    iovec iov{prefix + got, sizeof(prefix) - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      // The next message may be long in coming; the rest of one is not.
      const int stall_ms = got == 0 ? -1 : stall_ms_.load();
      const Wait wait = WaitFor(fd_, POLLIN, stall_ms);
      if (wait == Wait::kRetry) continue;
      if (wait == Wait::kStalled) return Stalled("sent nothing more", stall_ms);
      return ErrnoError("receive from local peer");
    }
    if (n == 0) return absl::UnavailableError("local peer closed the connection");
    for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
      if (cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS) {
        int received;
        std::memcpy(&received, CMSG_DATA(cmsg), sizeof(int));
        if (*fd >= 0) ::close(*fd);
        *fd = received;
      }
    }
    got += static_cast<size_t>(n);
  }
  const uint32_t length = prefix[0] | (prefix[1] << 8) | (prefix[2] << 16) |
                          (static_cast<uint32_t>(prefix[3]) << 24);
  if (length > kMaxLocalMessageBytes) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
    return absl::InvalidArgumentError(
        absl::StrCat("local message of ", length, " bytes exceeds the limit"));
  }
  std::string body(length, '\0');
  size_t read_total = 0;
  while (read_total < length) {
    ssize_t n = ::recv(fd_, body.data() + read_total, length - read_total, 0);
    if (n < 0) {
      const int stall_ms = stall_ms_.load();
      const Wait wait = WaitFor(fd_, POLLIN, stall_ms);
      if (wait == Wait::kRetry) continue;
      if (wait == Wait::kStalled) {
        if (*fd >= 0) ::close(*fd);
        *fd = -1;
        return Stalled("sent nothing more", stall_ms);
      }
      return ErrnoError("receive from local peer");
    }
    if (n == 0) return absl::UnavailableError("local peer closed the connection mid-message");
    read_total += static_cast<size_t>(n);
  }
  if (!message->ParseFromString(body)) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
    return absl::InvalidArgumentError("malformed local message");
  }
  if (message->has_fd() != (*fd >= 0)) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
    return absl::InvalidArgumentError("local message descriptor flag does not match");
  }
  return absl::OkStatus();
}

void LocalChannel::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

}  // namespace mlfabric
