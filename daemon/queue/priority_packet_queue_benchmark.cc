// Push+Pop throughput of PriorityPacketQueue: the per-packet scheduling cost
// Mercury requires to be far below a packet time (mercury.md §IV-A: "the
// overhead to choose the packet with the highest priority does not impair
// the throughput"). A 32 KiB packet at 10 Gbit/s takes 26 us.
//
//   bazel run -c opt //daemon/queue:priority_packet_queue_benchmark
#include <chrono>
#include <cstdio>
#include <random>

#include "daemon/queue/priority_packet_queue.h"

namespace mlfabric::daemon {
namespace {

void Run(JobPriorityMode mode, int num_jobs, int num_priorities) {
  PriorityPacketQueue queue(*JobPriorityPolicy::Create({mode, 20.0, 0.0}));
  for (int j = 0; j < num_jobs; ++j) (void)queue.AddJob(j);
  std::mt19937 rng(1);
  const int kPackets = 1 << 20;
  std::vector<PacketDescriptor> packets(kPackets);
  for (int i = 0; i < kPackets; ++i) {
    packets[i].job_id = rng() % num_jobs;
    packets[i].tensor_priority = rng() % num_priorities;
    packets[i].length_bytes = 32768;
  }
  auto start = std::chrono::steady_clock::now();
  uint64_t checksum = 0;
  // Keep ~1024 packets queued: push one, pop one.
  for (int i = 0; i < 1024; ++i) (void)queue.Push(packets[i]);
  for (int i = 1024; i < kPackets; ++i) {
    (void)queue.Push(packets[i]);
    checksum += queue.Pop(i * 1e-5)->tensor_priority;
  }
  while (auto p = queue.Pop(100.0)) checksum += p->tensor_priority;
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("mode=%-4s jobs=%d priorities=%-4d  %.1f ns per push+pop  (%.2f Mpkt/s, checksum %llu)\n",
              JobPriorityModeName(mode), num_jobs, num_priorities, seconds / kPackets * 1e9,
              kPackets / seconds / 1e6, static_cast<unsigned long long>(checksum));
}

}  // namespace
}  // namespace mlfabric::daemon

int main() {
  using mlfabric::daemon::JobPriorityMode;
  mlfabric::daemon::Run(JobPriorityMode::kFifo, 1, 8);
  mlfabric::daemon::Run(JobPriorityMode::kFifo, 1, 260);
  mlfabric::daemon::Run(JobPriorityMode::kOne, 4, 260);
  mlfabric::daemon::Run(JobPriorityMode::kRr, 8, 260);
  return 0;
}
