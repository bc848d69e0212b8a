// Weighted-sum kernel throughput against memcpy on the same buffers
// (issue 4 benchmark 3: target >= 80% of memcpy), single- and
// multi-threaded, plus PacketPool throughput for Mercury-sized packets.
//
//   bazel run //aggregator:reduce_benchmark     (kernels are always -O2)
//
// "GB/s" is buffer bytes per second: n * sizeof(T) / time, for both the
// kernel (reads dst and src, writes dst: 3 bytes of memory traffic per
// buffer byte) and memcpy (reads src, writes dst: 2 bytes). The ratio is
// what matters: how fast gradients are summed relative to how fast they
// can merely be copied.
#include <chrono>
#include <cstdio>
#include <cstring>
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

void BenchPacketPool(size_t packet_bytes, int contributors) {
  const size_t tensor_bytes = 64 << 20;
  AggregationSpec spec;
  spec.dtype = DType::kFloat32;
  spec.packet_bytes = packet_bytes;
  spec.tensors = {{0, tensor_bytes}};
  for (int c = 0; c < contributors; ++c) spec.contributors.push_back({uint32_t(c), 1.0});
  std::vector<float> payload(packet_bytes / sizeof(float), 1.0f);
  absl::Span<const std::byte> bytes(reinterpret_cast<const std::byte*>(payload.data()),
                                    packet_bytes);
  PacketPool pool;
  TransferId transfer = 0;
  uint64_t released = 0;
  const double seconds = TimePerCall([&] {
    (void)pool.RegisterTransfer(++transfer, spec);
    for (uint64_t off = 0; off < tensor_bytes; off += packet_bytes) {
      for (int c = 0; c < contributors; ++c) {
        auto r = pool.Add({transfer, 0, off}, c, bytes);
        released += r.ok() && r->has_value();
      }
    }
    (void)pool.UnregisterTransfer(transfer);
  }, 0.5);
  const double in_bytes = double(tensor_bytes) * contributors;
  std::printf("PacketPool %4zu KiB packets, %d contributors: %.2f GB/s of contributions "
              "(%.1f Gbit/s), %.0f ns per packet\n",
              packet_bytes / 1024, contributors, in_bytes / seconds / 1e9,
              in_bytes * 8 / seconds / 1e9,
              seconds / (double(tensor_bytes) / packet_bytes * contributors) * 1e9);
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
  BenchPacketPool(32 << 10, 4);
  return 0;
}
