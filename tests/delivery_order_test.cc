// Cross-process test: the server's daemon hands updates to the server
// application in exactly the order the scheduler committed them (docs/architecture.md
// §3 step 6, mlfabric.md §5.1), even when they arrive in another order.
//
// With the FIFO planner every batch starts at once, so a large update from
// a slow worker (committed first) is overtaken on the wire by small updates
// from a fast worker (committed after it): the daemon must hold those back
// until the large one is in. With the MLfabric planner the commit order of
// one batch is the planner's (shortest first, §5.1), not the submit order.
// The schedule's order is read from the scheduler's admin endpoint; the
// delivery order from the server application's own log; every update's
// contents are verified word by word.
#include <catch2/catch.hpp>

#include <chrono>
#include <iostream>
#include <set>

#include "launch/cluster.h"
#include "launch/process.h"
#include "testing/apps/dataplane_trace.h"

namespace mlfabric {
namespace {

using bench::Arrival;
using bench::Delivered;
using bench::PlannedTransfer;
using launch::BinaryPath;
using launch::ReadFile;
using launch::WaitUntil;

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Cluster {
  std::unique_ptr<launch::Cluster> cluster;
  int admin_port = 0;
};

Cluster StartCluster(const std::string& planner, const std::vector<std::string>& hosts,
                     const std::map<std::string, std::vector<std::string>>& host_flags) {
  const std::string dir = launch::MakeTempDir("delivery_order");
  const std::string port_file = dir + "/admin.port";
  auto cluster = launch::Cluster::StartLoopback(
      hosts, {"--planner=" + planner, "--admin_port=0", "--admin_port_file=" + port_file},
      {"--log_level=debug"}, host_flags);
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  REQUIRE(WaitUntil([&] { return !ReadFile(port_file).empty(); }, 10));
  return {std::move(*cluster), std::atoi(ReadFile(port_file).c_str())};
}

std::vector<std::string> Pusher(launch::Cluster& c, const std::string& host,
                                const std::string& name, int64_t bytes, int pushes, int seed) {
  return {BinaryPath("testing/apps/dataplane_pusher"),
          "--socket=" + c.Socket(host),
          "--name=" + name,
          "--bytes=" + std::to_string(bytes),
          "--pushes=" + std::to_string(pushes),
          "--window=" + std::to_string(pushes),
          "--seed=" + std::to_string(seed)};
}

// Delivered order == planned order, consecutive sequences, intact data.
void CheckDeliveredInPlannedOrder(const std::vector<Delivered>& delivered,
                                  const std::vector<PlannedTransfer>& planned) {
  REQUIRE(delivered.size() == planned.size());
  for (size_t i = 0; i < delivered.size(); ++i) {
    INFO("delivery " << i);
    CHECK(delivered[i].transfer_id == planned[i].transfer_id);
    CHECK(delivered[i].bytes == planned[i].bytes);
    CHECK(delivered[i].verdict == "ok");
    if (i > 0) CHECK(delivered[i].sequence == delivered[i - 1].sequence + 1);
  }
}

TEST_CASE("FIFO planner: small updates that overtake a large one wait for it at the server") {
  // w1's uplink is paced at 1 Gbit/s: its 128 MiB update is on the wire for
  // ~1 s while w2's small ones (committed after it) arrive in a few ms.
  Cluster cl = StartCluster("fifo", {"s1", "w1", "w2"}, {{"w1", {"--uplink_bps=1e9"}}});
  launch::Cluster& c = *cl.cluster;
  const int64_t kLargeBytes = 128 << 20, kSmallBytes = 64 << 10;
  const int kSmallPushes = 8;
  auto server = c.StartApp("server", {BinaryPath("testing/apps/dataplane_server"),
                                      "--socket=" + c.Socket("s1"),
                                      "--expect_updates=" + std::to_string(1 + kSmallPushes)});
  REQUIRE(server.ok());
  auto large = c.StartApp("large", Pusher(c, "w1", "large", kLargeBytes, 1, 11));
  REQUIRE(large.ok());
  std::optional<PlannedTransfer> large_planned;
  REQUIRE(WaitUntil(
      [&] {
        auto planned = bench::FetchPlannedTransfers(cl.admin_port, "ps0");
        if (planned.ok() && !planned->empty()) large_planned = planned->front();
        return large_planned.has_value();
      },
      60));
  REQUIRE(large_planned->bytes == kLargeBytes);
  REQUIRE(WaitUntil([&] { return NowSeconds() > large_planned->start_s; }, 10));
  auto small = c.StartApp("small", Pusher(c, "w2", "small", kSmallBytes, kSmallPushes, 101));
  REQUIRE(small.ok());
  const auto large_exit = (*large)->WaitFor(60);
  const auto small_exit = (*small)->WaitFor(60);
  INFO("large: " << (*large)->Log() << "small: " << (*small)->Log()
                 << "server: " << (*server)->Log());
  REQUIRE(large_exit == 0);
  REQUIRE(small_exit == 0);
  REQUIRE(WaitUntil([&] { return (*server)->Log().find("done") != std::string::npos; }, 30));

  auto planned = bench::FetchPlannedTransfers(cl.admin_port, "ps0");
  REQUIRE(planned.ok());
  REQUIRE(planned->size() == 1 + kSmallPushes);
  CHECK(planned->front().transfer_id == large_planned->transfer_id);
  const std::vector<Delivered> delivered = bench::ParseDeliveries((*server)->Log());
  CheckDeliveredInPlannedOrder(delivered, *planned);

  // The point of the test: the wire order differed from the commit order.
  const std::vector<Arrival> arrivals = bench::ParseArrivals(c.daemon("s1").Log());
  REQUIRE(arrivals.size() == 1 + kSmallPushes);
  int overtook = 0;
  for (const Arrival& a : arrivals) {
    if (a.bytes == kSmallBytes && a.complete_s < arrivals.back().complete_s) ++overtook;
  }
  std::cout << "fifo: " << overtook << " of " << kSmallPushes
            << " small updates arrived before the large one committed ahead of them; the "
               "large one arrived "
            << (arrivals.back().transfer_id == large_planned->transfer_id ? "last" : "not last")
            << std::endl;
  CHECK(arrivals.back().transfer_id == large_planned->transfer_id);
  CHECK(overtook == kSmallPushes);
}

TEST_CASE("MLfabric planner: delivery follows the planner's commit order, not submit order") {
  Cluster cl = StartCluster("mlfabric", {"s1", "w1", "w2", "w3"}, {});
  launch::Cluster& c = *cl.cluster;
  // Three workers push updates of three sizes; pushes from several workers
  // meet in batches, where the planner orders them (§5.1).
  const std::vector<int64_t> sizes = {4 << 20, 64 << 10, 1 << 20};
  const int kPushes = 6;
  auto server = c.StartApp("server", {BinaryPath("testing/apps/dataplane_server"),
                                      "--socket=" + c.Socket("s1"),
                                      "--expect_updates=" + std::to_string(3 * kPushes)});
  REQUIRE(server.ok());
  std::vector<launch::Subprocess*> pushers;
  for (int w = 0; w < 3; ++w) {
    const std::string host = "w" + std::to_string(w + 1);
    auto pusher = c.StartApp(host, Pusher(c, host, host, sizes[w], kPushes, 1000 * (w + 1)));
    REQUIRE(pusher.ok());
    pushers.push_back(*pusher);
  }
  for (launch::Subprocess* pusher : pushers) {
    const auto exit = pusher->WaitFor(90);
    INFO(pusher->Log());
    // A push may be dropped by the planner (staleness bound); every one
    // must end applied or dropped, never failed.
    REQUIRE(exit.has_value());
    CHECK(pusher->Log().find("failed=0") != std::string::npos);
  }
  auto planned = bench::FetchPlannedTransfers(cl.admin_port, "ps0");
  REQUIRE(planned.ok());
  std::vector<Delivered> delivered;
  REQUIRE(WaitUntil(
      [&] {
        delivered = bench::ParseDeliveries((*server)->Log());
        return delivered.size() >= planned->size();
      },
      30));
  CheckDeliveredInPlannedOrder(delivered, *planned);
  // Within a batch the plan is not the submit order: transfer ids are
  // handed out at submit, so a batch whose ids are not ascending was
  // reordered by the planner.
  int reordered = 0;
  for (size_t i = 1; i < planned->size(); ++i) {
    if ((*planned)[i].batch_id == (*planned)[i - 1].batch_id &&
        (*planned)[i].transfer_id < (*planned)[i - 1].transfer_id) {
      ++reordered;
    }
  }
  std::cout << "mlfabric: " << planned->size() << " updates in commit order; " << reordered
            << " adjacent pairs committed against submit order" << std::endl;
}

}  // namespace
}  // namespace mlfabric
