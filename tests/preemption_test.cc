// Cross-process test of Mercury's packet-priority preemption (mercury.md
// §IV, docs/architecture.md §5): a small tensor pushed while a 1 GiB low-priority
// transfer from the same host is in flight goes out ahead of the rest of
// it, over the same TCP connection, through the sending daemon's
// PriorityPacketQueue.
//
// Why the FIFO planner: it starts every transfer at once at full rate
// ("vanilla PS"), so the urgent transfer is released into the sending
// daemon's queue while the large one still has most of its packets queued
// there — only the queue's (priority, arrival) order decides who goes
// first. The MLfabric planner would schedule the later transfer after the
// earlier one on the busy link (no contention in the queue), and a single
// push with several tensors tests ordering within one release, not
// preemption of a transfer already in flight (the queue's unit tests cover
// that).
//
// Assertions are about order, not time: the urgent transfer is released
// after the large one's first packet arrived and before its last did, and
// then completes before it (or, with a priority value above the large
// one's, strictly after it). The preemption latency in packet-times is
// printed, not asserted; bench/ measures it on a shaped link.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "launch/cluster.h"
#include "launch/process.h"
#include "testing/apps/dataplane_trace.h"

namespace mlfabric {
namespace {

using bench::Arrival;
using bench::PlannedTransfer;
using launch::BinaryPath;
using launch::ReadFile;
using launch::WaitUntil;

constexpr int64_t kLargeBytes = int64_t{1} << 30;
constexpr int64_t kUrgentBytes = 256 << 10;
constexpr int kLargePriority = 10;
constexpr int64_t kPayloadBytes = 32 << 10;  // the daemon's default packet payload
// Pacing w1's uplink keeps the 1 GiB transfer in flight for ~2 s whatever
// the loopback speed, so the urgent push lands in its middle.
constexpr double kUplinkBps = 4e9;

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::optional<PlannedTransfer> FindPlanned(int admin_port, int64_t bytes) {
  auto planned = bench::FetchPlannedTransfers(admin_port, "ps0");
  if (!planned.ok()) return std::nullopt;
  for (const PlannedTransfer& t : *planned) {
    if (t.bytes == bytes) return t;
  }
  return std::nullopt;
}

struct PreemptionRun {
  Arrival large, urgent;
  PlannedTransfer urgent_planned;
  std::vector<bench::Delivered> delivered;
};

PreemptionRun RunPreemption(int urgent_priority) {
  const std::string dir = launch::MakeTempDir("preemption");
  const std::string admin_port_file = dir + "/admin.port";
  // The FIFO planner plans the later push as if the link were free, so a
  // push that waits behind the whole 1 GiB transfer (the second case) ends
  // long after its planned end: as long as the large one takes, which on a
  // VM that backs fresh memory slowly was 7-10 s for its new receive
  // buffer, past the default transfer_slack_s of 10 s (it then failed as
  // timed out). This test is about order, not that timeout.
  auto cluster = launch::Cluster::StartLoopback(
      {"s1", "w1"},
      {"--planner=fifo", "--admin_port=0", "--admin_port_file=" + admin_port_file,
       "--transfer_slack_s=120"},
      {"--log_level=debug"}, {{"w1", {"--uplink_bps=" + std::to_string(kUplinkBps)}}});
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  launch::Cluster& c = **cluster;
  REQUIRE(WaitUntil([&] { return !ReadFile(admin_port_file).empty(); }, 10));
  const int admin_port = std::atoi(ReadFile(admin_port_file).c_str());

  auto server = c.StartApp("server", {BinaryPath("testing/apps/dataplane_server"),
                                      "--socket=" + c.Socket("s1"), "--expect_updates=2"});
  REQUIRE(server.ok());
  const std::string go_file = dir + "/go";
  auto urgent = c.StartApp(
      "urgent", {BinaryPath("testing/apps/dataplane_pusher"), "--socket=" + c.Socket("w1"),
                 "--name=urgent", "--seed=7", "--bytes=" + std::to_string(kUrgentBytes),
                 "--priority=" + std::to_string(urgent_priority), "--go_file=" + go_file});
  REQUIRE(urgent.ok());
  REQUIRE(WaitUntil([&] { return (*urgent)->Log().find("ready") != std::string::npos; }, 30));
  auto large = c.StartApp(
      "large", {BinaryPath("testing/apps/dataplane_pusher"), "--socket=" + c.Socket("w1"),
                "--name=large", "--seed=3", "--bytes=" + std::to_string(kLargeBytes),
                "--priority=" + std::to_string(kLargePriority)});
  REQUIRE(large.ok());
  std::optional<PlannedTransfer> large_planned;
  REQUIRE(WaitUntil([&] { return (large_planned = FindPlanned(admin_port, kLargeBytes)).has_value(); },
                    60));
  // Release the urgent push a little into the large transfer (the
  // scheduler's clock is this machine's steady clock).
  REQUIRE(WaitUntil([&] { return NowSeconds() > large_planned->start_s + 0.2; }, 10));
  std::ofstream(go_file) << "go\n";

  const auto large_exit = (*large)->WaitFor(90);
  const auto urgent_exit = (*urgent)->WaitFor(30);
  INFO("large pusher: " << (*large)->Log());
  INFO("urgent pusher: " << (*urgent)->Log());
  INFO("server: " << (*server)->Log());
  REQUIRE(large_exit == 0);
  REQUIRE(urgent_exit == 0);
  REQUIRE(WaitUntil([&] { return (*server)->Log().find("done") != std::string::npos; }, 30));

  PreemptionRun run;
  auto urgent_planned = FindPlanned(admin_port, kUrgentBytes);
  REQUIRE(urgent_planned.has_value());
  run.urgent_planned = *urgent_planned;
  const std::vector<Arrival> arrivals = bench::ParseArrivals(c.daemon("s1").Log());
  auto large_arrival = bench::FindArrival(arrivals, large_planned->transfer_id);
  auto urgent_arrival = bench::FindArrival(arrivals, urgent_planned->transfer_id);
  INFO("s1 daemon log: " << c.daemon("s1").Log().substr(0, 4000));
  REQUIRE(large_arrival.has_value());
  REQUIRE(urgent_arrival.has_value());
  run.large = *large_arrival;
  run.urgent = *urgent_arrival;
  run.delivered = bench::ParseDeliveries((*server)->Log());
  return run;
}

// Latencies count from the urgent transfer's scheduled start, so they
// include the schedule's trip from the scheduler to w1's daemon. The urgent
// tensor's own 8 packets take 8 packet-times of the completion figure.
void PrintFigures(const PreemptionRun& run, const char* label) {
  const double large_rate_bps =
      run.large.bytes / std::max(1e-9, run.large.complete_s - run.large.first_packet_s);
  const double packet_s = kPayloadBytes / large_rate_bps;
  const double first_s = run.urgent.first_packet_s - run.urgent_planned.start_s;
  const double latency_s = run.urgent.complete_s - run.urgent_planned.start_s;
  std::printf(
      "%s: large %.2f GB/s (packet-time %.1f us); urgent 256 KiB (8 packets) released at "
      "+%.3f s; its first packet in %.3f ms = %.1f packet-times, complete %.3f ms after release "
      "= %.1f packet-times; large completes %.3f s after the urgent one\n",
      label, large_rate_bps / 1e9, packet_s * 1e6,
      run.urgent_planned.start_s - run.large.first_packet_s, first_s * 1e3, first_s / packet_s,
      latency_s * 1e3, latency_s / packet_s, run.large.complete_s - run.urgent.complete_s);
}

TEST_CASE("An urgent tensor overtakes a 1 GiB low-priority transfer already in flight") {
  const PreemptionRun run = RunPreemption(/*urgent_priority=*/0);
  PrintFigures(run, "priority 0 vs 10");
  // Precondition: the urgent transfer was released while the large one
  // was arriving.
  REQUIRE(run.large.first_packet_s < run.urgent_planned.start_s);
  REQUIRE(run.urgent_planned.start_s < run.large.complete_s);
  CHECK(run.urgent.priority == 0);
  CHECK(run.large.priority == kLargePriority);
  // Preempted: the urgent one is complete while the large one is not.
  CHECK(run.urgent.first_packet_s > run.large.first_packet_s);
  CHECK(run.urgent.complete_s < run.large.complete_s);
  // Both arrive intact and are delivered in commit order (large first).
  REQUIRE(run.delivered.size() == 2);
  CHECK(run.delivered[0].bytes == kLargeBytes);
  CHECK(run.delivered[0].verdict == "ok");
  CHECK(run.delivered[1].bytes == kUrgentBytes);
  CHECK(run.delivered[1].verdict == "ok");
}

TEST_CASE("A less urgent tensor waits behind the whole in-flight transfer") {
  const PreemptionRun run = RunPreemption(/*urgent_priority=*/20);
  PrintFigures(run, "priority 20 vs 10");
  REQUIRE(run.large.first_packet_s < run.urgent_planned.start_s);
  REQUIRE(run.urgent_planned.start_s < run.large.complete_s);
  // One connection, one receiving thread: every packet of the large
  // transfer is in before the first of the less urgent one.
  CHECK(run.urgent.first_packet_s >= run.large.complete_s);
  REQUIRE(run.delivered.size() == 2);
  CHECK(run.delivered[0].verdict == "ok");
  CHECK(run.delivered[1].verdict == "ok");
}

}  // namespace
}  // namespace mlfabric
