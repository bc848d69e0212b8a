// BufferPool: receive buffers kept for reuse once the server acknowledged
// their update. A fresh memfd costs a page fault per 4 KiB on first touch,
// which halved goodput (daemon/README.md); reusing one of the same size
// does not.
//
//   std::shared_ptr<SharedBuffer> buffer = pool.Take(size);   // null: make a new one
//   ...
//   pool.Recycle(std::move(buffer));   // kept only if nobody else holds it
//
// Bounded: at most kMaxPooledBytes in all and kMaxPerSize buffers of one size
// (a synchronous root holds rounds_kept sums, the receive buffers of a
// round's members and the copies lent to its own ranks' gets, all of one
// size: 4 per size made every other round allocate afresh).
// Thread safety: all methods may be called concurrently (own lock).
#ifndef MLFABRIC_DAEMON_ENGINE_BUFFER_POOL_H_
#define MLFABRIC_DAEMON_ENGINE_BUFFER_POOL_H_

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "ipc/local_ipc.h"

namespace mlfabric::daemon {

class BufferPool {
 public:
  static constexpr size_t kMaxPooledBytes = size_t{2} << 30;
  static constexpr size_t kMaxPerSize = 16;

  std::shared_ptr<SharedBuffer> Take(size_t size);
  // Keeps `buffer` for reuse if no one else holds it and the bounds allow.
  void Recycle(std::shared_ptr<SharedBuffer> buffer);
  size_t pooled_bytes() const;

 private:
  mutable std::mutex mu_;
  std::map<size_t, std::vector<std::shared_ptr<SharedBuffer>>> free_;
  size_t pooled_bytes_ = 0;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_BUFFER_POOL_H_
