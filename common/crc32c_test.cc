#include "common/crc32c.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/crc32c_internal.h"

namespace mlfabric {
namespace {

namespace ci = crc32c_internal;

struct Path {
  const char* name;
  uint32_t (*extend)(uint32_t, const void*, size_t);
};

// The paths this CPU can run; a missing one is reported, not silently
// skipped.
std::vector<Path> AvailablePaths() {
  std::vector<Path> paths = {{"software", &ci::ExtendSoftware},
                             {"slicing-by-8", &ci::ExtendSlicingBy8},
                             {"public Crc32cExtend", &Crc32cExtend}};
  if (ci::HasSse42()) {
    paths.push_back({"sse42-serial", &ci::ExtendSse42Serial});
    paths.push_back({"sse42-3way", &ci::ExtendSse42ThreeWay});
  } else {
    std::printf("NOTE: CPU lacks SSE4.2; sse42-serial and sse42-3way paths not tested\n");
  }
  if (ci::HasVpclmul()) {
    paths.push_back({"vpclmul", &ci::ExtendVpclmul});
  } else {
    std::printf("NOTE: CPU lacks AVX-512 VPCLMULQDQ; vpclmul path not tested\n");
  }
  return paths;
}

std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t size) {
  std::vector<uint8_t> data(size);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  return data;
}

TEST_CASE("CRC32C matches the known test vectors on every path") {
  const std::string check = "123456789";
  std::vector<uint8_t> zeros(32, 0x00);
  std::vector<uint8_t> ones(32, 0xFF);
  std::vector<uint8_t> ascending(32);
  std::vector<uint8_t> descending(32);
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<uint8_t>(i);
    descending[i] = static_cast<uint8_t>(31 - i);
  }
  // RFC 3720 (iSCSI) appendix B.4, and the standard check value.
  for (const Path& path : AvailablePaths()) {
    INFO("path " << path.name);
    CHECK(path.extend(0, check.data(), check.size()) == 0xE3069283u);
    CHECK(path.extend(0, "", 0) == 0u);
    CHECK(path.extend(0, zeros.data(), zeros.size()) == 0x8A9136AAu);
    CHECK(path.extend(0, ones.data(), ones.size()) == 0x62A8AB43u);
    CHECK(path.extend(0, ascending.data(), ascending.size()) == 0x46DD794Eu);
    CHECK(path.extend(0, descending.data(), descending.size()) == 0x113FDB5Cu);
  }
  CHECK(Crc32c(check.data(), check.size()) == 0xE3069283u);
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

TEST_CASE("CRC32C zero-extension operator matches feeding zero bytes") {
  const uint64_t seed = 11;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> zeros(70000, 0);
  for (size_t n : {0u, 1u, 2u, 3u, 7u, 8u, 128u, 1000u, 1024u, 8192u, 65537u}) {
    const uint32_t crc = static_cast<uint32_t>(rng());
    INFO("zero bytes " << n);
    CHECK(ci::ExtendZeros(crc, n) == ci::ExtendSoftware(crc, zeros.data(), n));
  }
}

TEST_CASE("CRC32C paths agree on every length 0..2048 and every alignment") {
  const uint64_t seed = 2024;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<Path> paths = AvailablePaths();
  const std::vector<uint8_t> buffer = RandomBytes(rng, 2048 + 64);
  for (size_t length = 0; length <= 2048; ++length) {
    const size_t offset = length % 64;
    const uint32_t start = static_cast<uint32_t>(rng());
    const uint32_t expected = ci::ExtendSoftware(start, buffer.data() + offset, length);
    for (const Path& path : paths) {
      const uint32_t got = path.extend(start, buffer.data() + offset, length);
      if (got != expected) {
        FAIL("path " << path.name << " length " << length << " offset " << offset << " got "
                     << got << " expected " << expected);
      }
    }
  }
  // Every alignment 0..63 for lengths around each path's thresholds and
  // block boundaries.
  const std::vector<uint8_t> big = RandomBytes(rng, 3 * 8192 + 4096 + 64);
  for (size_t length : {size_t{255}, size_t{256}, size_t{257}, size_t{383}, size_t{384},
                        size_t{1000}, size_t{3071}, size_t{3072}, size_t{3 * 8192},
                        size_t{3 * 8192 + 4096}}) {
    for (size_t offset = 0; offset < 64; ++offset) {
      const uint32_t expected = ci::ExtendSoftware(0, big.data() + offset, length);
      for (const Path& path : paths) {
        const uint32_t got = path.extend(0, big.data() + offset, length);
        if (got != expected) {
          FAIL("path " << path.name << " length " << length << " offset " << offset);
        }
      }
    }
  }
}

TEST_CASE("CRC32C paths agree on random lengths up to 1 MiB") {
  const uint64_t seed = 99;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<Path> paths = AvailablePaths();
  const std::vector<uint8_t> buffer = RandomBytes(rng, (1 << 20) + 64);
  std::vector<size_t> lengths = {size_t{1} << 20, 32768, 32768 - 48, 32768 + 48};
  for (int i = 0; i < 40; ++i) lengths.push_back(rng() % ((1 << 20) + 1));
  for (size_t length : lengths) {
    const size_t offset = rng() % 64;
    const uint32_t start = static_cast<uint32_t>(rng());
    const uint32_t expected = ci::ExtendSoftware(start, buffer.data() + offset, length);
    for (const Path& path : paths) {
      INFO("path " << path.name << " length " << length << " offset " << offset);
      CHECK(path.extend(start, buffer.data() + offset, length) == expected);
    }
  }
}

TEST_CASE("CRC32C paths stream across random splits") {
  const uint64_t seed = 5;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<Path> paths = AvailablePaths();
  const std::vector<uint8_t> data = RandomBytes(rng, 200000);
  const uint32_t whole = ci::ExtendSoftware(0, data.data(), data.size());
  for (const Path& path : paths) {
    for (int trial = 0; trial < 20; ++trial) {
      uint32_t crc = 0;
      size_t done = 0;
      while (done < data.size()) {
        // Mix tiny, medium and large pieces so every path's branches and
        // the 3-way/vpclmul hand-offs all meet a running state.
        const size_t cap = (rng() % 3 == 0) ? 64 : (rng() % 2 ? 4096 : 40000);
        const size_t piece = std::min<size_t>(data.size() - done, rng() % (cap + 1));
        crc = path.extend(crc, data.data() + done, piece);
        done += piece;
      }
      INFO("path " << path.name << " trial " << trial);
      CHECK(crc == whole);
    }
  }
}

TEST_CASE("CRC32C detects every single-bit flip in a 32 KiB packet") {
  std::mt19937_64 rng(3);
  std::vector<uint8_t> data = RandomBytes(rng, 32768);
  const uint32_t clean = Crc32c(data.data(), data.size());
  for (size_t bit = 0; bit < data.size() * 8; bit += 997) {
    data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    INFO("bit " << bit);
    CHECK(Crc32c(data.data(), data.size()) != clean);
    data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
}

}  // namespace
}  // namespace mlfabric
