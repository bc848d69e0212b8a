// libFuzzer target for the Mercury packet parser (docs/architecture.md §5): any bytes
// must yield a header or an error, never a crash, and an accepted header
// must respect the payload limits. Build and run with clang:
//
//   tools/fuzz-packet              # 60 s of coverage-guided fuzzing
//
// Without clang the same entry point runs as a seeded smoke test
// (packet_fuzzer_smoke_test) under `bazel test`.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "daemon/transport/packet.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mlfabric::transport;
  auto header = ParseHeader(data, size, kDefaultPayloadBytes);
  if (!header.ok()) return 0;
  const uint32_t limit =
      header->kind == PacketKind::kData ? kDefaultPayloadBytes : kMaxControlBytes;
  if (header->length > limit) std::abort();
  // Re-encoding an accepted header reproduces the bytes it came from.
  uint8_t again[kHeaderBytes];
  EncodeHeader(*header, again);
  for (size_t i = 0; i < kHeaderBytes; ++i) {
    if (again[i] != data[i]) std::abort();
  }
  if (size >= kHeaderBytes + header->length) {
    (void)VerifyPayload(*header, data + kHeaderBytes);
  }
  return 0;
}
