// Cross-process test that pulls are prioritised like pushes: a server
// daemon streams get replies (a server's model sent back to the asking
// daemon) through its PriorityPacketQueue, so a small get issued while a
// large reply is in flight overtakes it when it ranks higher — by the get's
// priority within a job (Mercury, mercury.md §IV: packet priorities over
// one queue; Worker::Get's `priority`, lower first) and by the job's rank
// across jobs (TensorLights, tensorlights.md §IV-B: TLs-One ranks the job
// listed first in the scheduler's jobs config above the other, whatever the
// get priorities; fifo has no job ranks).
//
// Setup: hosts s1 (the servers, dataplane_server with --model_bytes) and w1
// (the workers, dataplane_puller). s1's daemon paces unscheduled traffic
// (get replies) at kReplyBps, so the kLargeBytes reply stays in flight for
// over two seconds whatever loopback's speed. Each race: the large get is
// issued; kLeadS after its server returned the model (the server's "served
// get" line; the model still has to reach s1's daemon), the small get is
// issued; the pullers report when each Get started and returned.
//
// Assertions are about order, not time: the small get completes before the
// large one, or strictly after it. Precondition, checked after the race
// from the pullers' stamps alone: the large reply was already queued when
// the small get was issued, and was still in flight. The token bucket
// sends no faster than kReplyBps, so the large reply was queued no later
// than its completion minus kLargeBytes / kReplyBps; a small get issued
// after that instant and before the completion raced a reply in flight.
// When a loaded machine delays the large reply past the small get (seen:
// the model reaching s1's daemon half a second late), the race proves
// nothing either way: it is run again, up to kAttempts times, then the
// test fails saying so — it never passes on a race that did not happen.
// Both models are checked word by word (the puller's "ok"). Durations are
// printed for the record.
#include <signal.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "launch/cluster.h"
#include "launch/process.h"

