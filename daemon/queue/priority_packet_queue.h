// The daemon's send queue: Mercury packet-level priority scheduling
// (mercury.md §IV-A key idea 2, §IV-C "Sending Buffer") with TensorLights
// job priority above it (tensorlights.md §IV, docs/architecture.md §5).
//
// A tensor is cut into Mercury packets (SplitTensor); the queue holds only
// PacketDescriptors -- a header plus a view into the sender's buffer, never
// a copy of the payload (§IV-C: "each Mercury packet in the FIFO queue ...
// contains only a header"). Each job has one FIFO per tensor priority; Pop()
// returns the packet minimising
//
//     (job rank at now_s, tensor priority, arrival sequence)
//
// where the job rank comes from the queue's JobPriorityPolicy (0 = highest)
// and the tensor priority is 0 = highest (default: the layer index, so front
// layers go first, §IV-B). The sequence number is unique and increasing, so
// the order is a strict total order and packets of equal priority leave in
// arrival order by construction (never a `<=` comparator, cf. ps-lite).
// In kFifo mode every job has rank 0, so packets of different jobs compete
// on tensor priority and then on arrival (see job_priority_policy.h).
//
// Starvation: the order is strict priority, as in both papers. A job or
// tensor priority that always has a higher-priority backlog ahead of it
// waits indefinitely; this is intended (preemption is the point, §IV-A) and
// bounded in practice because each iteration produces a finite amount of
// higher-priority data. Across jobs, kRr bounds the wait of a job to the
// time until it reaches rank 0, at most (n-1) rotation periods (§IV-C).
//
//   PriorityPacketQueue queue(JobPriorityPolicy({JobPriorityMode::kOne}));
//   queue.AddJob(/*job=*/1);
//   for (const PacketDescriptor& p :
//        SplitTensor({1, transfer, tensor, /*priority=*/layer}, bytes,
//                    32 * 1024, sizeof(float)).value()) {
//     queue.Push(p).IgnoreError();  // job is registered
//   }
//   while (std::optional<PacketDescriptor> p = queue.Pop(now_s)) Send(*p);
//
// Thread safety: not thread-safe; one owner (the daemon's send loop) calls
// it from one thread. Pop and Push are O(J + log P) for J jobs with queued
// packets and P distinct priorities of the chosen job.
#ifndef MLFABRIC_DAEMON_QUEUE_PRIORITY_PACKET_QUEUE_H_
#define MLFABRIC_DAEMON_QUEUE_PRIORITY_PACKET_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/queue/job_priority_policy.h"

namespace mlfabric::daemon {

using TransferId = uint64_t;
using TensorId = uint32_t;
// 0 is the highest tensor priority.
using TensorPriority = uint32_t;

// Default tensor priority (mercury.md §IV-B): the layer index, front layers
// first.
inline TensorPriority DefaultTensorPriority(uint32_t layer_index) {
  return layer_index;
}

// One Mercury packet as queued: header fields plus a non-owning view of the
// payload in the sender's buffer (e.g. the shared-memory segment the
// application wrote). The buffer must outlive the descriptor's time in the
// queue and on the wire.
struct PacketDescriptor {
  JobId job_id = 0;
  TransferId transfer_id = 0;
  TensorId tensor_id = 0;
  uint64_t offset_bytes = 0;  // within the tensor
  uint32_t length_bytes = 0;
  TensorPriority tensor_priority = 0;
  const std::byte* payload = nullptr;  // not owned; payload[0, length_bytes)
};

// Identifies the tensor a SplitTensor call cuts up.
struct TensorRef {
  JobId job_id = 0;
  TransferId transfer_id = 0;
  TensorId tensor_id = 0;
  TensorPriority tensor_priority = 0;
};

// Cuts `tensor` into packets of `packet_bytes` (the last may be shorter).
// No element straddles two packets (§IV-C): `packet_bytes` and the tensor
// size must be multiples of `element_bytes`. InvalidArgument otherwise or
// when packet_bytes == 0 or > 4 GiB - 1. An empty tensor gives no packets.
absl::StatusOr<std::vector<PacketDescriptor>> SplitTensor(
    const TensorRef& tensor, absl::Span<const std::byte> bytes,
    uint32_t packet_bytes, uint32_t element_bytes = 1);

class PriorityPacketQueue {
 public:
  explicit PriorityPacketQueue(JobPriorityPolicy policy = JobPriorityPolicy());

  // Job arrival/departure (forwarded to the policy, which re-ranks).
  // RemoveJob drops the job's queued packets and returns how many.
  absl::Status AddJob(JobId job, double rank_key = 0.0);
  absl::StatusOr<size_t> RemoveJob(JobId job);
  // A registered job's new rank_key (JobPriorityPolicy::SetRankKey); its
  // queued packets leave in the new order from the next Pop.
  absl::Status SetJobRankKey(JobId job, double rank_key) {
    return policy_.SetRankKey(job, rank_key);
  }

  // Enqueues a packet. FailedPrecondition if its job is not registered
  // (so a packet can never sit in the queue unranked).
  absl::Status Push(const PacketDescriptor& packet);

  // Removes and returns the next packet at `now_s`; nullopt when empty.
  std::optional<PacketDescriptor> Pop(double now_s);
  // The packet Pop(now_s) would return, without removing it.
  std::optional<PacketDescriptor> Peek(double now_s) const;
  // The packet Pop(now_s) would return if the packets of the transfers in
  // `skip` were not queued (the same strict order among the rest); nullopt
  // when there is none. For a sender whose more urgent transfers wait for
  // their pacers' tokens: each scheduled transfer has its own reservation,
  // so a paced one must not hold back the others (head-of-line blocking).
  // O(J + packets skipped).
  std::optional<PacketDescriptor> PeekSkipping(double now_s,
                                               const absl::flat_hash_set<TransferId>& skip) const;
  // Removes the queued packet `packet` (a Peek or PeekSkipping result:
  // same transfer, tensor and offset); false when it is not queued.
  bool Remove(const PacketDescriptor& packet);
  // The same, also giving the packet's place in the order (*sequence), so
  // that a packet taken but not sent can be put back where it was.
  bool Remove(const PacketDescriptor& packet, uint64_t* sequence);
  // Puts back a packet that Remove(packet, &sequence) took: the order is
  // exactly as if it had never left (a coalesced write the kernel took
  // only part of, send_scheduler.h). FailedPrecondition if its job is no
  // longer registered.
  absl::Status Restore(const PacketDescriptor& packet, uint64_t sequence);

  // Drops every queued packet of one transfer (cancel, drop, failure);
  // returns how many were removed. Order of the rest is unchanged.
  size_t RemoveTransfer(TransferId transfer);

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  uint64_t queued_bytes() const { return queued_bytes_; }

  const JobPriorityPolicy& policy() const { return policy_; }

 private:
  struct Entry {
    uint64_t sequence;
    PacketDescriptor packet;
  };
  // One FIFO per tensor priority; empty FIFOs are erased so begin() is the
  // highest non-empty priority.
  using JobQueues = std::map<TensorPriority, std::deque<Entry>>;

  // The job whose head packet is next, or nullptr if all are empty.
  const std::pair<const JobId, JobQueues>* Choose(double now_s) const;

  JobPriorityPolicy policy_;
  absl::flat_hash_map<JobId, JobQueues> jobs_;  // registered jobs
  uint64_t next_sequence_ = 0;
  size_t size_ = 0;
  uint64_t queued_bytes_ = 0;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_QUEUE_PRIORITY_PACKET_QUEUE_H_
