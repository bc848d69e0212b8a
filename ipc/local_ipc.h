// Local IPC between an application and its host's daemon (docs/architecture.md §2):
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

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/local.pb.h"

namespace mlfabric {

// One read-write mmap of a memfd with its descriptor, which several
// SharedBuffers may view (MappedBuffers hands the mapping of a buffer that
// comes back again to each of them): unmapped and closed when its last
// holder drops it, so no holder ever sees the memory go.
//
// Thread safety: immutable after Map; the shared_ptr may be copied from
// any thread.
class SharedMapping {
 public:
  // Maps the first `size` bytes (> 0) of `fd`, taking ownership of `fd`
  // (closed on failure too). The caller has checked that the file holds
  // them (StatReceived).
  static absl::StatusOr<std::shared_ptr<SharedMapping>> Map(int fd, size_t size);
  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  int fd() const { return fd_; }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  SharedMapping(int fd, uint8_t* data, size_t size) : fd_(fd), data_(data), size_(size) {}

  const int fd_;
  uint8_t* const data_;
  const size_t size_;
};

// A shared-memory buffer backed by a memfd, mapped read-write. Move-only.
// It owns its mapping and descriptor (unmapped and closed on destruction),
// or is a view of a SharedMapping it holds a share of (View): then the
// mapping goes when its last holder does.
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
  // The first `size` bytes (<= mapping->size()) of a shared mapping; fd()
  // is the mapping's descriptor.
  static SharedBuffer View(std::shared_ptr<SharedMapping> mapping, size_t size);

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  // Set for a view: the mapping (and descriptor) belong to it, not to us.
  std::shared_ptr<SharedMapping> mapping_;
};

// Where a received descriptor's file is (its identity) and how long it is.
struct ReceivedFile {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t bytes = 0;
};

// fstat of a received descriptor (not closed here): kInvalidArgument if the
// file holds fewer than the `size` bytes a message claims for it.
absl::StatusOr<ReceivedFile> StatReceived(int fd, size_t size);

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
  // copy of the descriptor). On a non-blocking socket it waits for room as
  // a blocking one would, up to the stall timeout; then it shuts the channel
  // down (the message may be cut) and returns kDeadlineExceeded.
  absl::Status Send(v1::LocalMessage message, int fd = -1);
  // Blocks for the next message. `*fd` receives an attached descriptor (the
  // caller owns it) or -1. Returns kUnavailable when the peer closed, and
  // kDeadlineExceeded when a message stops arriving part-way for the stall
  // timeout (the next message may take any time).
  absl::Status Receive(v1::LocalMessage* message, int* fd);

  static constexpr int kDefaultStallTimeoutMs = 30000;
  // How long a message may stall part-way, sending or receiving.
  void set_stall_timeout_ms(int ms) { stall_ms_.store(ms); }

  // Unblocks a Receive in another thread and makes further calls fail.
  void Shutdown();
  int fd() const { return fd_; }

 private:
  int fd_;
  std::atomic<int> stall_ms_{kDefaultStallTimeoutMs};
  std::mutex send_mu_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_API_LOCAL_IPC_H_
