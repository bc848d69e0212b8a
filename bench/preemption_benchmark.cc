// Preemption latency of an urgent tensor behind a
// large low-priority transfer on a shaped link (Mercury, mercury.md §IV).
//
//   bazel run -c opt //bench:preemption_benchmark [-- --link_mbps=200]
//
// Two hosts in network namespaces (launch/cluster.h, kNetns; needs root),
// w1's uplink an htb class of --link_mbps. The FIFO planner starts every
// transfer at once, so the urgent one meets the large one in w1's
// PriorityPacketQueue. A 48 MiB transfer (priority 10) is sent; while it is
// on the wire, --urgent one-packet (32 KiB) pushes with priority 0 are
// released one every 300 ms. Latency = the urgent transfer's last byte at
// s1 minus its scheduled start (which also counts the schedule's trip to
// w1's daemon), in packet-times of the large transfer's measured goodput.
// Target: <= 2 packet-times beyond the urgent packet's own.
//
// Two configurations, same link:
//   paced    w1 declares uplink = 95% of the link: the scheduler's rate is
//            what the link can carry, so the backlog stays in the daemon's
//            priority queue and an urgent packet waits for at most the one
//            being written.
//   unpaced  w1 declares 10 Gbit/s: the daemon writes faster than the link
//            drains, the backlog moves into the TCP send buffer and the htb
//            queue, where no priority applies.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include "common/config.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "nlohmann/json.hpp"
#include "testing/apps/dataplane_trace.h"

