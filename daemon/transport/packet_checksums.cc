#include "daemon/transport/packet_checksums.h"

#include <algorithm>
#include <thread>

#include <boost/asio/post.hpp>

#include "common/crc32c.h"

namespace mlfabric::transport {

void PacketLayout(const std::vector<v1::TensorInfo>& tensors, uint64_t total,
                  uint64_t payload_bytes, std::vector<uint64_t>* offsets,
                  std::vector<uint32_t>* lengths) {
  auto add_tensor = [&](uint64_t start, uint64_t bytes) {
    const uint64_t end = std::min(total, start + bytes);
    for (uint64_t offset = start; offset < end; offset += payload_bytes) {
      offsets->push_back(offset);
      lengths->push_back(static_cast<uint32_t>(std::min(payload_bytes, end - offset)));
    }
  };
  if (tensors.empty()) {
    add_tensor(0, total);
    return;
  }
  uint64_t start = 0;
  for (const v1::TensorInfo& tensor : tensors) {
    add_tensor(start, static_cast<uint64_t>(std::max<int64_t>(0, tensor.bytes())));
    start += static_cast<uint64_t>(std::max<int64_t>(0, tensor.bytes()));
  }
}

std::shared_ptr<PacketChecksums> PacketChecksums::ForPush(
    const std::vector<v1::TensorInfo>& tensors, uint64_t total, uint64_t payload_bytes) {
  auto sums = std::make_shared<PacketChecksums>();
  PacketLayout(tensors, total, payload_bytes, &sums->offsets_, &sums->lengths_);
  sums->crcs_.resize(sums->offsets_.size());
  // Before its transfer starts the host's cores are otherwise idle, and the
  // sooner all packets are summed the fewer the sender must sum itself.
  const size_t packets = sums->offsets_.size();
  const size_t threads = std::clamp<size_t>(
      std::min<size_t>(std::thread::hardware_concurrency(), packets / kPacketsPerThread), 1, 8);
  sums->parts_ = threads;
  sums->part_size_ = std::max<size_t>(1, (packets + threads - 1) / threads);
  sums->done_.reset(new std::atomic<size_t>[threads]);
  for (size_t p = 0; p < threads; ++p) sums->done_[p].store(0);
  return sums;
}

void PacketChecksums::SumPart(const uint8_t* data, size_t part) {
  const size_t begin = part * part_size_;
  const size_t end = std::min(offsets_.size(), begin + part_size_);
  for (size_t i = begin; i < end; ++i) {
    if (sending_.load(std::memory_order_relaxed)) return;
    crcs_[i] = Crc32c(data + offsets_[i], lengths_[i]);
    done_[part].store(i + 1 - begin, std::memory_order_release);
  }
}

void PacketChecksums::ClaimParts(const uint8_t* data) {
  for (size_t part = next_part_.fetch_add(1); part < parts_; part = next_part_.fetch_add(1)) {
    SumPart(data, part);
    MutexLock lock(&finished_mu_);
    ++parts_finished_;
    finished_cv_.SignalAll();
  }
}

void PacketChecksums::SumAll(const uint8_t* data, boost::asio::thread_pool* pool) {
  if (pool != nullptr) {
    // A helper that runs after the caller claimed every part finds none
    // left; it keeps this object alive until then.
    for (size_t p = 1; p < parts_; ++p) {
      boost::asio::post(*pool, [self = shared_from_this(), data] { self->ClaimParts(data); });
    }
  }
  ClaimParts(data);
  // The parts a helper claimed may still be running: `data` is the
  // caller's, so they must be done before this returns.
  MutexLock lock(&finished_mu_);
  while (parts_finished_ != parts_) finished_cv_.Wait(&finished_mu_);
}

std::optional<uint32_t> PacketChecksums::Find(uint64_t offset, uint32_t length) const {
  auto it = std::lower_bound(offsets_.begin(), offsets_.end(), offset);
  if (it == offsets_.end() || *it != offset) return std::nullopt;
  const size_t index = static_cast<size_t>(it - offsets_.begin());
  const size_t part = index / part_size_;
  if (part >= parts_ || index - part * part_size_ >= done_[part].load(std::memory_order_acquire) ||
      lengths_[index] != length) {
    return std::nullopt;
  }
  return crcs_[index];
}

size_t PacketChecksums::Ready() const {
  size_t total = 0;
  for (size_t p = 0; p < parts_; ++p) total += done_[p].load(std::memory_order_relaxed);
  return total;
}

}  // namespace mlfabric::transport
