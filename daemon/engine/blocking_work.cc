#include "daemon/engine/blocking_work.h"

#include <chrono>
#include <thread>
#include <utility>

namespace mlfabric::daemon {

BlockingWork::~BlockingWork() {
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
  ended_.wait(lock, [this] { return threads_ == 0; });
}

void BlockingWork::Run(std::function<void()> item) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(item));
  // Every queued item needs a thread of its own, idle or new.
  if (idle_ >= queue_.size()) {
    cv_.notify_one();
    return;
  }
  ++threads_;
  ++started_;
  // Detached: the destructor waits for threads_ to reach 0 instead.
  std::thread([this] { Worker(); }).detach();
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

}  // namespace mlfabric::daemon
