#include "common/blocking_work.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

// Polls `done` (every millisecond) for up to 5 s.
template <typename Predicate>
bool Eventually(Predicate done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST_CASE("BlockingWork reuses an idle thread instead of starting one per item") {
  BlockingWork work(/*idle_s=*/30);
  std::atomic<int> done{0};
  for (int i = 0; i < 50; ++i) {
    work.Run([&] { ++done; });
    REQUIRE(Eventually([&] { return done.load() == i + 1; }));
    // Wait for the thread to be idle again before the next item.
    REQUIRE(Eventually([&] { return work.threads() == 1; }));
  }
  CHECK(work.started() <= 2);  // (an item may land while the first finishes)
}

TEST_CASE("BlockingWork never makes an item wait for another: items that wait on each other run") {
  BlockingWork work(30);
  // 20 items, each blocked until the last has started: with a bounded pool
  // this would deadlock.
  constexpr int kItems = 20;
  std::promise<void> last_started;
  std::shared_future<void> go = last_started.get_future().share();
  std::atomic<int> finished{0};
  for (int i = 0; i < kItems; ++i) {
    work.Run([&, i] {
      if (i == kItems - 1) last_started.set_value();
      go.wait();
      ++finished;
    });
  }
  REQUIRE(Eventually([&] { return finished.load() == kItems; }));
  CHECK(work.started() == kItems);
}

TEST_CASE("BlockingWork's idle threads end, and its destructor waits for running items") {
  std::atomic<bool> ran{false};
  {
    BlockingWork work(/*idle_s=*/0.05);
    work.Run([] {});
    REQUIRE(Eventually([&] { return work.threads() == 0; }));  // idle thread ended
    work.Run([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ran.store(true);
    });
  }
  CHECK(ran.load());
}

}  // namespace
}  // namespace mlfabric
