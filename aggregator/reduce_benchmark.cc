// Weighted-sum kernel throughput against memcpy on the same buffers
// (target: >= 80% of memcpy), single- and
// multi-threaded, plus PacketPool::Add throughput for Mercury-sized packets
// against the bare kernel and memcpy doing the same work.
//
//   bazel run -c opt //aggregator:reduce_benchmark   (kernels are always -O2)
//
// "GB/s" is buffer bytes per second: n * sizeof(T) / time, for both the
// kernel (reads dst and src, writes dst: 3 bytes of memory traffic per
// buffer byte) and memcpy (reads src, writes dst: 2 bytes). The ratio is
// what matters: how fast gradients are summed relative to how fast they
// can merely be copied.
//
// The PacketPool table counts contribution bytes per second; "vs kern" is
// the bare kernel's time over the pool's for the same sums (what the pool's
// bookkeeping costs: one hash lookup, a coverage-range update and the
// per-packet credit per Add), "vs cpy" memcpy's time over the pool's.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <thread>
#include <vector>

#include "aggregator/packet_pool.h"
#include "aggregator/reduce.h"

namespace mlfabric::aggregator {
namespace {

using Clock = std::chrono::steady_clock;

// Runs fn repeatedly for at least min_seconds; returns seconds per call.
template <typename Fn>
double TimePerCall(Fn fn, double min_seconds = 0.25) {
  fn();  // warm up (page faults, caches)
  int64_t calls = 0;
  auto start = Clock::now();
  double elapsed = 0;
  int64_t batch = 1;
  while (elapsed < min_seconds) {
    for (int64_t i = 0; i < batch; ++i) fn();
    calls += batch;
    batch *= 2;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return elapsed / calls;
}

template <typename T>
void BenchSize(const char* type, size_t bytes, ReduceThreadPool* pool) {
  const size_t n = bytes / sizeof(T);
  std::vector<T> dst(n, T(1)), src(n, T(0));  // adding 0 keeps values stable
  const double copy_s = TimePerCall([&] {
    std::memcpy(dst.data(), src.data(), bytes);
    asm volatile("" : : "r"(dst.data()) : "memory");
  });
  const double single_s = TimePerCall([&] {
    WeightedSum(dst.data(), src.data(), T(0.5), n);
    asm volatile("" : : "r"(dst.data()) : "memory");
  });
  const double multi_s = TimePerCall([&] {
    ParallelWeightedSum(pool, dst.data(), src.data(), T(0.5), n);
    asm volatile("" : : "r"(dst.data()) : "memory");
  });
  auto gbps = [&](double s) { return bytes / s / 1e9; };
  std::printf("%-7s %10zu  %8.2f  %8.2f  %6.0f%%  %8.2f  %6.0f%%\n", type, bytes,
              gbps(copy_s), gbps(single_s), 100 * copy_s / single_s, gbps(multi_s),
              100 * copy_s / multi_s);
}

// Seconds per pass of `pass`, the best of several passes after a warm-up;
// `setup` runs untimed before each pass.
template <typename Setup, typename Pass>
double BestPass(Setup setup, Pass pass, int passes = 8) {
  double best = 1e30;
  for (int i = 0; i <= passes; ++i) {
    setup();
    const auto start = Clock::now();
    pass();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (i > 0) best = std::min(best, s);  // pass 0 warms up
  }
  return best;
}

// PacketPool::Add against the bare kernel and memcpy on the same work: a
// 64 MiB aggregate, `contributors` contributions arriving in 32 KiB packets
// interleaved packet by packet (as they arrive from the network). Each
// contribution's payload is one 32 KiB buffer reused (it comes from the
// receive buffer, hot in cache); the aggregate streams through memory.
// `layout_bytes` != packet size: contributors packetise off the pool's grid.
// `misaligned`: payloads start one byte past an element boundary (copied
// once to aligned scratch by the pool).
template <typename T>
void BenchPacketPool(DType dtype, int contributors, uint64_t layout_bytes, bool misaligned) {
  constexpr uint64_t kAggregateBytes = 64 << 20;
  constexpr uint32_t kPacketBytes = 32 << 10;
  std::vector<T> sum(kAggregateBytes / sizeof(T));
  std::vector<std::byte> payload_storage(layout_bytes + 1);
  std::vector<T> src(layout_bytes / sizeof(T), T(0));
  std::memcpy(payload_storage.data() + misaligned, src.data(), layout_bytes);
  const absl::Span<const std::byte> payload(payload_storage.data() + misaligned, layout_bytes);
  const absl::Span<std::byte> sum_bytes(reinterpret_cast<std::byte*>(sum.data()),
                                        kAggregateBytes);
  AggregationSpec spec;
  spec.dtype = dtype;
  spec.bytes = kAggregateBytes;
  spec.packet_bytes = kPacketBytes;
  spec.expected_contributions = static_cast<uint32_t>(contributors);

  PacketPool pool;
  std::vector<uint32_t> ready;
  ready.reserve(kAggregateBytes / kPacketBytes);
  bool all_ok = true;
  const double pool_s = BestPass(
      [&] {
        (void)pool.UnregisterTransfer(1);
        all_ok &= pool.RegisterTransfer(1, spec, sum_bytes).ok();
        for (int c = 0; c < contributors; ++c) all_ok &= pool.AddContributor(1, c).ok();
        ready.clear();
      },
      [&] {
        for (uint64_t off = 0; off < kAggregateBytes; off += layout_bytes) {
          const uint64_t length = std::min(layout_bytes, kAggregateBytes - off);
          for (int c = 0; c < contributors; ++c) {
            all_ok &= pool.Add(1, c, off, payload.subspan(0, length), &ready).ok();
          }
        }
      });
  all_ok &= ready.size() == kAggregateBytes / kPacketBytes && *pool.Complete(1);
  // The same passes without the pool: the kernel (or the wrapping integer
  // loop) and memcpy on the same ranges.
  const double kernel_s = BestPass([] {}, [&] {
    for (uint64_t off = 0; off < kAggregateBytes; off += layout_bytes) {
      const size_t n = std::min(layout_bytes, kAggregateBytes - off) / sizeof(T);
      T* dst = sum.data() + off / sizeof(T);
      for (int c = 0; c < contributors; ++c) {
        if constexpr (std::is_floating_point_v<T>) {
          WeightedSum(dst, src.data(), T(1), n);
        } else {
          for (size_t i = 0; i < n; ++i) dst[i] += src[i];
        }
      }
    }
    asm volatile("" : : "r"(sum.data()) : "memory");
  });
  const double copy_s = BestPass([] {}, [&] {
    for (uint64_t off = 0; off < kAggregateBytes; off += layout_bytes) {
      const uint64_t length = std::min(layout_bytes, kAggregateBytes - off);
      for (int c = 0; c < contributors; ++c) {
        std::memcpy(sum.data() + off / sizeof(T), src.data(), length);
        asm volatile("" : : "r"(sum.data()) : "memory");
      }
    }
  });
  const double in_bytes = double(kAggregateBytes) * contributors;
  auto gbps = [&](double s) { return in_bytes / s / 1e9; };
  std::printf("%-7s %2d  %9llu  %-3s  %8.2f  %8.2f  %8.2f  %7.0f%%  %7.0f%%  %6.0f  %s\n",
              DTypeName(dtype), contributors, static_cast<unsigned long long>(layout_bytes),
              misaligned ? "yes" : "no", gbps(copy_s), gbps(kernel_s), gbps(pool_s),
              100 * kernel_s / pool_s, 100 * copy_s / pool_s,
              pool_s / (in_bytes / layout_bytes) * 1e9, all_ok ? "" : "ERRORS");
}

void BenchPacketPools() {
  std::printf("\nPacketPool::Add on a 64 MiB aggregate, 32 KiB grid; GB/s of contributions\n");
  std::printf("%-7s %2s  %9s  %-3s  %8s  %8s  %8s  %8s  %8s  %6s\n", "type", "c", "layout",
              "mis", "memcpy", "kernel", "pool", "vs kern", "vs cpy", "ns/add");
  BenchPacketPool<float>(DType::kFloat32, 4, 32 << 10, false);
  BenchPacketPool<float>(DType::kFloat32, 1, 32 << 10, false);
  BenchPacketPool<float>(DType::kFloat32, 4, 4 << 10, false);
  BenchPacketPool<float>(DType::kFloat32, 4, 9000, false);  // jumbo-frame payloads
  BenchPacketPool<float>(DType::kFloat32, 4, 32 << 10, true);
  BenchPacketPool<double>(DType::kFloat64, 4, 32 << 10, false);
  BenchPacketPool<uint32_t>(DType::kInt32, 4, 32 << 10, false);
}

}  // namespace
}  // namespace mlfabric::aggregator

int main() {
  using namespace mlfabric::aggregator;
  const int workers = std::max(1u, std::thread::hardware_concurrency()) - 1;
  ReduceThreadPool pool(workers);
  std::printf("kernel ISA: %s; multi-thread = caller + %d worker(s)\n", KernelIsa(),
              workers);
  std::printf("%-7s %10s  %8s  %8s  %7s  %8s  %7s\n", "type", "bytes", "memcpy", "1-thread",
              "vs cpy", "multi", "vs cpy");
  for (size_t bytes : {size_t(32) << 10, size_t(1) << 20, size_t(64) << 20}) {
    BenchSize<float>("float32", bytes, &pool);
    BenchSize<double>("float64", bytes, &pool);
  }
  BenchPacketPools();
  return 0;
}
