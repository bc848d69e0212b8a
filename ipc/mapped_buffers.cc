#include "ipc/mapped_buffers.h"

#include <unistd.h>

#include <iterator>
#include <utility>

namespace mlfabric {

absl::StatusOr<SharedBuffer> MappedBuffers::Map(int fd, size_t size, bool* reused) {
  if (reused != nullptr) *reused = false;
  absl::StatusOr<ReceivedFile> file = StatReceived(fd, size);
  if (!file.ok()) {
    ::close(fd);
    return file.status();
  }
  // Nothing to map (and mmap takes no empty range).
  if (size == 0) return SharedBuffer::Map(fd, 0);
  std::list<Entry> dropped;  // released after unlocking: the last share munmaps
  {
    absl::ReleasableMutexLock lock(&mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->device != file->device || it->inode != file->inode) continue;
      if (it->mapping->size() >= size) {
        entries_.splice(entries_.begin(), entries_, it);
        ++hits_;
        std::shared_ptr<SharedMapping> mapping = entries_.front().mapping;
        lock.Release();
        ::close(fd);  // the kept mapping holds a descriptor of the same file
        if (reused != nullptr) *reused = true;
        return SharedBuffer::View(std::move(mapping), size);
      }
      // The file grew past the mapping (StatReceived checked it holds
      // `size` bytes now): mapped again below, at the new size.
      mapped_bytes_ -= it->mapping->size();
      dropped.splice(dropped.end(), entries_, it);
      break;
    }
    ++misses_;
  }
  dropped.clear();
  // Not under the lock: populating the pages is the slow part.
  absl::StatusOr<std::shared_ptr<SharedMapping>> mapping = SharedMapping::Map(fd, size);
  if (!mapping.ok()) return mapping.status();
  if (size <= bounds_.max_bytes && bounds_.max_entries > 0) {
    absl::MutexLock lock(&mu_);
    // Another thread may have mapped the same file meanwhile: one entry
    // per file, the newest.
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->device == file->device && it->inode == file->inode) {
        mapped_bytes_ -= it->mapping->size();
        dropped.splice(dropped.end(), entries_, it);
        break;
      }
    }
    entries_.push_front(Entry{file->device, file->inode, *mapping});
    mapped_bytes_ += size;
    EvictLocked(&dropped);
  }
  dropped.clear();
  return SharedBuffer::View(*std::move(mapping), size);
}

void MappedBuffers::EvictLocked(std::list<Entry>* dropped) {
  while (!entries_.empty() &&
         (entries_.size() > bounds_.max_entries || mapped_bytes_ > bounds_.max_bytes)) {
    mapped_bytes_ -= entries_.back().mapping->size();
    dropped->splice(dropped->end(), entries_, std::prev(entries_.end()));
  }
}

void MappedBuffers::Clear() {
  std::list<Entry> dropped;
  {
    absl::MutexLock lock(&mu_);
    dropped.swap(entries_);
    mapped_bytes_ = 0;
  }
}

int64_t MappedBuffers::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

int64_t MappedBuffers::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

size_t MappedBuffers::entries() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

size_t MappedBuffers::mapped_bytes() const {
  absl::MutexLock lock(&mu_);
  return mapped_bytes_;
}

}  // namespace mlfabric