namespace mlfabric {
namespace {

using launch::BinaryPath;
using launch::WaitUntil;

constexpr int64_t kLargeBytes = int64_t{256} << 20;
// 128 packets of the daemon's 32 KiB payload: small enough to overtake
// quickly, large enough (~42 ms at kReplyBps) that finishing "after" the
// large reply is not decided by process-scheduling noise.
constexpr int64_t kSmallBytes = int64_t{4} << 20;
// Well below what one sender thread keeps up with on a busy 2-core machine,
// so the pacing, not the CPU, sets the large reply's duration: 256 MiB in
// 2.7 s.
constexpr double kReplyBps = 0.8e9;
// The bucket's burst (2 packets) may go out at once.
constexpr double kLargeMinStreamS = 8.0 * (kLargeBytes - 2 * (32 << 10)) / kReplyBps;
// How long after the large model's server returned it the small get is
// issued: the reply has normally been queued for ~0.5 s by then, with
// about 2 s of it still to go.
constexpr double kLeadS = 0.8;
constexpr int kAttempts = 3;

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One "got" line of dataplane_puller.
struct GetLine {
  int64_t bytes = 0;
  int64_t version = 0;
  int priority = 0;
  double start_s = 0;
  double done_s = 0;
  std::string verdict;
};

std::optional<GetLine> ParseGet(const std::string& log) {
  const std::string marker = ": got bytes ";
  const size_t at = log.find(marker);
  if (at == std::string::npos) return std::nullopt;
  std::istringstream fields(log.substr(at + marker.size()));
  GetLine line;
  std::string version_key, priority_key, start_key, done_key;
  if (!(fields >> line.bytes >> version_key >> line.version >> priority_key >> line.priority >>
        start_key >> line.start_s >> done_key >> line.done_s)) {
    return std::nullopt;
  }
  std::getline(fields, line.verdict);
  if (!line.verdict.empty() && line.verdict[0] == ' ') line.verdict.erase(0, 1);
  return line;
}

// The steady-clock second of the server's `nth` (0-based) "served get" line.
std::optional<double> ServedAt(const std::string& server_log, int nth) {
  const std::string marker = ": served get ";
  size_t at = server_log.find(marker);
  for (int i = 0; i < nth && at != std::string::npos; ++i) at = server_log.find(marker, at + 1);
  if (at == std::string::npos) return std::nullopt;
  const size_t end = server_log.find('\n', at);
  if (end == std::string::npos) return std::nullopt;  // line still being written
  const std::string line = server_log.substr(at, end - at);
  const size_t stamp = line.find(" at_s ");
  if (stamp == std::string::npos) return std::nullopt;
  return std::stod(line.substr(stamp + 6));
}

struct ServerSpec {
  std::string job;
  std::string name;
  int64_t model_bytes;
};

// A cluster s1 + w1 with jobs "a" (listed first) and "b", s1's daemon in
// TensorLights mode `job_priority` and paced at kReplyBps for replies, and
// the given servers on s1.
struct PullCluster {
  std::unique_ptr<launch::Cluster> cluster;
  std::map<std::string, launch::Subprocess*> servers;
  std::map<std::string, int> gets_served;  // "served get" lines per server so far
  int races = 0;
};

std::string Token(const std::string& job) { return "token-" + job + "-0123456789"; }

std::unique_ptr<PullCluster> StartPullCluster(const std::string& job_priority,
                                              const std::vector<ServerSpec>& servers) {
  auto pc = std::make_unique<PullCluster>();
  const std::string dir = launch::MakeTempDir("pull_priority");
  const std::string config = dir + "/jobs.json";
  std::ofstream(config) << R"({"jobs": [{"name": "a", "token": "token-a-0123456789"},
                                      {"name": "b", "token": "token-b-0123456789"}]})";
  auto cluster = launch::Cluster::StartLoopback(
      {"s1", "w1"}, {"--config=" + config}, {"--job_priority=" + job_priority},
      {{"s1", {"--unscheduled_bps=" + std::to_string(kReplyBps)}}});
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  pc->cluster = std::move(*cluster);
  for (const ServerSpec& spec : servers) {
    auto server = pc->cluster->StartApp(
        "server-" + spec.name,
        {BinaryPath("testing/apps/dataplane_server"), "--socket=" + pc->cluster->Socket("s1"),
         "--job=" + spec.job, "--token=" + Token(spec.job), "--name=" + spec.name,
         "--model_bytes=" + std::to_string(spec.model_bytes)});
    REQUIRE(server.ok());
    INFO("server " << spec.name << ": " << (*server)->Log());
    REQUIRE(WaitUntil([&] { return (*server)->Log().find(": serving") != std::string::npos; },
                      30));
    pc->servers[spec.name] = *server;
    pc->gets_served[spec.name] = 0;
  }
  return pc;
}

struct GetSpec {
  std::string job;
  std::string server;
  int priority;
  int64_t bytes;
};

struct RaceResult {
  GetLine large, small;
  double large_served_s = 0;  // the large model handed to s1's daemon
};

std::vector<std::string> Puller(PullCluster& pc, const std::string& name, const GetSpec& get,
                                const std::string& go_file) {
  std::vector<std::string> argv = {BinaryPath("testing/apps/dataplane_puller"),
                                   "--socket=" + pc.cluster->Socket("w1"),
                                   "--name=" + name,
                                   "--job=" + get.job,
                                   "--token=" + Token(get.job),
                                   "--server=" + get.server,
                                   "--priority=" + std::to_string(get.priority),
                                   "--expect_bytes=" + std::to_string(get.bytes)};
  if (!go_file.empty()) argv.push_back("--go_file=" + go_file);
  return argv;
}