namespace mlfabric::bench {
namespace {

using launch::BinaryPath;
using launch::WaitUntil;

constexpr int64_t kLargeBytes = 48 << 20;
constexpr int64_t kUrgentBytes = 32 << 10;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Result {
  double goodput_bps = 0;
  double packet_s = 0;
  std::vector<double> latencies_s;  // per urgent push
  int overtook = 0;                 // urgent pushes complete before the large one
};

// Measure, once every push is done: the large push's goodput and each
// urgent push's latency from the planned transfers and the receiving
// daemon's arrival trace.
absl::StatusOr<Result> ReadResult(launch::Cluster& b, const PlannedTransfer& large_planned) {
  auto planned = FetchPlannedTransfers(b.admin_port(), "ps0");
  if (!planned.ok()) return planned.status();
  const std::vector<Arrival> arrivals = ParseArrivals(b.daemon("s1").Log());
  auto large_arrival = FindArrival(arrivals, large_planned.transfer_id);
  if (!large_arrival) return absl::NotFoundError("no arrival line for the large transfer");
  Result result;
  result.goodput_bps = 8.0 * large_arrival->bytes /
                       (large_arrival->complete_s - large_arrival->first_packet_s);
  result.packet_s = 8.0 * (32 << 10) / result.goodput_bps;
  for (const PlannedTransfer& t : *planned) {
    if (t.bytes != kUrgentBytes) continue;
    auto a = FindArrival(arrivals, t.transfer_id);
    if (!a) return absl::NotFoundError("no arrival line for an urgent transfer");
    result.latencies_s.push_back(a->complete_s - t.start_s);
    if (a->complete_s < large_arrival->complete_s) ++result.overtook;
  }
  return result;
}

absl::StatusOr<Result> Measure(double link_bps, double declared_bps, int urgent) {
  launch::ClusterOptions options;
  options.topology = launch::Topology::kNetns;
  options.hosts = {"s1", "w1"};
  options.rates["w1"].up_bps = link_bps;
  options.admin = true;
  auto bed = launch::Cluster::Create(options);
  if (!bed.ok()) return bed.status();
  launch::Cluster& b = **bed;
  if (auto status = b.Start({"--planner=fifo"}, {"--log_level=debug"},
                                   {{"w1", {"--uplink_bps=" + std::to_string(declared_bps)}}});
      !status.ok()) {
    return status;
  }
  auto server = b.StartApp("server", {BinaryPath("testing/apps/dataplane_server"),
                                      "--socket=" + b.Socket("s1"), "--verify=false"});
  if (!server.ok()) return server.status();
  auto pusher = [&](const std::string& name, int64_t bytes, int priority, int seed,
                    const std::string& go_file) {
    std::vector<std::string> argv = {BinaryPath("testing/apps/dataplane_pusher"),
                                     "--socket=" + b.Socket("w1"),
                                     "--name=" + name,
                                     "--bytes=" + std::to_string(bytes),
                                     "--priority=" + std::to_string(priority),
                                     "--seed=" + std::to_string(seed)};
    if (!go_file.empty()) argv.push_back("--go_file=" + go_file);
    return b.StartApp(name, argv);
  };
  std::vector<launch::Subprocess*> urgents;
  for (int i = 0; i < urgent; ++i) {
    auto p = pusher("urgent" + std::to_string(i), kUrgentBytes, 0, 100 + i,
                    b.dir() + "/go" + std::to_string(i));
    if (!p.ok()) return p.status();
    urgents.push_back(*p);
  }
  for (launch::Subprocess* p : urgents) {
    if (!WaitUntil([&] { return p->Log().find("ready") != std::string::npos; }, 30)) {
      return absl::DeadlineExceededError("urgent pusher did not start: " + p->Log());
    }
  }
  auto large = pusher("large", kLargeBytes, 10, 1, "");
  if (!large.ok()) return large.status();
  std::optional<PlannedTransfer> large_planned;
  if (!WaitUntil(
          [&] {
            auto planned = FetchPlannedTransfers(b.admin_port(), "ps0");
            if (planned.ok() && !planned->empty()) large_planned = planned->front();
            return large_planned.has_value();
          },
          60)) {
    return absl::DeadlineExceededError("the large push was not planned");
  }
  for (int i = 0; i < urgent; ++i) {
    const double at = large_planned->start_s + 0.3 * (i + 1);
    WaitUntil([&] { return Now() >= at; }, 10);
    std::ofstream(b.dir() + "/go" + std::to_string(i)) << "go\n";
  }
  for (launch::Subprocess* p : urgents) {
    if (p->WaitFor(120) != 0) return absl::InternalError("urgent push failed: " + p->Log());
  }
  if ((*large)->WaitFor(120) != 0) {
    return absl::InternalError("large push failed: " + (*large)->Log());
  }
  return ReadResult(b, *large_planned);
}

int Main(int argc, char** argv) {
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) return 2;
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  double link_mbps = 200;
  int64_t urgent = 5;
  reader.Double("link_mbps", &link_mbps, 10, 10000);
  reader.Int("urgent", &urgent, 1, 5);
  if (auto status = reader.Finish(); !status.ok()) {
    std::cerr << "preemption_benchmark: " << status.message() << "\n";
    return 2;
  }
  const double link_bps = link_mbps * 1e6;
  std::printf("preemption_benchmark: %.0f Mbit/s htb link, 48 MiB at priority 10, %lld x 32 KiB "
              "at priority 0\n",
              link_mbps, static_cast<long long>(urgent));
  std::printf("\n| configuration | large goodput | packet-time | urgent latency median | max | "
              "overtook |\n| --- | --- | --- | --- | --- | --- |\n");
  for (const auto& [name, declared] :
       std::vector<std::pair<const char*, double>>{{"paced (uplink 95% of link)", 0.95 * link_bps},
                                                   {"unpaced (uplink 10 Gbit/s)", 10e9}}) {
    auto result = Measure(link_bps, declared, static_cast<int>(urgent));
    if (!result.ok()) {
      std::printf("| %s | cannot run: %s | | | | |\n", name,
                  std::string(result.status().message()).c_str());
      if (result.status().code() == absl::StatusCode::kFailedPrecondition) {
        std::printf("SKIPPED: %s\n", std::string(result.status().message()).c_str());
        return 0;
      }
      return 1;
    }
    std::vector<double> l = result->latencies_s;
    std::sort(l.begin(), l.end());
    const double median = l[l.size() / 2], max = l.back();
    std::printf("| %s | %.1f Mbit/s | %.2f ms | %.2f ms = %.1f packet-times | %.2f ms = %.1f "
                "packet-times | %d of %zu |\n",
                name, result->goodput_bps / 1e6, result->packet_s * 1e3, median * 1e3,
                median / result->packet_s, max * 1e3, max / result->packet_s, result->overtook,
                l.size());
  }
  return 0;
}

}  // namespace
}  // namespace mlfabric::bench

int main(int argc, char** argv) { return mlfabric::bench::Main(argc, argv); }
