#include "common/mutex.h"

#include <chrono>
#include <thread>

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

class Flag {
 public:
  void Set() {
    MutexLock lock(&mu_);
    set_ = true;
    changed_.SignalAll();
  }
  void Await() {
    MutexLock lock(&mu_);
    while (!set_) changed_.Wait(&mu_);
  }
  // False if `timeout` passed first.
  bool AwaitWithTimeout(milliseconds timeout) {
    const auto deadline = steady_clock::now() + timeout;
    MutexLock lock(&mu_);
    while (!set_) {
      if (changed_.WaitWithDeadline(&mu_, deadline)) return set_;
    }
    return true;
  }
  bool TimesOutUnset(milliseconds timeout) {
    MutexLock lock(&mu_);
    while (!changed_.WaitWithTimeout(&mu_, timeout)) {  // a spurious wake-up: again
    }
    return !set_;
  }

 private:
  Mutex mu_;
  CondVar changed_;
  bool set_ ABSL_GUARDED_BY(mu_) = false;
};

TEST_CASE("CondVar::Wait returns once signalled, holding the mutex again") {
  Flag flag;
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(20));
    flag.Set();
  });
  flag.Await();
  setter.join();
  REQUIRE(flag.AwaitWithTimeout(milliseconds(0)));
}

TEST_CASE("CondVar's timed waits say when the time passed") {
  Flag flag;
  const auto start = steady_clock::now();
  REQUIRE_FALSE(flag.AwaitWithTimeout(milliseconds(30)));
  REQUIRE(steady_clock::now() - start >= milliseconds(30));
  REQUIRE(flag.TimesOutUnset(milliseconds(10)));
  flag.Set();
  REQUIRE(flag.AwaitWithTimeout(milliseconds(30)));
}

TEST_CASE("MutexLock excludes other holders") {
  Mutex mu;
  int count = 0;
  auto add = [&] {
    for (int i = 0; i < 100000; ++i) {
      MutexLock lock(&mu);
      ++count;
    }
  };
  std::thread other(add);
  add();
  other.join();
  MutexLock lock(&mu);
  REQUIRE(count == 200000);
}

TEST_CASE("CondVar's predicate waits return once the predicate holds, or say it does not") {
  Mutex mu;
  CondVar changed;
  int value = 0;
  std::thread setter([&] {
    for (int i = 0; i < 3; ++i) {
      std::this_thread::sleep_for(milliseconds(5));
      MutexLock lock(&mu);
      ++value;
      changed.SignalAll();
    }
  });
  {
    MutexLock lock(&mu);
    changed.Await(&mu, [&] { return value == 3; });  // wakes on 1 and 2 and waits on
    REQUIRE(value == 3);
    REQUIRE_FALSE(changed.AwaitWithTimeout(&mu, milliseconds(10), [&] { return value == 4; }));
    REQUIRE(changed.AwaitWithDeadline(&mu, steady_clock::now(), [&] { return value == 3; }));
  }
  setter.join();
}

TEST_CASE("MutexLock can let go for a stretch and take the mutex back") {
  Mutex mu;
  MutexLock lock(&mu);
  lock.Unlock();
  std::thread other([&] { MutexLock inner(&mu); });  // would block forever if still held
  other.join();
  lock.Lock();
}

}  // namespace
}  // namespace mlfabric