// Issues `large`, then `small` kLeadS into the large reply; returns both
// pullers' lines (both verified intact) and whether the race happened (see
// the file comment), with *why when it did not.
std::optional<RaceResult> TryRace(PullCluster& pc, const GetSpec& large, const GetSpec& small,
                                  std::string* why) {
  const std::string tag = std::to_string(pc.races++);
  const std::string go_file = pc.cluster->dir() + "/go-" + tag;
  auto small_puller = pc.cluster->StartApp("small-" + tag, Puller(pc, "small-" + tag, small, go_file));
  REQUIRE(small_puller.ok());
  REQUIRE(WaitUntil([&] { return (*small_puller)->Log().find("ready") != std::string::npos; }, 30));
  INFO("small puller: " << (*small_puller)->Log());

  // A server has one model size, so the two gets ask different servers.
  REQUIRE(small.server != large.server);
  launch::Subprocess& large_server = *pc.servers.at(large.server);
  const int nth = pc.gets_served[large.server]++;
  auto large_puller = pc.cluster->StartApp("large-" + tag, Puller(pc, "large-" + tag, large, ""));
  REQUIRE(large_puller.ok());
  std::optional<double> served_s;
  REQUIRE(WaitUntil([&] { return (served_s = ServedAt(large_server.Log(), nth)).has_value(); },
                    30));
  // Issue the small get kLeadS into the large reply.
  REQUIRE(WaitUntil([&] { return NowSeconds() > *served_s + kLeadS; }, 10));
  std::ofstream(go_file) << "go\n";

  const auto large_exit = (*large_puller)->WaitFor(60);
  const auto small_exit = (*small_puller)->WaitFor(30);
  INFO("large puller: " << (*large_puller)->Log());
  INFO("small puller: " << (*small_puller)->Log());
  INFO("large server: " << large_server.Log());
  INFO("s1 daemon: " << pc.cluster->daemon("s1").Log().substr(0, 4000));
  INFO("w1 daemon: " << pc.cluster->daemon("w1").Log().substr(0, 4000));
  REQUIRE(large_exit == 0);
  REQUIRE(small_exit == 0);
  ++pc.gets_served[small.server];

  RaceResult race;
  race.large_served_s = *served_s;
  auto large_line = ParseGet((*large_puller)->Log());
  auto small_line = ParseGet((*small_puller)->Log());
  REQUIRE(large_line.has_value());
  REQUIRE(small_line.has_value());
  race.large = *large_line;
  race.small = *small_line;
  CHECK(race.large.bytes == large.bytes);
  CHECK(race.large.verdict == "ok");
  CHECK(race.small.bytes == small.bytes);
  CHECK(race.small.verdict == "ok");

  const GetLine& l = race.large;
  const GetLine& s = race.small;
  std::printf(
      "  large %s/%s (%lld MiB, priority %d): get %.3f s, model served at +%.3f s, reply "
      "queued by +%.3f s; small %s/%s (%lld MiB, priority %d) issued at +%.3f s, took %.1f ms, "
      "done at +%.3f s; large done at +%.3f s (times from the large get's start)\n",
      large.job.c_str(), large.server.c_str(), static_cast<long long>(large.bytes >> 20),
      large.priority, l.done_s - l.start_s, race.large_served_s - l.start_s,
      l.done_s - kLargeMinStreamS - l.start_s, small.job.c_str(),
      small.server.c_str(), static_cast<long long>(small.bytes >> 20), small.priority,
      s.start_s - l.start_s, (s.done_s - s.start_s) * 1e3, s.done_s - l.start_s,
      l.done_s - l.start_s);
  std::fflush(stdout);
  REQUIRE(l.start_s < s.start_s);
  const double large_queued_by_s = l.done_s - kLargeMinStreamS;
  char text[256];
  if (s.start_s >= l.done_s) {
    std::snprintf(text, sizeof(text),
                  "the small get was issued %.3f s after the large one had completed",
                  s.start_s - l.done_s);
    *why = text;
    return std::nullopt;
  }
  if (s.start_s < large_queued_by_s) {
    std::snprintf(text, sizeof(text),
                  "the small get was issued at +%.3f s, but the large reply (%.3f s at the "
                  "paced rate) completed at +%.3f s, so it may have been queued only after the "
                  "small get",
                  s.start_s - l.start_s, kLargeMinStreamS, l.done_s - l.start_s);
    *why = text;
    return std::nullopt;
  }
  return race;
}

