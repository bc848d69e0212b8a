#include "daemon/transport/packet.h"

#include <catch2/catch.hpp>
#include <random>
#include <vector>

namespace mlfabric::transport {
namespace {

TEST_CASE("Headers round-trip every field") {
  std::vector<uint8_t> payload(1000, 7);
  PacketHeader h;
  h.kind = PacketKind::kData;
  h.flags = 6;  // not kFlagSealed: a sealed packet has no CRC to check
  h.priority = 9;
  h.job = 42;
  h.transfer = 0x1122334455667788ull;
  h.tensor = 5;
  h.offset = 65536;
  uint8_t buf[kHeaderBytes];
  EncodePacketHeader(h, payload.data(), payload.size(), buf);
  auto parsed = ParseHeader(buf, sizeof(buf), kDefaultPayloadBytes);
  REQUIRE(parsed.ok());
  CHECK(parsed->flags == 6);
  CHECK(parsed->priority == 9);
  CHECK(parsed->job == 42);
  CHECK(parsed->transfer == h.transfer);
  CHECK(parsed->tensor == 5);
  CHECK(parsed->offset == 65536);
  CHECK(parsed->length == 1000);
  CHECK(VerifyPayload(*parsed, payload.data()).ok());
  payload[10] ^= 0x40;
  CHECK(VerifyPayload(*parsed, payload.data()).code() == absl::StatusCode::kDataLoss);
}

TEST_CASE("Malformed headers are rejected with a reason") {
  uint8_t buf[kHeaderBytes];
  PacketHeader h;
  EncodePacketHeader(h, "", 0, buf);
  CHECK(ParseHeader(buf, kHeaderBytes - 1, kDefaultPayloadBytes).status().message().find(
            "truncated") != std::string::npos);

  uint8_t bad[kHeaderBytes];
  std::copy(buf, buf + kHeaderBytes, bad);
  bad[0] ^= 1;
  CHECK(ParseHeader(bad, kHeaderBytes, kDefaultPayloadBytes).status().message().find("magic") !=
        std::string::npos);

  std::copy(buf, buf + kHeaderBytes, bad);
  bad[4] = 9;
  CHECK(ParseHeader(bad, kHeaderBytes, kDefaultPayloadBytes).status().message().find("version") !=
        std::string::npos);

  std::copy(buf, buf + kHeaderBytes, bad);
  bad[5] = 200;
  CHECK_FALSE(ParseHeader(bad, kHeaderBytes, kDefaultPayloadBytes).ok());

  h.length = kDefaultPayloadBytes + 1;
  EncodeHeader(h, bad);
  CHECK(ParseHeader(bad, kHeaderBytes, kDefaultPayloadBytes).status().message().find("exceeds") !=
        std::string::npos);
}

TEST_CASE("Random bytes never crash the parser") {
  std::mt19937 rng(1234);
  INFO("seed 1234");
  uint8_t buf[kHeaderBytes];
  for (int i = 0; i < 100000; ++i) {
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    if (i % 2 == 0) {  // keep magic and version valid half the time to reach deeper checks
      buf[0] = 0x4D; buf[1] = 0x46; buf[2] = 0x4C; buf[3] = 0x42; buf[4] = 1;
    }
    auto parsed = ParseHeader(buf, rng() % (kHeaderBytes + 1), kDefaultPayloadBytes);
    if (parsed.ok()) CHECK(parsed->length <= kMaxControlBytes);
  }
}

}  // namespace
}  // namespace mlfabric::transport
