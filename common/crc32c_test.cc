#include "common/crc32c.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

namespace mlfabric {
namespace {

TEST_CASE("CRC32C matches the standard check value") {
  const std::string check = "123456789";
  CHECK(Crc32c(check.data(), check.size()) == 0xE3069283u);
  CHECK(Crc32c("", 0) == 0u);
}

TEST_CASE("CRC32C extends across arbitrary splits") {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(1000);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t split : {0u, 1u, 7u, 8u, 9u, 500u, 999u, 1000u}) {
    const uint32_t first = Crc32c(data.data(), split);
    CHECK(Crc32cExtend(first, data.data() + split, data.size() - split) == whole);
  }
  data[500] ^= 1;
  CHECK(Crc32c(data.data(), data.size()) != whole);
}

}  // namespace
}  // namespace mlfabric
