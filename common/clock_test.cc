#include "common/clock.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

TEST_CASE("FakeClock moves only when told") {
  FakeClock clock(5.0);
  CHECK(clock.NowSeconds() == 5.0);
  clock.Advance(0.25);
  CHECK(clock.NowSeconds() == 5.25);
  clock.Set(1.0);
  CHECK(clock.NowSeconds() == 1.0);
}

TEST_CASE("RealClock is monotonic") {
  RealClock clock;
  const double a = clock.NowSeconds();
  const double b = clock.NowSeconds();
  CHECK(b >= a);
  CHECK(clock.WallSeconds() > 1.6e9);  // after 2020
}

}  // namespace
}  // namespace mlfabric
