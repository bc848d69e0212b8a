// The daemon's data plane on a shaped link: two hosts s1 and w1, each in its
// own network namespace, w1's uplink an htb class (launch/cluster.h,
// kNetns). Needs root; otherwise prints "SKIPPED: <reason>".
//
// 1. Pacing follows the schedule (docs/architecture.md §5, "Pacing"): with the FIFO
//    planner a transfer's one rate segment is the worker's declared uplink.
//    On a 400 Mbit/s link, declared rates of 100 and 250 Mbit/s are what
//    the receiver measures (the token bucket, not the link, limits), and a
//    declared 1 Gbit/s is held to the link's 400.
// 2. TensorLights job priority in the daemon's queue (tensorlights.md
//    §IV-B/C): two co-located jobs push from w1 to servers on s1; the job
//    released second overtakes the first only when it ranks higher — never
//    in fifo (arrival order), always for the top job in TLs-One, and in
//    TLs-RR for whichever job is on top in the current rotation period.
//
// Order assertions are exact. Rate assertions bound the receiver's goodput
// from both sides (the bounds and why are at the checks): never more than
// the scheduled rate plus one burst, and within 10% below it (the token
// bucket, not noise, sets the rate: measured 100.4 and 250.7 Mbit/s for
// 100 and 250 scheduled, daemon/README.md).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <thread>

#include "launch/cluster.h"
#include "launch/process.h"
#include "testing/apps/dataplane_trace.h"
#include "testing/prereq.h"

