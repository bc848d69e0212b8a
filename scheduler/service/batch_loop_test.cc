#include "scheduler/service/batch_loop.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

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
