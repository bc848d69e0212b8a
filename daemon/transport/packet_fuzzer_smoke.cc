// Runs the fuzz entry point over seeded random and mutated-valid inputs, so
// the parser's no-crash contract is checked by every `bazel test`, with or
// without clang. Prints the seed; exits non-zero (abort) on a violation.
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "daemon/transport/packet.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main() {
  using namespace mlfabric::transport;
  const uint32_t seed = 20261122;
  std::printf("packet_fuzzer_smoke: seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<uint8_t> valid(kHeaderBytes + 64, 0x5A);
  PacketHeader header;
  header.transfer = 7;
  EncodePacketHeader(header, valid.data() + kHeaderBytes, 64, valid.data());
  int accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    std::vector<uint8_t> input;
    if (i % 2 == 0) {
      input.resize(rng() % (kHeaderBytes * 2));
      for (auto& b : input) b = static_cast<uint8_t>(rng());
    } else {
      input = valid;
      for (int flips = 1 + rng() % 3; flips > 0; --flips) {
        input[rng() % input.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      }
      input.resize(rng() % (input.size() + 1));
    }
    LLVMFuzzerTestOneInput(input.data(), input.size());
    accepted += ParseHeader(input.data(), input.size(), kDefaultPayloadBytes).ok();
  }
  std::printf("packet_fuzzer_smoke: 200000 inputs, %d accepted headers, no crash\n", accepted);
  return accepted > 0 ? 0 : 1;  // mutated-valid inputs must sometimes still parse
}
