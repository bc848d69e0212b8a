#include "common/clock.h"

#include <chrono>

namespace mlfabric {

double RealClock::NowSeconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double RealClock::WallSeconds() const {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace mlfabric
