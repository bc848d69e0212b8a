#include "daemon/transport/send_watchdog.h"

#include <netinet/in.h>  // IPPROTO_TCP
#include <linux/tcp.h>  // tcp_info with tcpi_bytes_acked (glibc's lacks it)
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"

namespace mlfabric::transport {
namespace {

// The bytes the peer has acknowledged on TCP socket `fd`; nullopt for other
// sockets.
std::optional<uint64_t> BytesAcked(int fd) {
  tcp_info info{};
  socklen_t length = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0 ||
      length < offsetof(tcp_info, tcpi_bytes_acked) + sizeof(info.tcpi_bytes_acked)) {
    return std::nullopt;
  }
  return info.tcpi_bytes_acked;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

SendWatchdog::SendWatchdog(double timeout_s)
    : timeout_s_(timeout_s), timeout_ns_(static_cast<int64_t>(timeout_s * 1e9)) {
  thread_ = std::thread([this] { WatchLoop(); });
}

SendWatchdog::~SendWatchdog() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void SendWatchdog::Register(Write* write) {
  MutexLock lock(&mu_);
  write->next = writes_;
  if (writes_ != nullptr) writes_->prev = write;
  writes_ = write;
}

void SendWatchdog::Unregister(Write* write) {
  MutexLock lock(&mu_);
  if (write->prev != nullptr) write->prev->next = write->next;
  if (write->next != nullptr) write->next->prev = write->prev;
  if (writes_ == write) writes_ = write->next;
}

void SendWatchdog::WatchLoop() {
  const auto period = std::chrono::duration<double>(std::clamp(timeout_s_ / 4, 0.01, 1.0));
  MutexLock lock(&mu_);
  for (;;) {
    const auto deadline = std::chrono::steady_clock::now() + period;
    while (!stopping_ && !cv_.WaitWithDeadline(&mu_, deadline)) {
    }
    if (stopping_) break;
    const int64_t now = NowNs();
    for (Write* write = writes_; write != nullptr; write = write->next) {
      if (write->timed_out.load()) continue;
      // Bytes the peer acknowledged inside one long call are progress too.
      if (std::optional<uint64_t> acked = BytesAcked(write->fd)) {
        if (write->acked_seen && *acked != write->acked) write->progress_ns.store(now);
        write->acked_seen = true;
        write->acked = *acked;
      }
      if (now - write->progress_ns.load() < timeout_ns_) continue;
      // Under mu_: the write is still registered, so `fd` is still its
      // socket (the caller closes it only after SendAll returned).
      write->timed_out.store(true);
      ++timeouts_;
      ::shutdown(write->fd, SHUT_RDWR);  // wakes the blocked sendmsg
    }
  }
}

absl::Status SendWatchdog::SendAll(int fd, iovec* iov, int count) {
  Write write;
  write.fd = fd;
  write.progress_ns.store(NowNs());
  Register(&write);
  absl::Status status;
  while (count > 0) {
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = static_cast<size_t>(count);
    const ssize_t sent = ::sendmsg(fd, &message, MSG_NOSIGNAL);
    if (write.timed_out.load()) {
      status = absl::DeadlineExceededError(absl::StrCat(
          "send failed: the peer took no data for ", timeout_s_, " s (--send_timeout_s)"));
      break;
    }
    if (sent < 0) {
      if (errno == EINTR) continue;
      status = absl::UnavailableError(absl::StrCat("send failed: ", std::strerror(errno)));
      break;
    }
    write.progress_ns.store(NowNs());
    size_t left = static_cast<size_t>(sent);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  Unregister(&write);
  return status;
}

}  // namespace mlfabric::transport