namespace mlfabric {
namespace {

using bench::Arrival;
using bench::PlannedTransfer;
using launch::BinaryPath;
using launch::WaitUntil;

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Creates the testbed (s1 and w1 in namespaces, w1's uplink at `link_bps`,
// every other direction unshaped, the scheduler's admin port on) or
// explains why not (the caller prints SKIPPED).
std::unique_ptr<launch::Cluster> CreateOrSkip(double link_bps, std::string* why) {
  launch::ClusterOptions options;
  options.topology = launch::Topology::kNetns;
  options.hosts = {"s1", "w1"};
  options.rates["w1"].up_bps = link_bps;
  options.admin = true;
  auto bed = launch::Cluster::Create(options);
  if (!bed.ok()) {
    // Only a missing privilege or tool is a reason to skip.
    REQUIRE(bed.status().code() == absl::StatusCode::kFailedPrecondition);
    *why = std::string(bed.status().message());
    return nullptr;
  }
  return std::move(*bed);
}

#define SKIP_WITHOUT_NETNS(bed_expr, bed_var)        \
  std::string why;                                   \
  auto bed_var = CreateOrSkip(bed_expr, &why);       \
  if (bed_var == nullptr) {                          \
    MLFABRIC_SKIP_TEST(why);                         \
  }

// Bytes delivered so far to s1 (its end of the shaped path).
absl::StatusOr<uint64_t> ServerRxBytes(launch::Cluster& bed) {
  auto bytes = bed.ReadLinkBytes();
  if (!bytes.ok()) return bytes.status();
  return bytes->at("s1").down;
}

// The newest planned transfer to `server` of `bytes` bytes with an id
// above `after` (ids grow with every submitted push).
std::optional<PlannedTransfer> NewestPlanned(launch::Cluster& bed, const std::string& server,
                                             int64_t bytes, uint64_t after) {
  auto planned = bench::FetchPlannedTransfers(bed.admin_port(), server);
  if (!planned.ok()) return std::nullopt;
  std::optional<PlannedTransfer> newest;
  for (const PlannedTransfer& t : *planned) {
    if (t.bytes == bytes && t.transfer_id > after &&
        (!newest || t.transfer_id > newest->transfer_id)) {
      newest = t;
    }
  }
  return newest;
}

uint64_t LastPlannedId(launch::Cluster& bed) {
  uint64_t last = 0;
  for (const std::string server : {"psa", "psb"}) {
    auto planned = bench::FetchPlannedTransfers(bed.admin_port(), server);
    REQUIRE(planned.ok());
    for (const PlannedTransfer& t : *planned) last = std::max(last, t.transfer_id);
  }
  return last;
}

std::vector<std::string> Pusher(launch::Cluster& bed, const std::string& job,
                                const std::string& server, int64_t bytes, int seed,
                                const std::string& go_file = "") {
  std::vector<std::string> argv = {BinaryPath("testing/apps/dataplane_pusher"),
                                   "--socket=" + bed.Socket("w1"),
                                   "--name=w-" + job + "-" + std::to_string(seed),
                                   "--job=" + job,
                                   "--token=" + (job == "demo" ? std::string("demo-token-0123456789")
                                                               : "token-" + job + "-0123456789"),
                                   "--server=" + server,
                                   "--bytes=" + std::to_string(bytes),
                                   "--seed=" + std::to_string(seed)};
  if (!go_file.empty()) argv.push_back("--go_file=" + go_file);
  return argv;
}

// ------------------------------------------------------------ 1. pacing

struct PacedRun {
  double goodput_bps = 0;      // receiver: bytes * 8 / (complete - first packet)
  double peak_window_bps = 0;  // interface counter, busiest 200 ms window
};

// nullopt (with *why) when namespaces are not available.
std::optional<PacedRun> RunPaced(double link_bps, double declared_bps, int64_t bytes,
                                 std::string* why) {
  PacedRun run;
  auto bed = CreateOrSkip(link_bps, why);
  if (bed == nullptr) return std::nullopt;
  auto started = bed->Start({"--planner=fifo"}, {"--log_level=debug"},
                                   {{"w1", {"--uplink_bps=" + std::to_string(declared_bps)}}});
  INFO(started.ToString());
  REQUIRE(started.ok());
  auto server = bed->StartApp("server", {BinaryPath("testing/apps/dataplane_server"),
                                         "--socket=" + bed->Socket("s1")});
  REQUIRE(server.ok());
  auto pusher = bed->StartApp("pusher", Pusher(*bed, "demo", "ps0", bytes, 5));
  REQUIRE(pusher.ok());
  // Sample s1's interface every 10 ms while the pusher runs.
  std::vector<std::pair<double, uint64_t>> samples;
  while ((*pusher)->Running()) {
    if (auto rx = ServerRxBytes(*bed); rx.ok()) samples.emplace_back(NowSeconds(), *rx);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  INFO((*pusher)->Log());
  REQUIRE((*pusher)->WaitFor(0) == 0);
  auto arrivals = bench::ParseArrivals(bed->daemon("s1").Log());
  REQUIRE(arrivals.size() == 1);
  run.goodput_bps = 8.0 * arrivals[0].bytes / (arrivals[0].complete_s - arrivals[0].first_packet_s);
  for (size_t i = 0, j = 0; j < samples.size(); ++j) {
    while (samples[j].first - samples[i].first > 0.2) ++i;
    if (samples[j].first - samples[i].first >= 0.15) {
      run.peak_window_bps = std::max(run.peak_window_bps,
                                     8.0 * (samples[j].second - samples[i].second) /
                                         (samples[j].first - samples[i].first));
    }
  }
  std::printf("link %.0f Mbit/s, scheduled %.0f Mbit/s: goodput %.1f Mbit/s, busiest 200 ms on "
              "the wire %.1f Mbit/s\n",
              link_bps / 1e6, declared_bps / 1e6, run.goodput_bps / 1e6,
              run.peak_window_bps / 1e6);
  return run;
}

TEST_CASE("Throughput follows the scheduled rate below the link rate, and the link above it") {
  constexpr double kLink = 400e6;
  constexpr int64_t kBytes = 12 << 20;
  std::string why;
  const std::optional<PacedRun> slow_run = RunPaced(kLink, 100e6, kBytes, &why);
  if (!slow_run.has_value()) {
    MLFABRIC_SKIP_TEST(why);
  }
  const PacedRun slow = *slow_run;
  const PacedRun fast = RunPaced(kLink, 250e6, kBytes, &why).value();
  const PacedRun over = RunPaced(kLink, 1e9, kBytes, &why).value();
  // Never above the schedule (2-packet burst over 12 MiB is < 1%).
  CHECK(slow.goodput_bps <= 100e6 * 1.02);
  CHECK(fast.goodput_bps <= 250e6 * 1.02);
  CHECK(over.goodput_bps <= kLink * 1.02);
  // And at most 10% below it. The pacer's token bucket refills at the
  // scheduled rate and the link has room to spare (400 Mbit/s), so the
  // goodput is the rate (measured 1.004x and 1.003x): a 1 s transfer
  // (12 MiB at 100 Mbit/s) loses 10% only if the pacer stalls ~100 ms in
  // all, far more than scheduling noise on a shared 2-core machine, and
  // what a pacer that over-sleeps or a rate in the wrong unit would do.
  CHECK(slow.goodput_bps >= 100e6 * 0.9);
  CHECK(fast.goodput_bps >= 250e6 * 0.9);
  // Link-bound: the goodput is the link less TCP/IP headers (1448 of
  // every 1514 bytes on the wire, 0.956) and htb's accounting; measured
  // 383.7 Mbit/s (0.96x). 0.85x leaves 11% for noise, and still fails a
  // sender that, told 1 Gbit/s, paces below the link.
  CHECK(over.goodput_bps >= kLink * 0.85);
  // The faster schedule is faster; the over-stated one is link-bound.
  CHECK(fast.goodput_bps > slow.goodput_bps * 1.5);
}

// ------------------------------------------------------ 2. job priority

constexpr int64_t kJobBytes = 16 << 20;  // 0.7 s at 200 Mbit/s

// Two jobs with a server each on s1; each job has pushed once from w1, job
// "a" first, so w1's queue has registered a then b (TLs-One ranks a first).
void StartTwoJobs(launch::Cluster& bed, const std::string& mode, double period_s) {
  const std::string config = bed.dir() + "/jobs.json";
  std::ofstream(config) << R"({"jobs": [{"name": "a", "token": "token-a-0123456789"},
                                      {"name": "b", "token": "token-b-0123456789"}]})";
  auto started = bed.Start(
      {"--planner=fifo", "--config=" + config},
      {"--log_level=debug", "--job_priority=" + mode,
       "--job_priority_period_s=" + std::to_string(period_s)},
      {});
  INFO(started.ToString());
  REQUIRE(started.ok());
  for (const std::string job : {"a", "b"}) {
    auto server = bed.StartApp("server-" + job, {BinaryPath("testing/apps/dataplane_server"),
                                                 "--socket=" + bed.Socket("s1"), "--job=" + job,
                                                 "--token=" + (job == "demo" ? std::string("demo-token-0123456789")
                                                               : "token-" + job + "-0123456789"), "--name=ps" + job});
    REQUIRE(server.ok());
  }
  for (const std::string job : {"a", "b"}) {
    auto warm = bed.StartApp("warm-" + job, Pusher(bed, job, "ps" + job, 4096, 1));
    REQUIRE(warm.ok());
    INFO((*warm)->Log());
    REQUIRE((*warm)->WaitFor(60) == 0);
  }
}

struct Race {
  Arrival first, second;  // by release order
};

// Releases `first_job`'s transfer, then `second_job`'s while it is on the
// wire; returns both arrivals.
Race RunRace(launch::Cluster& bed, const std::string& first_job, const std::string& second_job,
             int seed) {
  const uint64_t before = LastPlannedId(bed);
  const std::string go_file = bed.dir() + "/go-" + std::to_string(seed);
  auto second = bed.StartApp("second-" + std::to_string(seed),
                             Pusher(bed, second_job, "ps" + second_job, kJobBytes, seed + 1, go_file));
  REQUIRE(second.ok());
  REQUIRE(WaitUntil([&] { return (*second)->Log().find("ready") != std::string::npos; }, 30));
  auto first = bed.StartApp("first-" + std::to_string(seed),
                            Pusher(bed, first_job, "ps" + first_job, kJobBytes, seed));
  REQUIRE(first.ok());
  std::optional<PlannedTransfer> first_planned;
  REQUIRE(WaitUntil(
      [&] {
        first_planned = NewestPlanned(bed, "ps" + first_job, kJobBytes, before);
        return first_planned.has_value();
      },
      30));
  REQUIRE(WaitUntil([&] { return NowSeconds() > first_planned->start_s + 0.02; }, 10));
  std::ofstream(go_file) << "go\n";
  INFO((*first)->Log() << (*second)->Log());
  REQUIRE((*first)->WaitFor(60) == 0);
  REQUIRE((*second)->WaitFor(60) == 0);
  auto second_planned = NewestPlanned(bed, "ps" + second_job, kJobBytes, before);
  REQUIRE(second_planned.has_value());
  const auto arrivals = bench::ParseArrivals(bed.daemon("s1").Log());
  auto a = bench::FindArrival(arrivals, first_planned->transfer_id);
  auto b = bench::FindArrival(arrivals, second_planned->transfer_id);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  std::printf("%s then %s: %s arrives [%.3f, %.3f] s, %s [%.3f, %.3f] s (from the first's "
              "first packet)\n",
              first_job.c_str(), second_job.c_str(), first_job.c_str(), 0.0,
              a->complete_s - a->first_packet_s, second_job.c_str(),
              b->first_packet_s - a->first_packet_s, b->complete_s - a->first_packet_s);
  // Precondition: the second was released while the first was arriving.
  REQUIRE(second_planned->start_s < a->complete_s);
  REQUIRE(a->first_packet_s < second_planned->start_s);
  return {*a, *b};
}

TEST_CASE("fifo: a co-located job's transfer waits for the one released before it") {
  SKIP_WITHOUT_NETNS(200e6, bed);
  std::printf("job priority fifo:\n");
  StartTwoJobs(*bed, "fifo", 20);
  const Race race = RunRace(*bed, "a", "b", 10);
  CHECK(race.second.first_packet_s >= race.first.complete_s);
  const Race reverse = RunRace(*bed, "b", "a", 20);
  CHECK(reverse.second.first_packet_s >= reverse.first.complete_s);
}

TEST_CASE("TLs-One: the top-ranked job overtakes, the other never does") {
  SKIP_WITHOUT_NETNS(200e6, bed);
  std::printf("job priority one (a ranked first):\n");
  StartTwoJobs(*bed, "one", 20);
  // a ranks first (it arrived first at w1's queue).
  const Race a_overtakes = RunRace(*bed, "b", "a", 10);
  CHECK(a_overtakes.second.complete_s < a_overtakes.first.complete_s);
  const Race b_waits = RunRace(*bed, "a", "b", 20);
  CHECK(b_waits.second.first_packet_s >= b_waits.first.complete_s);
}

TEST_CASE("TLs-RR: the job on top in the current period goes first") {
  SKIP_WITHOUT_NETNS(200e6, bed);
  // The daemon's rotation counts whole periods of its steady clock (epoch
  // 0); the test shares that clock. Base order: a, b.
  constexpr double kPeriod = 4.0;
  std::printf("job priority rr (period %.0f s):\n", kPeriod);
  StartTwoJobs(*bed, "rr", kPeriod);
  auto top_at = [&](double t) { return static_cast<int64_t>(t / kPeriod) % 2 == 0 ? "a" : "b"; };
  for (const std::string wanted_top : {"a", "b"}) {
    // Start early in a period with `wanted_top` on top, released second.
    REQUIRE(WaitUntil(
        [&] {
          const double now = NowSeconds();
          return top_at(now) == wanted_top && std::fmod(now, kPeriod) < 0.3;
        },
        3 * kPeriod));
    const std::string other = wanted_top == "a" ? "b" : "a";
    const Race race = RunRace(*bed, other, wanted_top, wanted_top == "a" ? 30 : 40);
    // Precondition: the race happened within one period.
    const double period_start = std::floor(race.first.first_packet_s / kPeriod) * kPeriod;
    INFO("first " << race.first.first_packet_s << " .. " << race.first.complete_s << ", second "
                  << race.second.first_packet_s << " .. " << race.second.complete_s);
    REQUIRE(top_at(race.first.first_packet_s) == wanted_top);
    REQUIRE(std::max(race.first.complete_s, race.second.complete_s) < period_start + kPeriod);
    CHECK(race.second.complete_s < race.first.complete_s);
  }
}

}  // namespace
}  // namespace mlfabric