RaceResult RunRace(PullCluster& pc, const GetSpec& large, const GetSpec& small) {
  std::string why;
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    std::optional<RaceResult> race = TryRace(pc, large, small, &why);
    if (race.has_value()) return *race;
    std::printf("  no race on attempt %d of %d (%s)%s\n", attempt, kAttempts, why.c_str(),
                attempt < kAttempts ? ": running it again" : "");
    std::fflush(stdout);
  }
  FAIL("the small get never raced the large reply in flight in " << kAttempts
                                                                  << " attempts: " << why);
  return {};
}

TEST_CASE("Within a job, a get's priority orders its reply against one already in flight") {
  std::printf("pull priority, one job (a), job_priority fifo:\n");
  auto pc = StartPullCluster("fifo", {{"a", "psa-big", kLargeBytes}, {"a", "psa-small", kSmallBytes}});
  const GetSpec large{"a", "psa-big", 10, kLargeBytes};

  SECTION("priority 0 overtakes priority 10") {
    const RaceResult race = RunRace(*pc, large, {"a", "psa-small", 0, kSmallBytes});
    CHECK(race.small.done_s < race.large.done_s);
  }
  SECTION("priority 20 waits for all of priority 10") {
    const RaceResult race = RunRace(*pc, large, {"a", "psa-small", 20, kSmallBytes});
    CHECK(race.small.done_s > race.large.done_s);
  }
}

TEST_CASE("TLs-One: the top-ranked job's get overtakes another job's, whatever the priorities") {
  std::printf("pull priority, jobs a (ranked first) and b, job_priority one:\n");
  auto pc = StartPullCluster("one", {{"b", "psb-big", kLargeBytes}, {"a", "psa-small", kSmallBytes}});
  // Job rank comes before get priority: a's priority 10 beats b's 0.
  const RaceResult race =
      RunRace(*pc, {"b", "psb-big", 0, kLargeBytes}, {"a", "psa-small", 10, kSmallBytes});
  CHECK(race.small.done_s < race.large.done_s);
}

TEST_CASE("fifo: without job ranks the same get waits behind the other job's reply") {
  std::printf("pull priority, jobs a and b, job_priority fifo:\n");
  auto pc = StartPullCluster("fifo", {{"b", "psb-big", kLargeBytes}, {"a", "psa-small", kSmallBytes}});
  const RaceResult race =
      RunRace(*pc, {"b", "psb-big", 0, kLargeBytes}, {"a", "psa-small", 10, kSmallBytes});
  CHECK(race.small.done_s > race.large.done_s);
}

// A worker's daemon keeps the connection of a finished get and sends the
// next get to that server's daemon on it: five gets, one data session.
TEST_CASE("Repeated gets reuse one connection to the server's daemon") {
  auto cluster = launch::Cluster::StartLoopback({"s1", "w1"}, {}, {"--log_level=debug"});
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  launch::Cluster& c = **cluster;
  const int64_t bytes = 1 << 20;
  auto server = c.StartApp("server", {BinaryPath("testing/apps/dataplane_server"),
                                      "--socket=" + c.Socket("s1"),
                                      "--model_bytes=" + std::to_string(bytes)});
  REQUIRE(server.ok());
  REQUIRE(WaitUntil([&] { return (*server)->Log().find(": serving") != std::string::npos; }, 30));
  auto puller = c.StartApp("puller", {BinaryPath("testing/apps/dataplane_puller"),
                                      "--socket=" + c.Socket("w1"), "--name=w1p",
                                      "--server=ps0", "--repeat=5",
                                      "--expect_bytes=" + std::to_string(bytes)});
  REQUIRE(puller.ok());
  const std::optional<int> code = (*puller)->WaitFor(60);
  INFO((*puller)->Log());
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  const std::string log = (*puller)->Log();
  int intact = 0;
  for (size_t at = log.find(" ok"); at != std::string::npos; at = log.find(" ok", at + 1)) ++intact;
  CHECK(intact == 5);
  const std::string s1_log = c.daemon("s1").Log();
  int sessions = 0;
  for (size_t at = s1_log.find("data session from"); at != std::string::npos;
       at = s1_log.find("data session from", at + 1)) {
    ++sessions;
  }
  INFO(s1_log);
  CHECK(sessions == 1);
}

