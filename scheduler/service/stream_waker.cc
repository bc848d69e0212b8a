#include "scheduler/service/stream_waker.h"

#include <utility>

namespace mlfabric {

StreamWaker::StreamWaker() : thread_([this] { Run(); }) {}

StreamWaker::~StreamWaker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void StreamWaker::Post(std::function<void()> wake) {
  bool notify = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(wake));
    notify = waiting_;
  }
  if (notify) cv_.notify_one();  // only when idle: a busy Run takes it next round
}

void StreamWaker::Run() {
  std::vector<std::function<void()>> running;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (pending_.empty()) {
      if (stopping_) return;
      waiting_ = true;
      cv_.wait(lock, [this] { return !pending_.empty() || stopping_; });
      waiting_ = false;
      continue;
    }
    running.swap(pending_);
    lock.unlock();
    for (const std::function<void()>& wake : running) wake();
    running.clear();
    lock.lock();
  }
}

}  // namespace mlfabric
