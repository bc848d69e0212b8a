#include "common/half.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

TEST_CASE("every half converts to float and back unchanged") {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      CHECK(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    INFO("half 0x" << std::hex << h);
    CHECK(FloatToHalf(f) == h);
  }
}

TEST_CASE("known values") {
  CHECK(FloatToHalf(1.0f) == 0x3c00);
  CHECK(FloatToHalf(-2.0f) == 0xc000);
  CHECK(FloatToHalf(65504.0f) == 0x7bff);
  CHECK(FloatToHalf(0.0f) == 0x0000);
  CHECK(FloatToHalf(-0.0f) == 0x8000);
  CHECK(HalfToFloat(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(HalfToFloat(0x0400) == std::ldexp(1.0f, -14));  // smallest normal
}

TEST_CASE("rounding is to nearest, ties to even") {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even 1.
  CHECK(FloatToHalf(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9: up.
  CHECK(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  CHECK(FloatToHalf(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3c01);
  // Subnormal ties: 2^-25 is halfway between 0 and the smallest subnormal.
  CHECK(FloatToHalf(std::ldexp(1.0f, -25)) == 0x0000);
  CHECK(FloatToHalf(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(FloatToHalf(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 subnormal units: even 2
}

TEST_CASE("overflow, infinity and NaN") {
  CHECK(FloatToHalf(65520.0f) == 0x7c00);  // halfway to 2^16 rounds up to infinity
  CHECK(FloatToHalf(65519.0f) == 0x7bff);
  CHECK(FloatToHalf(1e9f) == 0x7c00);
  CHECK(FloatToHalf(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(std::isnan(HalfToFloat(FloatToHalf(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("AddHalves sums element-wise, rounding each sum to half") {
  uint16_t dst[3] = {FloatToHalf(1.0f), FloatToHalf(2048.0f), FloatToHalf(-0.5f)};
  const uint16_t src[3] = {FloatToHalf(2.0f), FloatToHalf(1.0f), FloatToHalf(0.25f)};
  AddHalves(dst, src, 3);
  CHECK(HalfToFloat(dst[0]) == 3.0f);
  CHECK(HalfToFloat(dst[1]) == 2048.0f);  // 2049 is not a half: ties to even 2048
  CHECK(HalfToFloat(dst[2]) == -0.25f);
}

}  // namespace
}  // namespace mlfabric
