#include "daemon/queue/priority_packet_queue.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

namespace mlfabric::daemon {
namespace {

PacketDescriptor Packet(JobId job, TensorPriority priority, uint64_t offset,
                        TransferId transfer = 1) {
  PacketDescriptor p;
  p.job_id = job;
  p.transfer_id = transfer;
  p.tensor_id = priority;
  p.tensor_priority = priority;
  p.offset_bytes = offset;
  p.length_bytes = 100;
  return p;
}

PriorityPacketQueue MakeQueue(JobPriorityMode mode, std::vector<JobId> jobs,
                              double period_s = 20.0) {
  PriorityPacketQueue queue(*JobPriorityPolicy::Create({mode, period_s, 0.0}));
  for (JobId j : jobs) REQUIRE(queue.AddJob(j).ok());
  return queue;
}

TEST_CASE("SplitTensor cuts packets without copying and never splits elements") {
  std::vector<std::byte> buffer(10 * sizeof(float));
  auto packets = SplitTensor({3, 4, 5, 6}, buffer, 16, sizeof(float));
  REQUIRE(packets.ok());
  REQUIRE(packets->size() == 3);
  CHECK((*packets)[0].payload == buffer.data());
  CHECK((*packets)[2].payload == buffer.data() + 32);
  CHECK((*packets)[2].offset_bytes == 32);
  CHECK((*packets)[2].length_bytes == 8);
  CHECK((*packets)[1].job_id == 3);
  CHECK((*packets)[1].transfer_id == 4);
  CHECK((*packets)[1].tensor_id == 5);
  CHECK((*packets)[1].tensor_priority == 6);
  CHECK_FALSE(SplitTensor({}, buffer, 10, sizeof(float)).ok());  // 10 % 4 != 0
  CHECK_FALSE(SplitTensor({}, absl::MakeConstSpan(buffer).subspan(1), 16, 4).ok());
  CHECK_FALSE(SplitTensor({}, buffer, 0, 4).ok());
  CHECK(SplitTensor({}, {}, 16, 4)->empty());
}

TEST_CASE("Higher tensor priority (front layer) leaves first; FIFO within a priority") {
  PriorityPacketQueue queue = MakeQueue(JobPriorityMode::kFifo, {1});
  REQUIRE(queue.Push(Packet(1, 5, 0)).ok());
  REQUIRE(queue.Push(Packet(1, 5, 1)).ok());
  REQUIRE(queue.Push(Packet(1, 0, 0)).ok());
  REQUIRE(queue.Push(Packet(1, 5, 2)).ok());
  REQUIRE(queue.Push(Packet(1, 0, 1)).ok());
  CHECK(queue.size() == 5);
  CHECK(queue.queued_bytes() == 500);
  std::vector<std::pair<TensorPriority, uint64_t>> order;
  while (auto p = queue.Pop(0)) order.emplace_back(p->tensor_priority, p->offset_bytes);
  CHECK(order == std::vector<std::pair<TensorPriority, uint64_t>>{
                     {0, 0}, {0, 1}, {5, 0}, {5, 1}, {5, 2}});
  CHECK(queue.empty());
  CHECK(queue.queued_bytes() == 0);
  CHECK_FALSE(queue.Pop(0).has_value());
}

TEST_CASE("A high-priority tensor preempts a large low-priority one at the next packet") {
  PriorityPacketQueue queue = MakeQueue(JobPriorityMode::kFifo, {1});
  for (uint64_t i = 0; i < 1000; ++i) REQUIRE(queue.Push(Packet(1, 9, i)).ok());
  for (int i = 0; i < 3; ++i) CHECK(queue.Pop(0)->tensor_priority == 9);
  REQUIRE(queue.Push(Packet(1, 0, 0)).ok());
  CHECK(queue.Pop(0)->tensor_priority == 0);
  CHECK(queue.Pop(0)->offset_bytes == 3);
}

TEST_CASE("Job priority dominates tensor priority (TLs-One)") {
  PriorityPacketQueue queue = MakeQueue(JobPriorityMode::kOne, {7, 8});
  REQUIRE(queue.Push(Packet(8, 0, 0)).ok());   // job 8: front layer
  REQUIRE(queue.Push(Packet(7, 30, 0)).ok());  // job 7: back layer
  CHECK(queue.Peek(0)->job_id == 7);
  CHECK(queue.Pop(0)->job_id == 7);
  CHECK(queue.Pop(0)->job_id == 8);
}

TEST_CASE("fifo mode: jobs compete on tensor priority, then arrival") {
  PriorityPacketQueue queue = MakeQueue(JobPriorityMode::kFifo, {7, 8});
  REQUIRE(queue.Push(Packet(7, 3, 0)).ok());
  REQUIRE(queue.Push(Packet(8, 3, 0)).ok());
  REQUIRE(queue.Push(Packet(7, 3, 1)).ok());
  REQUIRE(queue.Push(Packet(8, 1, 0)).ok());
  std::vector<std::pair<JobId, TensorPriority>> order;
  while (auto p = queue.Pop(0)) order.emplace_back(p->job_id, p->tensor_priority);
  CHECK(order == std::vector<std::pair<JobId, TensorPriority>>{
                     {8, 1}, {7, 3}, {8, 3}, {7, 3}});
}

TEST_CASE("rr: which job goes first follows the rotation, with explicit times") {
  PriorityPacketQueue queue = MakeQueue(JobPriorityMode::kRr, {1, 2}, 20.0);
  for (uint64_t i = 0; i < 4; ++i) {
    REQUIRE(queue.Push(Packet(1, 0, i)).ok());
    REQUIRE(queue.Push(Packet(2, 0, i)).ok());
  }
  CHECK(queue.Pop(5.0)->job_id == 1);
  CHECK(queue.Pop(19.9)->job_id == 1);
  CHECK(queue.Pop(20.0)->job_id == 2);  // rotated: 2 > 1
  CHECK(queue.Pop(39.0)->job_id == 2);
  CHECK(queue.Pop(40.0)->job_id == 1);  // back to 1 > 2
  // Within a job, FIFO is kept across rotations.
  CHECK(queue.Pop(45.0)->offset_bytes == 3);
  CHECK(queue.Pop(60.0)->offset_bytes == 2);
}

TEST_CASE("Unregistered jobs are rejected; RemoveJob and RemoveTransfer drop packets") {
  PriorityPacketQueue queue = MakeQueue(JobPriorityMode::kOne, {1, 2});
  absl::Status status = queue.Push(Packet(3, 0, 0));
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(status.message().find("job 3") != std::string::npos);
  REQUIRE(queue.Push(Packet(1, 0, 0, /*transfer=*/10)).ok());
  REQUIRE(queue.Push(Packet(1, 1, 1, /*transfer=*/11)).ok());
  REQUIRE(queue.Push(Packet(1, 0, 2, /*transfer=*/10)).ok());
  REQUIRE(queue.Push(Packet(2, 0, 0, /*transfer=*/20)).ok());
  CHECK(queue.RemoveTransfer(10) == 2);
  CHECK(queue.size() == 2);
  CHECK(queue.queued_bytes() == 200);
  auto removed = queue.RemoveJob(1);
  REQUIRE(removed.ok());
  CHECK(*removed == 1);
  CHECK(queue.Pop(0)->transfer_id == 20);
  CHECK(queue.empty());
  CHECK(queue.RemoveJob(1).status().code() == absl::StatusCode::kNotFound);
}

// Property: with random pushes and pops at increasing times, every Pop
// returns the minimum of (job rank at now, tensor priority, arrival) over
// the pending packets -- i.e. strict priority, job over tensor, FIFO among
// equals -- in every mode.
TEST_CASE("Property: Pop matches a brute-force reference in every mode") {
  for (JobPriorityMode mode :
       {JobPriorityMode::kFifo, JobPriorityMode::kOne, JobPriorityMode::kRr}) {
    for (uint32_t seed = 1; seed <= 20; ++seed) {
      INFO("mode=" << JobPriorityModeName(mode) << " seed=" << seed);
      std::mt19937 rng(seed);
      auto policy = *JobPriorityPolicy::Create({mode, 1.0, 0.0});
      PriorityPacketQueue queue(policy);
      const int num_jobs = 1 + seed % 4;
      for (int j = 0; j < num_jobs; ++j) {
        double key = std::uniform_int_distribution<int>(0, 2)(rng);
        REQUIRE(queue.AddJob(j, key).ok());
        REQUIRE(policy.AddJob(j, key).ok());
      }
      struct Pending {
        PacketDescriptor packet;
        uint64_t sequence;
      };
      std::vector<Pending> pending;
      uint64_t sequence = 0;
      double now_s = 0;
      for (int step = 0; step < 2000; ++step) {
        now_s += std::uniform_real_distribution<double>(0, 0.05)(rng);
        if (std::uniform_int_distribution<int>(0, 2)(rng) != 0) {
          PacketDescriptor p = Packet(
              std::uniform_int_distribution<int>(0, num_jobs - 1)(rng),
              std::uniform_int_distribution<int>(0, 4)(rng), sequence);
          REQUIRE(queue.Push(p).ok());
          pending.push_back({p, sequence++});
          continue;
        }
        // Each job's rank at this instant, asked once: the reference
        // scans every pending packet (up to ~1,300) per pop.
        std::vector<JobPriorityPolicy::Rank> rank(num_jobs);
        for (int j = 0; j < num_jobs; ++j) rank[j] = *policy.RankOf(j, now_s);
        auto expected = std::min_element(
            pending.begin(), pending.end(), [&](const Pending& a, const Pending& b) {
              return std::make_tuple(rank[a.packet.job_id], a.packet.tensor_priority,
                                     a.sequence) <
                     std::make_tuple(rank[b.packet.job_id], b.packet.tensor_priority,
                                     b.sequence);
            });
        std::optional<PacketDescriptor> got = queue.Pop(now_s);
        if (pending.empty()) {
          REQUIRE_FALSE(got.has_value());
          continue;
        }
        REQUIRE(got.has_value());
        REQUIRE(got->offset_bytes == expected->sequence);
        pending.erase(expected);
        REQUIRE(queue.size() == pending.size());
      }
    }
  }
}

// Property: packets of equal (job, tensor priority) leave in push order no
// matter how pushes to other priorities interleave.
TEST_CASE("Property: FIFO within equal priority under interleaving") {
  const uint32_t seed = 4242;
  INFO("seed=" << seed);
  std::mt19937 rng(seed);
  PriorityPacketQueue queue = MakeQueue(JobPriorityMode::kOne, {0, 1, 2});
  std::map<std::pair<JobId, TensorPriority>, uint64_t> next_expected, next_pushed;
  for (int step = 0; step < 20000; ++step) {
    if (std::uniform_int_distribution<int>(0, 1)(rng) == 0) {
      JobId job = std::uniform_int_distribution<int>(0, 2)(rng);
      TensorPriority prio = std::uniform_int_distribution<int>(0, 3)(rng);
      REQUIRE(queue.Push(Packet(job, prio, next_pushed[{job, prio}]++)).ok());
    } else if (auto p = queue.Pop(step)) {
      REQUIRE(p->offset_bytes == next_expected[{p->job_id, p->tensor_priority}]++);
    }
  }
}

TEST_CASE("PeekSkipping keeps the strict order among the transfers not skipped") {
  PriorityPacketQueue q = MakeQueue(JobPriorityMode::kOne, {1, 2});
  REQUIRE(q.Push(Packet(1, 0, 0, /*transfer=*/10)).ok());
  REQUIRE(q.Push(Packet(1, 0, 100, 10)).ok());
  REQUIRE(q.Push(Packet(1, 0, 0, 11)).ok());
  REQUIRE(q.Push(Packet(1, 1, 0, 12)).ok());
  REQUIRE(q.Push(Packet(2, 0, 0, 20)).ok());
  CHECK(q.PeekSkipping(0, {})->transfer_id == q.Peek(0)->transfer_id);
  // Transfer 10 waits: 11 (same job and priority, later) is next, before
  // 12 (lower priority) and job 2 (lower rank).
  const auto next = q.PeekSkipping(0, {10});
  REQUIRE(next.has_value());
  CHECK(next->transfer_id == 11);
  CHECK(q.PeekSkipping(0, {10, 11})->transfer_id == 12);
  CHECK(q.PeekSkipping(0, {10, 11, 12})->transfer_id == 20);
  CHECK_FALSE(q.PeekSkipping(0, {10, 11, 12, 20}).has_value());
  // Removing that packet leaves the others in their order.
  CHECK(q.Remove(*next));
  CHECK_FALSE(q.Remove(*next));
  CHECK(q.size() == 4);
  CHECK(q.queued_bytes() == 400);
  CHECK(q.Pop(0)->offset_bytes == 0);
  CHECK(q.Pop(0)->offset_bytes == 100);
  CHECK(q.Pop(0)->transfer_id == 12);
  CHECK(q.Pop(0)->transfer_id == 20);
  CHECK(q.empty());
}

TEST_CASE("Restore puts a removed packet back exactly where it was") {
  PriorityPacketQueue q = MakeQueue(JobPriorityMode::kFifo, {1, 2});
  REQUIRE(q.Push(Packet(1, 0, 0, 10)).ok());
  REQUIRE(q.Push(Packet(2, 0, 0, 20)).ok());
  REQUIRE(q.Push(Packet(1, 0, 100, 10)).ok());
  REQUIRE(q.Push(Packet(1, 0, 200, 10)).ok());
  // Taken for a write, in order; the kernel took only the first.
  uint64_t s1 = 0, s2 = 0, s3 = 0;
  const PacketDescriptor a = *q.Peek(0);
  REQUIRE(q.Remove(a, &s1));
  const PacketDescriptor b = *q.Peek(0);
  REQUIRE(q.Remove(b, &s2));
  const PacketDescriptor c = *q.Peek(0);
  REQUIRE(q.Remove(c, &s3));
  CHECK(b.transfer_id == 20);
  // Something more urgent arrived meanwhile; the rest goes back.
  REQUIRE(q.Push(Packet(1, 0, 300, 10)).ok());  // later arrival: behind them
  REQUIRE(q.Restore(c, s3).ok());
  REQUIRE(q.Restore(b, s2).ok());
  CHECK(q.size() == 4);
  CHECK(q.queued_bytes() == 400);
  CHECK(q.Pop(0)->transfer_id == 20);
  CHECK(q.Pop(0)->offset_bytes == 100);
  CHECK(q.Pop(0)->offset_bytes == 200);
  CHECK(q.Pop(0)->offset_bytes == 300);
  CHECK(q.empty());
  // A job that left cannot have its packet back.
  REQUIRE(q.RemoveJob(2).ok());
  CHECK(q.Restore(b, s2).code() == absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace mlfabric::daemon
