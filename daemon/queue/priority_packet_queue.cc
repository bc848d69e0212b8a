#include "daemon/queue/priority_packet_queue.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mlfabric::daemon {

absl::StatusOr<std::vector<PacketDescriptor>> SplitTensor(
    const TensorRef& tensor, absl::Span<const std::byte> bytes,
    uint32_t packet_bytes, uint32_t element_bytes) {
  if (packet_bytes == 0 || element_bytes == 0) {
    return absl::InvalidArgumentError("packet_bytes and element_bytes must be positive");
  }
  if (packet_bytes % element_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("packet_bytes ", packet_bytes,
                     " is not a multiple of element_bytes ", element_bytes));
  }
  if (bytes.size() % element_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", tensor.tensor_id, " size ", bytes.size(),
                     " is not a multiple of element_bytes ", element_bytes));
  }
  std::vector<PacketDescriptor> packets;
  packets.reserve((bytes.size() + packet_bytes - 1) / packet_bytes);
  for (uint64_t offset = 0; offset < bytes.size(); offset += packet_bytes) {
    PacketDescriptor p;
    p.job_id = tensor.job_id;
    p.transfer_id = tensor.transfer_id;
    p.tensor_id = tensor.tensor_id;
    p.tensor_priority = tensor.tensor_priority;
    p.offset_bytes = offset;
    p.length_bytes = static_cast<uint32_t>(
        std::min<uint64_t>(packet_bytes, bytes.size() - offset));
    p.payload = bytes.data() + offset;
    packets.push_back(p);
  }
  return packets;
}

PriorityPacketQueue::PriorityPacketQueue(JobPriorityPolicy policy)
    : policy_(std::move(policy)) {}

absl::Status PriorityPacketQueue::AddJob(JobId job, double rank_key) {
  absl::Status status = policy_.AddJob(job, rank_key);
  if (!status.ok()) return status;
  jobs_.emplace(job, JobQueues());
  return absl::OkStatus();
}

absl::StatusOr<size_t> PriorityPacketQueue::RemoveJob(JobId job) {
  absl::Status status = policy_.RemoveJob(job);
  if (!status.ok()) return status;
  auto it = jobs_.find(job);
  size_t removed = 0;
  for (const auto& [priority, fifo] : it->second) {
    removed += fifo.size();
    for (const Entry& e : fifo) queued_bytes_ -= e.packet.length_bytes;
  }
  size_ -= removed;
  jobs_.erase(it);
  return removed;
}

absl::Status PriorityPacketQueue::Push(const PacketDescriptor& packet) {
  auto it = jobs_.find(packet.job_id);
  if (it == jobs_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "packet of transfer ", packet.transfer_id, " belongs to job ",
        packet.job_id, ", which is not registered with the queue"));
  }
  it->second[packet.tensor_priority].push_back({next_sequence_++, packet});
  ++size_;
  queued_bytes_ += packet.length_bytes;
  return absl::OkStatus();
}

const std::pair<const JobId, PriorityPacketQueue::JobQueues>*
PriorityPacketQueue::Choose(double now_s) const {
  const std::pair<const JobId, JobQueues>* best = nullptr;
  std::tuple<JobPriorityPolicy::Rank, TensorPriority, uint64_t> best_key;
  for (const auto& job : jobs_) {
    if (job.second.empty()) continue;
    const auto& [priority, fifo] = *job.second.begin();
    auto key = std::make_tuple(policy_.RankOfRegistered(job.first, now_s),
                               priority, fifo.front().sequence);
    // Sequences are unique, so keys never tie: a strict total order.
    if (best == nullptr || key < best_key) {
      best = &job;
      best_key = key;
    }
  }
  return best;
}

std::optional<PacketDescriptor> PriorityPacketQueue::Peek(double now_s) const {
  const auto* job = Choose(now_s);
  if (job == nullptr) return std::nullopt;
  return job->second.begin()->second.front().packet;
}