// A worker daemon that stops reading its get reply (SIGSTOP) must not hold
// up the server daemon's other traffic: the reply's write fails after
// --send_timeout_s, and a push from the same host to a third host is then
// applied. Without the bound the sender loop would wait for ever and the
// push would never complete. s1 paces replies at kReplyBps, so the 256 MiB
// reply is still in flight (for seconds) when w1 stops, whatever loopback's
// speed: the kernel's socket buffers fill and the sender's write stalls.
TEST_CASE("A get requester that stops reading does not stall the server daemon's sender") {
  auto cluster = launch::Cluster::StartLoopback(
      {"s1", "w1", "w2"}, {}, {"--log_level=debug"},
      {{"s1", {"--send_timeout_s=2", "--unscheduled_bps=" + std::to_string(kReplyBps)}}});
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  launch::Cluster& c = **cluster;
  const int64_t model_bytes = int64_t{256} << 20;
  auto ps0 = c.StartApp("ps0", {BinaryPath("testing/apps/dataplane_server"),
                                "--socket=" + c.Socket("s1"), "--name=ps0",
                                "--model_bytes=" + std::to_string(model_bytes)});
  auto ps1 = c.StartApp("ps1", {BinaryPath("testing/apps/dataplane_server"),
                                "--socket=" + c.Socket("w2"), "--name=ps1"});
  REQUIRE(ps0.ok());
  REQUIRE(ps1.ok());
  REQUIRE(WaitUntil([&] { return (*ps0)->Log().find(": serving") != std::string::npos; }, 30));
  REQUIRE(WaitUntil([&] { return (*ps1)->Log().find(": serving") != std::string::npos; }, 30));
  auto puller = c.StartApp("puller", {BinaryPath("testing/apps/dataplane_puller"),
                                      "--socket=" + c.Socket("w1"), "--name=w1p",
                                      "--server=ps0",
                                      "--expect_bytes=" + std::to_string(model_bytes)});
  REQUIRE(puller.ok());
  // w1's daemon stops reading once the server has handed over the model.
  // From then on s1's writes of the reply stall as soon as the kernel's
  // socket buffers are full (tens of MB at most; the paced reply needs
  // seconds). A push from s1 to w2 is started at once: it may go out before
  // the stall or wait behind it, and must be applied while w1 is still
  // stopped either way.
  REQUIRE(WaitUntil([&] { return (*ps0)->Log().find("served get") != std::string::npos; }, 60));
  REQUIRE(::kill(c.daemon("w1").pid(), SIGSTOP) == 0);
  auto pusher = c.StartApp("pusher", {BinaryPath("testing/apps/dataplane_pusher"),
                                      "--socket=" + c.Socket("s1"), "--name=s1push",
                                      "--server=ps1", "--bytes=1048576"});
  REQUIRE(pusher.ok());
  // The stall happened and was bounded: s1's daemon gave up on the reply.
  // (Had the whole reply fitted in the socket buffers nothing would have
  // stalled and the case would prove nothing: it fails then rather than
  // pass.)
  const bool gave_up = WaitUntil(
      [&] { return c.daemon("s1").Log().find("took no data for 2 s") != std::string::npos; }, 60);
  const std::optional<int> pushed = (*pusher)->WaitFor(60);
  ::kill(c.daemon("w1").pid(), SIGCONT);
  // The requester learns that its get failed, instead of waiting for ever.
  const std::optional<int> pulled = (*puller)->WaitFor(60);
  INFO("pusher: " << (*pusher)->Log());
  INFO("puller: " << (*puller)->Log());
  INFO("s1 daemon: " << c.daemon("s1").Log().substr(0, 20000));
  REQUIRE(gave_up);
  CHECK(c.daemon("s1").Log().find("packets sent): send failed") != std::string::npos);
  REQUIRE(pushed.has_value());
  CHECK(*pushed == 0);
  CHECK((*pusher)->Log().find("applied=1 dropped=0 failed=0") != std::string::npos);
  REQUIRE(pulled.has_value());
  CHECK(*pulled != 0);
  CHECK((*puller)->Log().find("get failed") != std::string::npos);
}

}  // namespace
}  // namespace mlfabric
