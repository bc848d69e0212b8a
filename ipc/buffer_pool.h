// BufferPool: shared buffers (memfds) kept for reuse once nobody holds
// them. A fresh memfd costs an allocation and a zeroing of every page on
// first touch (2-5 ms for 4 MiB on the development machine, and half the
// goodput of a receive, daemon/README.md); refilling one of the same size
// does not.
//
//   BufferPool pool({.max_per_size = 16, .max_bytes = 2 << 30});
//   std::shared_ptr<SharedBuffer> buffer = pool.Take(size);   // null: make a new one
//   ...
//   pool.Recycle(std::move(buffer));   // kept only if nobody else holds it
//
// The daemon keeps receive buffers, round sums and the get buffers its
// applications give back in one; a worker keeps the push buffers its
// daemon released in another (api/mlfabric.h).
//
// Thread safety: all methods may be called concurrently (own lock, a leaf).
#ifndef MLFABRIC_IPC_BUFFER_POOL_H_
#define MLFABRIC_IPC_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "ipc/local_ipc.h"

namespace mlfabric {

class BufferPool {
 public:
  struct Bounds {
    size_t max_per_size = 16;           // buffers of one size kept
    size_t max_bytes = size_t{2} << 30;  // bytes kept in all
  };
  BufferPool() : BufferPool(Bounds{}) {}
  explicit BufferPool(Bounds bounds) : bounds_(bounds) {}

  // A kept buffer of exactly `size` bytes (its old contents), or null.
  std::shared_ptr<SharedBuffer> Take(size_t size);
  // Keeps `buffer` for reuse if no one else holds it and the bounds allow.
  void Recycle(std::shared_ptr<SharedBuffer> buffer);
  size_t pooled_bytes() const;
  // Takes that found a buffer.
  int64_t reused() const;
  const Bounds& bounds() const { return bounds_; }

 private:
  const Bounds bounds_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<std::shared_ptr<SharedBuffer>>> free_;
  size_t pooled_bytes_ = 0;
  int64_t reused_ = 0;
};

}  // namespace mlfabric

#endif  // MLFABRIC_IPC_BUFFER_POOL_H_