std::optional<PacketDescriptor> PriorityPacketQueue::Pop(double now_s) {
  const auto* chosen = Choose(now_s);
  if (chosen == nullptr) return std::nullopt;
  JobQueues& queues = jobs_.find(chosen->first)->second;
  auto head = queues.begin();
  PacketDescriptor packet = head->second.front().packet;
  head->second.pop_front();
  if (head->second.empty()) queues.erase(head);
  --size_;
  queued_bytes_ -= packet.length_bytes;
  return packet;
}

std::optional<PacketDescriptor> PriorityPacketQueue::PeekSkipping(
    double now_s, const absl::flat_hash_set<TransferId>& skip) const {
  const Entry* best = nullptr;
  std::tuple<JobPriorityPolicy::Rank, TensorPriority, uint64_t> best_key;
  for (const auto& [job, queues] : jobs_) {
    // The job's first packet not skipped, in (tensor priority, arrival) order.
    for (const auto& [priority, fifo] : queues) {
      const Entry* first = nullptr;
      for (const Entry& e : fifo) {
        if (!skip.contains(e.packet.transfer_id)) {
          first = &e;
          break;
        }
      }
      if (first == nullptr) continue;
      auto key = std::make_tuple(policy_.RankOfRegistered(job, now_s), priority, first->sequence);
      if (best == nullptr || key < best_key) {
        best = first;
        best_key = key;
      }
      break;  // later priorities of this job come after this one
    }
  }
  if (best == nullptr) return std::nullopt;
  return best->packet;
}

bool PriorityPacketQueue::Remove(const PacketDescriptor& packet) {
  uint64_t sequence = 0;
  return Remove(packet, &sequence);
}

absl::Status PriorityPacketQueue::Restore(const PacketDescriptor& packet, uint64_t sequence) {
  auto job = jobs_.find(packet.job_id);
  if (job == jobs_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", packet.job_id, " left the queue"));
  }
  // A FIFO is sorted by sequence: the packet goes back to its own place.
  std::deque<Entry>& fifo = job->second[packet.tensor_priority];
  auto at = std::lower_bound(fifo.begin(), fifo.end(), sequence,
                             [](const Entry& e, uint64_t s) { return e.sequence < s; });
  fifo.insert(at, {sequence, packet});
  ++size_;
  queued_bytes_ += packet.length_bytes;
  return absl::OkStatus();
}

bool PriorityPacketQueue::Remove(const PacketDescriptor& packet, uint64_t* sequence) {
  auto job = jobs_.find(packet.job_id);
  if (job == jobs_.end()) return false;
  auto queue = job->second.find(packet.tensor_priority);
  if (queue == job->second.end()) return false;
  std::deque<Entry>& fifo = queue->second;
  for (auto e = fifo.begin(); e != fifo.end(); ++e) {
    if (e->packet.transfer_id == packet.transfer_id && e->packet.tensor_id == packet.tensor_id &&
        e->packet.offset_bytes == packet.offset_bytes) {
      *sequence = e->sequence;
      fifo.erase(e);
      if (fifo.empty()) job->second.erase(queue);
      --size_;
      queued_bytes_ -= packet.length_bytes;
      return true;
    }
  }
  return false;
}

size_t PriorityPacketQueue::RemoveTransfer(TransferId transfer) {
  size_t removed = 0;
  for (auto& [job, queues] : jobs_) {
    for (auto it = queues.begin(); it != queues.end();) {
      std::deque<Entry>& fifo = it->second;
      std::deque<Entry> kept;
      for (Entry& e : fifo) {
        if (e.packet.transfer_id == transfer) {
          ++removed;
          queued_bytes_ -= e.packet.length_bytes;
        } else {
          kept.push_back(e);
        }
      }
      fifo.swap(kept);
      it = fifo.empty() ? queues.erase(it) : std::next(it);
    }
  }
  size_ -= removed;
  return removed;
}

}  // namespace mlfabric::daemon
