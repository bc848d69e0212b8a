// PacketChecksums: the CRC-32C of every packet of a pushed buffer, computed
// while the scheduler plans its batch (the push waits for that anyway), so
// the sender loop does not checksum on the wire's critical path: perf showed
// the CRC costing the sender more than the kernel's copy (daemon/README.md).
//
//   auto sums = PacketChecksums::ForPush(tensors, buffer.size(), payload_bytes);
//   sums->SumAll(buffer.data(), &compute_pool);   // parts also on the pool's threads
//   ...
//   std::optional<uint32_t> crc = sums->Find(offset, length);     // sender: nullopt -> sum it
//   sums->MarkSending();   // the first packet goes: summing ahead would only take its CPU
//
// Packets are in the order the sender cuts them (PacketLayout). Large
// pushes are cut into up to one part per core, each a contiguous run of
// packets summed by whichever thread claims it first: the caller of SumAll
// or a thread of the daemon's fixed compute pool (no thread is started
// per push). A part's first done[p] checksums are final
// (release/acquire), so the sender can use whatever is done.
// Thread safety: SumAll's threads write, Find/Ready read concurrently.
#ifndef MLFABRIC_DAEMON_TRANSPORT_PACKET_CHECKSUMS_H_
#define MLFABRIC_DAEMON_TRANSPORT_PACKET_CHECKSUMS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <boost/asio/thread_pool.hpp>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "proto/local.pb.h"

namespace mlfabric::transport {

// Transfer offsets and lengths of the packets a push is cut into: its
// tensors (or the whole buffer) in order, each split every `payload_bytes`,
// clipped to the buffer.
void PacketLayout(const std::vector<v1::TensorInfo>& tensors, uint64_t total,
                  uint64_t payload_bytes, std::vector<uint64_t>* offsets,
                  std::vector<uint32_t>* lengths);

class PacketChecksums : public std::enable_shared_from_this<PacketChecksums> {
 public:
  // The layout of a push and how many parts it is summed in (1 to 8, at
  // most one per core and per kPacketsPerThread packets).
  static std::shared_ptr<PacketChecksums> ForPush(const std::vector<v1::TensorInfo>& tensors,
                                                  uint64_t total, uint64_t payload_bytes);
  static constexpr size_t kPacketsPerThread = 256;

  // Sums every packet of `data` on the calling thread, with the threads of
  // `pool` (may be null) helping with the parts they claim before it does;
  // returns when every part is done or when MarkSending stopped it. `data`
  // must stay valid until then.
  void SumAll(const uint8_t* data, boost::asio::thread_pool* pool = nullptr);
  // The precomputed CRC of the packet at [offset, +length), if there is one.
  std::optional<uint32_t> Find(uint64_t offset, uint32_t length) const;
  // Packets summed so far, over all parts.
  size_t Ready() const;
  size_t packets() const { return offsets_.size(); }
  size_t parts() const { return parts_; }
  void MarkSending() const { sending_.store(true, std::memory_order_relaxed); }

 private:
  void SumPart(const uint8_t* data, size_t part);
  // Sums parts not claimed yet, until none is left.
  void ClaimParts(const uint8_t* data) ABSL_LOCKS_EXCLUDED(finished_mu_);

  std::vector<uint64_t> offsets_;  // packet start within the transfer, ascending
  std::vector<uint32_t> lengths_;
  std::vector<uint32_t> crcs_;
  size_t part_size_ = 1;
  size_t parts_ = 0;
  std::unique_ptr<std::atomic<size_t>[]> done_;
  mutable std::atomic<bool> sending_{false};
  std::atomic<size_t> next_part_{0};  // the next part to claim
  Mutex finished_mu_;
  CondVar finished_cv_;  // parts_finished_ grew
  size_t parts_finished_ ABSL_GUARDED_BY(finished_mu_) = 0;
};

}  // namespace mlfabric::transport

#endif  // MLFABRIC_DAEMON_TRANSPORT_PACKET_CHECKSUMS_H_
