#include "common/blocking_work.h"

#include <chrono>
#include <thread>
#include <utility>

namespace mlfabric {

BlockingWork::~BlockingWork() {
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
  ended_.wait(lock, [this] { return threads_ == 0; });
  JoinEndedLocked();
}

void BlockingWork::JoinEndedLocked() {
  // An ended thread has left Worker() (it only unlocks mu_ on its way
  // out), so the join returns at once.
  for (const std::thread::id& id : ended_ids_) {
    auto found = running_.find(id);
    if (found == running_.end()) continue;
    found->second.join();
    running_.erase(found);
  }
  ended_ids_.clear();
}

void BlockingWork::Run(std::function<void()> item) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(item));
  // Every queued item needs a thread of its own, idle or new.
  if (idle_ >= queue_.size()) {
    cv_.notify_one();
    return;
  }
  JoinEndedLocked();
  ++threads_;
  ++started_;
  std::thread thread([this] { Worker(); });
  const std::thread::id id = thread.get_id();
  running_.emplace(id, std::move(thread));
}

void BlockingWork::Worker() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    ++idle_;
    const bool work = cv_.wait_for(lock, std::chrono::duration<double>(idle_s_),
                                   [this] { return !queue_.empty() || stopping_; });
    --idle_;
    if (!work || queue_.empty()) break;  // idle too long, or stopping with nothing left
    std::function<void()> item = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    item();
    item = nullptr;  // what it holds goes now, not with the next item
    lock.lock();
  }
  --threads_;
  ended_ids_.push_back(std::this_thread::get_id());
  ended_.notify_all();
}

size_t BlockingWork::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_;
}

size_t BlockingWork::started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_;
}

}  // namespace mlfabric
