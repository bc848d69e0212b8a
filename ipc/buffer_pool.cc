#include "ipc/buffer_pool.h"

#include <utility>

namespace mlfabric {

std::shared_ptr<SharedBuffer> BufferPool::Take(size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.find(size);
  if (it == free_.end() || it->second.empty()) return nullptr;
  std::shared_ptr<SharedBuffer> buffer = std::move(it->second.back());
  it->second.pop_back();
  pooled_bytes_ -= size;
  ++reused_;
  return buffer;
}

void BufferPool::Recycle(std::shared_ptr<SharedBuffer> buffer) {
  // Only a buffer nobody else holds may be written again.
  if (buffer == nullptr || buffer->size() == 0 || buffer.use_count() != 1) return;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t size = buffer->size();
  auto& free_list = free_[size];
  if (free_list.size() >= bounds_.max_per_size || pooled_bytes_ + size > bounds_.max_bytes) return;
  pooled_bytes_ += size;
  free_list.push_back(std::move(buffer));
}

size_t BufferPool::pooled_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pooled_bytes_;
}

int64_t BufferPool::reused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reused_;
}

}  // namespace mlfabric
