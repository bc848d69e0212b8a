// Local IPC between an application and its host's daemon (DESIGN.md §2):
// length-prefixed LocalMessage protos over a Unix-domain stream socket, with
// tensor bytes in shared memory (a memfd) whose descriptor travels as
// SCM_RIGHTS ancillary data, so the socket never carries tensor bytes.
//
//   ASSIGN_OR_RETURN(SharedBuffer buf, SharedBuffer::Create(bytes));
//   std::memcpy(buf.data(), update, bytes);
//   LocalChannel channel(fd);
//   RETURN_IF_ERROR(channel.Send(message, buf.fd()));
//
//   LocalMessage reply; int reply_fd = -1;
//   RETURN_IF_ERROR(channel.Receive(&reply, &reply_fd));
//   ASSIGN_OR_RETURN(SharedBuffer model, SharedBuffer::Map(reply_fd, bytes));
//
// Thread safety: Send may be called from several threads (serialised by an
// internal mutex); Receive from one thread at a time.
#ifndef MLFABRIC_API_LOCAL_IPC_H_
#define MLFABRIC_API_LOCAL_IPC_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/local.pb.h"

namespace mlfabric {

// A shared-memory buffer backed by a memfd, mapped read-write. Move-only;
// unmaps and closes on destruction.
class SharedBuffer {
 public:
  SharedBuffer() = default;
  ~SharedBuffer();
  SharedBuffer(SharedBuffer&& other) noexcept;
  SharedBuffer& operator=(SharedBuffer&& other) noexcept;
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;

  static absl::StatusOr<SharedBuffer> Create(size_t size);
  // Maps a received descriptor (takes ownership of `fd`); the file must hold
  // at least `size` bytes.
  static absl::StatusOr<SharedBuffer> Map(int fd, size_t size);

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

inline constexpr uint32_t kMaxLocalMessageBytes = 1 << 20;

class LocalChannel {
 public:
  explicit LocalChannel(int fd) : fd_(fd) {}
  ~LocalChannel();
  LocalChannel(const LocalChannel&) = delete;
  LocalChannel& operator=(const LocalChannel&) = delete;

  // Connects to the daemon's socket, retrying until `timeout_s` passes (the
  // daemon may still be starting).
  static absl::StatusOr<int> Connect(const std::string& path, double timeout_s);

  // Sends `message`; when `fd` >= 0 it is attached (the caller keeps its own
  // copy of the descriptor).
  absl::Status Send(v1::LocalMessage message, int fd = -1);
  // Blocks for the next message. `*fd` receives an attached descriptor (the
  // caller owns it) or -1. Returns kUnavailable when the peer closed.
  absl::Status Receive(v1::LocalMessage* message, int* fd);

  // Unblocks a Receive in another thread and makes further calls fail.
  void Shutdown();
  int fd() const { return fd_; }

 private:
  int fd_;
  std::mutex send_mu_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_API_LOCAL_IPC_H_
