#include "scheduler/service/batch_loop.h"

#include <chrono>
#include <utility>

namespace mlfabric {

BatchLoop::BatchLoop(double interval_ms, std::function<void()> cycle)
    : interval_ms_(interval_ms), cycle_(std::move(cycle)) {}

BatchLoop::~BatchLoop() { Stop(); }

void BatchLoop::Start() { thread_ = std::thread([this] { Loop(); }); }

void BatchLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BatchLoop::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    woken_ = true;
  }
  cv_.notify_all();
}

void BatchLoop::Loop() {
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double, std::milli>(interval_ms_));
  auto next = std::chrono::steady_clock::now() + interval;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, next, [this] { return stopping_ || woken_; });
      if (stopping_) return;
      woken_ = false;
    }
    cycle_();
    // The next tick stays on its schedule: a cycle run early because it was
    // woken does not take the place of the tick due after it (which plans
    // what arrived since), and ticks a slow cycle overran are not made up.
    const auto now = std::chrono::steady_clock::now();
    while (next <= now) next += interval;
  }
}

}  // namespace mlfabric
