#include "scheduler/service/batch_loop.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

TEST_CASE("a woken loop runs a cycle without waiting for its (hour-long) tick") {
  std::mutex mu;
  std::condition_variable cv;
  int cycles = 0;
  BatchLoop loop(3600e3, [&] {
    std::lock_guard<std::mutex> lock(mu);
    ++cycles;
    cv.notify_all();
  });
  loop.Start();
  loop.Wake();
  {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return cycles == 1; }));
  }
  loop.Wake();
  {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return cycles == 2; }));
  }
  loop.Stop();  // returns although the next tick is an hour away
  CHECK(cycles == 2);
}

TEST_CASE("a woken cycle leaves the tick after it where it was") {
  // Ticks every 2 s; woken after about 1 s, the loop still runs the tick
  // due at 2 s (an earlier version waited a whole interval from the woken
  // cycle, 3 s, so what arrived after it waited up to two intervals).
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::chrono::steady_clock::time_point> at;
  BatchLoop loop(2000, [&] {
    std::lock_guard<std::mutex> lock(mu);
    at.push_back(std::chrono::steady_clock::now());
    cv.notify_all();
  });
  loop.Start();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  loop.Wake();
  std::unique_lock<std::mutex> lock(mu);
  REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return at.size() >= 2; }));
  const double gap_s = std::chrono::duration<double>(at[1] - at[0]).count();
  lock.unlock();
  loop.Stop();
  INFO("from the woken cycle to the next: " << gap_s << " s");
  CHECK(gap_s < 1.9);
}

TEST_CASE("the loop ticks on its own") {
  std::mutex mu;
  std::condition_variable cv;
  int cycles = 0;
  BatchLoop loop(1, [&] {
    std::lock_guard<std::mutex> lock(mu);
    ++cycles;
    cv.notify_all();
  });
  loop.Start();
  std::unique_lock<std::mutex> lock(mu);
  CHECK(cv.wait_for(lock, std::chrono::seconds(30), [&] { return cycles >= 3; }));
  lock.unlock();
  loop.Stop();
}

}  // namespace
}  // namespace mlfabric
