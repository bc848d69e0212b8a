// Time as a dependency. Components that need "now" take a Clock& so tests
// can drive them with a FakeClock step by step.
//
//   RealClock clock;
//   double start_s = clock.NowSeconds();
//
//   FakeClock fake(100.0);
//   fake.Advance(0.5);  // fake.NowSeconds() == 100.5
//
// NowSeconds() is monotonic (steady_clock) and has an arbitrary origin;
// WallSeconds() is Unix time, for messages and cross-process timestamps.
// Thread safety: both implementations are safe to call from any thread.
#ifndef MLFABRIC_COMMON_CLOCK_H_
#define MLFABRIC_COMMON_CLOCK_H_

#include <atomic>

namespace mlfabric {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual double NowSeconds() const = 0;
  virtual double WallSeconds() const = 0;
};

class RealClock final : public Clock {
 public:
  double NowSeconds() const override;
  double WallSeconds() const override;
};

class FakeClock final : public Clock {
 public:
  explicit FakeClock(double start_s = 0) : now_s_(start_s) {}
  double NowSeconds() const override { return now_s_.load(); }
  double WallSeconds() const override { return now_s_.load(); }
  void Advance(double seconds) {
    double expected = now_s_.load();
    while (!now_s_.compare_exchange_weak(expected, expected + seconds)) {
    }
  }
  void Set(double now_s) { now_s_.store(now_s); }

 private:
  std::atomic<double> now_s_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_COMMON_CLOCK_H_
