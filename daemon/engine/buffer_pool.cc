#include "daemon/engine/buffer_pool.h"

#include <utility>

namespace mlfabric::daemon {

std::shared_ptr<SharedBuffer> BufferPool::Take(size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.find(size);
  if (it == free_.end() || it->second.empty()) return nullptr;
  std::shared_ptr<SharedBuffer> buffer = std::move(it->second.back());
  it->second.pop_back();
  pooled_bytes_ -= size;
  return buffer;
}

void BufferPool::Recycle(std::shared_ptr<SharedBuffer> buffer) {
  // Only a buffer nobody else holds may be written again.
  if (buffer == nullptr || buffer.use_count() != 1) return;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t size = buffer->size();
  auto& free_list = free_[size];
  if (free_list.size() >= kMaxPerSize || pooled_bytes_ + size > kMaxPooledBytes) return;
  pooled_bytes_ += size;
  free_list.push_back(std::move(buffer));
}

size_t BufferPool::pooled_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pooled_bytes_;
}

}  // namespace mlfabric::daemon
