#include "scheduler/service/stream_waker.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

// Opened once; waiters block until then.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Await() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST_CASE("a wake-up runs on the waker's thread, not on the poster's") {
  // The poster holds a lock the wake-up needs, as the service's lock is
  // held where commands are queued: run inline, the wake-up would deadlock.
  std::mutex service_lock;
  std::thread::id ran_on;
  Gate ran;
  StreamWaker waker;
  {
    std::lock_guard<std::mutex> held(service_lock);
    waker.Post([&] {
      std::lock_guard<std::mutex> lock(service_lock);
      ran_on = std::this_thread::get_id();
      ran.Open();
    });
  }
  ran.Await();
  CHECK(ran_on != std::this_thread::get_id());
}

TEST_CASE("wake-ups run in the order they were posted, those posted by a wake-up too") {
  std::vector<int> order;  // written on the waker's thread only
  Gate done;
  Gate hold;
  StreamWaker waker;
  waker.Post([&] { hold.Await(); });  // the rest queue behind it
  for (int i = 0; i < 100; ++i) {
    waker.Post([&, i] {
      order.push_back(i);
      if (i == 99) {
        waker.Post([&] {
          order.push_back(100);
          done.Open();
        });
      }
    });
  }
  hold.Open();
  done.Await();
  REQUIRE(order.size() == 101);
  for (int i = 0; i <= 100; ++i) CHECK(order[i] == i);
}

TEST_CASE("the destructor runs what was posted before it, then returns") {
  std::atomic<int> ran{0};
  {
    Gate hold;  // outlives the waker, whose first wake-up waits on it
    StreamWaker waker;
    waker.Post([&] { hold.Await(); });
    for (int i = 0; i < 50; ++i) waker.Post([&] { ++ran; });
    hold.Open();
  }
  CHECK(ran.load() == 50);
}

TEST_CASE("posts from many threads all run") {
  std::atomic<int> ran{0};
  {
    StreamWaker waker;
    std::vector<std::thread> posters;
    for (int t = 0; t < 4; ++t) {
      posters.emplace_back([&] {
        for (int i = 0; i < 1000; ++i) waker.Post([&] { ++ran; });
      });
    }
    for (std::thread& poster : posters) poster.join();
  }
  CHECK(ran.load() == 4000);
}

}  // namespace
}  // namespace mlfabric
