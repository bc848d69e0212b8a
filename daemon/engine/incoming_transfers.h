// IncomingTransfers: the transfers this host is receiving, or holds
// received until they are summed or delivered, by transfer id, each with
// its receive buffer. Buffers of transfers whose bytes were summed
// elsewhere go back to a BufferPool for the next transfer of that size: a
// fresh memfd costs a page fault and a zeroed page per 4 KiB
// (buffer_pool.h).
//
//   IncomingTransfers in(&pool);
//   in.Add(7, /*job=*/1, /*total=*/4096, buffer);
//   in.Find(7)->received += 4096;
//   if (in.Complete(7)) ...;
//   in.Recycle(7);   // forgotten; its buffer kept for the next
//
// Thread safety: none of its own; the receive side calls it under its
// ReceiveLock (receive_lock.h).
#ifndef MLFABRIC_DAEMON_RECEIVE_INCOMING_TRANSFERS_H_
#define MLFABRIC_DAEMON_RECEIVE_INCOMING_TRANSFERS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ipc/buffer_pool.h"
#include "ipc/local_ipc.h"

namespace mlfabric::daemon {

struct Incoming {
  uint32_t job_id = 0;
  uint64_t total = 0;
  uint64_t received = 0;
  double first_packet_s = -1;  // monotonic time of the first data packet
  std::shared_ptr<SharedBuffer> buffer;
  // Packets received before the transfer was known as a member of a
  // synchronous round or an aggregate: summed into it when it is.
  std::vector<std::pair<uint64_t, uint32_t>> unfolded;
  // The byte ranges received, merged: begin -> end.
  std::map<uint64_t, uint64_t> arrived;

  // Counts [offset, +length) as received; an error naming the transfer
  // if any of it was received before or it lies past `total` (then
  // nothing is counted). Bytes counted twice would complete a transfer
  // whose other bytes never came (a reused buffer's stale bytes).
  absl::Status Receive(uint64_t transfer, uint64_t offset, uint64_t length);
};

class IncomingTransfers {
 public:
  explicit IncomingTransfers(BufferPool* pool) : pool_(pool) {}
  IncomingTransfers(const IncomingTransfers&) = delete;
  IncomingTransfers& operator=(const IncomingTransfers&) = delete;

  // Null if `transfer` is not here.
  Incoming* Find(uint64_t transfer);
  const Incoming* Find(uint64_t transfer) const;
  bool Contains(uint64_t transfer) const { return transfers_.count(transfer) > 0; }
  // A new transfer of `total` bytes into `buffer`; replaces one of that id.
  Incoming& Add(uint64_t transfer, uint32_t job, uint64_t total,
                std::shared_ptr<SharedBuffer> buffer);
  // True if `transfer` is here with all its bytes in.
  bool Complete(uint64_t transfer) const;
  // Forgets `transfer`; false if it was not here.
  bool Erase(uint64_t transfer);
  // Forgets `transfer` (its bytes are summed already) and keeps its buffer
  // for the next transfer of that size, if nobody else holds it.
  void Recycle(uint64_t transfer);
  // Forgets `transfer` (bytes sent on a round grant whose push ended before
  // it was announced here, scheduler/service/round_grants.h) and refuses
  // it from now on: Discarded is true for the last kDiscardsKept such.
  void Discard(uint64_t transfer);
  bool Discarded(uint64_t transfer) const { return discarded_.count(transfer) > 0; }
  static constexpr size_t kDiscardsKept = 4096;
  // Empty if `transfer` has not arrived or arrived as `job`'s data; else
  // why it is refused (logged).
  std::string JobMismatch(uint64_t transfer, uint32_t job) const;
  size_t size() const { return transfers_.size(); }

 private:
  BufferPool* const pool_;
  std::map<uint64_t, Incoming> transfers_;
  std::set<uint64_t> discarded_;
  std::deque<uint64_t> discard_order_;  // oldest first
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_RECEIVE_INCOMING_TRANSFERS_H_
