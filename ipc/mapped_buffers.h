// MappedBuffers: the mappings of received shared buffers (memfds), kept so
// that a buffer that comes back is not mapped again. Both ends reuse their
// buffers (a worker refills the push buffers its daemon released, the
// daemon lends get buffers from a pool), so the same file arrives over and
// over, each time as a new descriptor. Mapping it afresh (mmap with
// MAP_POPULATE, later munmap) took ~5% of a daemon's CPU samples and ~18%
// of a rank's in a 2-rank AllReduce of 1 M floats (daemon/README.md);
// finding the mapping by the file's identity costs one fstat.
//
//   MappedBuffers mappings;            // 16 mappings, 512 MiB at most
//   ASSIGN_OR_RETURN(SharedBuffer buf, mappings.Map(received_fd, bytes));
//   Read(buf.data(), buf.size());      // buf.size() == bytes
//
// A mapping is found by the file's (st_dev, st_ino) and reused if it covers
// the `size` bytes asked for; the new descriptor is closed then. Otherwise
// the file is mapped (that size) and kept, replacing a shorter mapping of
// it. The least recently used mappings go beyond the bounds. A returned
// SharedBuffer holds a share of its mapping: an evicted or cleared entry
// stays mapped until the last buffer viewing it is gone.
//
// The cache's own share is never read or written through: the memory is
// touched only through the SharedBuffers it returns, so a caller that
// asks "does anyone still use this buffer" of its SharedBuffer (the
// daemon's LocalPushDone.buffer_released) gets the same answer as without
// the cache. A kept mapping holds its file open, and the kernel numbers
// memfd inodes from a counter (64-bit since Linux 5.9) rather than reusing
// freed numbers, so an entry never stands for another file.
//
// One cache per peer: files from different applications must not share
// entries (the daemon keeps one per AppSession).
//
// Thread safety: all methods may be called concurrently (own lock, a leaf;
// mmap and munmap run outside it).
#ifndef MLFABRIC_IPC_MAPPED_BUFFERS_H_
#define MLFABRIC_IPC_MAPPED_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ipc/local_ipc.h"

namespace mlfabric {

class MappedBuffers {
 public:
  struct Bounds {
    size_t max_entries = 16;               // mappings kept
    size_t max_bytes = size_t{512} << 20;  // their bytes in all
  };
  MappedBuffers() : MappedBuffers(Bounds{}) {}
  explicit MappedBuffers(Bounds bounds) : bounds_(bounds) {}
  MappedBuffers(const MappedBuffers&) = delete;
  MappedBuffers& operator=(const MappedBuffers&) = delete;

  // As SharedBuffer::Map (takes ownership of `fd`, kInvalidArgument if the
  // file holds fewer than `size` bytes), reusing a kept mapping of the
  // same file. `*reused` (if not null) tells whether one was.
  absl::StatusOr<SharedBuffer> Map(int fd, size_t size, bool* reused = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets every mapping (those still viewed stay mapped until released).
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);

  // Maps that reused a kept mapping, and those that mapped the file.
  int64_t hits() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t misses() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t entries() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t mapped_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  const Bounds& bounds() const { return bounds_; }

 private:
  struct Entry {
    uint64_t device = 0;
    uint64_t inode = 0;
    std::shared_ptr<SharedMapping> mapping;
  };
  // Drops least recently used entries until the bounds hold; the caller
  // releases `dropped` after unlocking (that may munmap).
  void EvictLocked(std::list<Entry>* dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Bounds bounds_;
  mutable absl::Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);  // most recently used first
  size_t mapped_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mlfabric

#endif  // MLFABRIC_IPC_MAPPED_BUFFERS_H_
