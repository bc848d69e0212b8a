// CRC-32C throughput of every implementation path against memcpy on the
// same buffers: a cache-hot 32 KiB buffer (one Mercury packet payload, the
// daemon's case) and a 256 MiB buffer (memory-bound).
//
//   bazel run -c opt //common:crc32c_benchmark
//
// "GB/s" is buffer bytes per second (1e9). For memcpy the buffer is copied
// into a second buffer of the same size; "% memcpy" is crc speed relative to
// that copy, measured in this run. Each figure is the best of several timed
// repetitions (noise only ever slows a run down).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/crc32c.h"
#include "common/crc32c_internal.h"

namespace mlfabric {
namespace {

namespace ci = crc32c_internal;
using Clock = std::chrono::steady_clock;

// Best seconds per call of fn: `reps` timed batches of `calls` calls each.
template <typename Fn>
double BestSecondsPerCall(Fn fn, int calls, int reps) {
  fn();  // warm up: page faults, caches, the paths' constant tables
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i) fn();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, s / calls);
  }
  return best;
}

struct Path {
  const char* name;
  uint32_t (*extend)(uint32_t, const void*, size_t);
  bool available;
};

void BenchBuffer(const char* label, size_t bytes, int calls, int reps) {
  std::vector<uint8_t> src(bytes);
  std::vector<uint8_t> dst(bytes);
  std::mt19937_64 rng(1);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  const double copy_s = BestSecondsPerCall(
      [&] {
        std::memcpy(dst.data(), src.data(), bytes);
        asm volatile("" : : "r"(dst.data()) : "memory");
      },
      calls, reps);
  auto gbps = [&](double s) { return bytes / s / 1e9; };
  std::printf("%-10s %-22s %9.2f GB/s\n", label, "memcpy", gbps(copy_s));
  const Path paths[] = {
      {"software (table)", &ci::ExtendSoftware, true},
      {"slicing-by-8", &ci::ExtendSlicingBy8, true},
      {"sse42 serial", &ci::ExtendSse42Serial, ci::HasSse42()},
      {"sse42 3-way", &ci::ExtendSse42ThreeWay, ci::HasSse42()},
      {"vpclmul avx512", &ci::ExtendVpclmul, ci::HasVpclmul()},
      {"Crc32cExtend", &Crc32cExtend, true},
  };
  uint32_t reference = ci::ExtendSoftware(0, src.data(), bytes);
  for (const Path& path : paths) {
    if (!path.available) {
      std::printf("%-10s %-22s   (CPU lacks the instructions)\n", label, path.name);
      continue;
    }
    // The table path is ~20x slower: fewer calls keep the run short.
    const bool slow = path.extend == &ci::ExtendSoftware;
    uint32_t crc = 0;
    const double s = BestSecondsPerCall(
        [&] {
          crc = path.extend(0, src.data(), bytes);
          asm volatile("" : : "r"(crc) : "memory");
        },
        slow ? std::max(1, calls / 16) : calls, slow ? 2 : reps);
    std::printf("%-10s %-22s %9.2f GB/s  %6.0f%% memcpy%s\n", label, path.name, gbps(s),
                100 * copy_s / s, crc == reference ? "" : "  WRONG RESULT");
  }
}

// Small cache-hot buffers, where set-up and reduction costs show: how the
// paths compare below and around the vpclmul threshold (256 bytes).
void BenchSmallSizes() {
  std::printf("\nsmall cache-hot buffers, GB/s\n%-8s %10s %10s %10s %10s\n", "bytes",
              "serial", "3-way", "vpclmul", "dispatch");
  std::vector<uint8_t> src(8192);
  std::mt19937_64 rng(2);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (size_t bytes : {64, 128, 256, 384, 512, 1024, 1500, 4096, 8192}) {
    std::printf("%-8zu", bytes);
    for (auto extend : {&ci::ExtendSse42Serial, &ci::ExtendSse42ThreeWay, &ci::ExtendVpclmul,
                        &Crc32cExtend}) {
      const bool available = extend == &Crc32cExtend ||
                             (extend == &ci::ExtendVpclmul ? ci::HasVpclmul() : ci::HasSse42());
      if (!available) {
        std::printf(" %10s", "n/a");
        continue;
      }
      uint32_t crc = 0;
      const double s = BestSecondsPerCall(
          [&] {
            crc = extend(crc, src.data(), bytes);  // chained: measures latency too
            asm volatile("" : : "r"(crc) : "memory");
          },
          200000, 5);
      std::printf(" %10.2f", bytes / s / 1e9);
    }
    std::printf("\n");
  }
}

}  // namespace
}  // namespace mlfabric

int main() {
  std::printf("CRC-32C paths (Crc32cExtend dispatches to: %s)\n",
              mlfabric::crc32c_internal::SelectedPathName());
  mlfabric::BenchBuffer("32KiB-hot", 32 << 10, 20000, 7);
  mlfabric::BenchBuffer("256MiB", size_t{256} << 20, 2, 3);
  mlfabric::BenchSmallSizes();
  return 0;
}
