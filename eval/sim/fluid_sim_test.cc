// The fluid network kernel: max-min sharing, reserved segments, capacity.
#include "eval/sim/fluid_sim.h"

#include <vector>

#include "catch2/catch.hpp"

namespace mlfabric::sim {
namespace {

SimConfig ConstantNetwork() {
  SimConfig config;
  config.network = NetworkSettingByName("N0").value();  // every NIC 10 Gbit/s
  return config;
}

TEST_CASE("two best-effort flows into one downlink share it equally") {
  const SimConfig config = ConstantNetwork();
  const NetworkTrace trace(config, /*server_host=*/-1);
  FluidSim sim(3, &trace);
  std::vector<double> done;
  sim.StartFlow(0, 2, 1e9, [&] { done.push_back(sim.now()); });
  sim.StartFlow(1, 2, 1e9, [&] { done.push_back(sim.now()); });
  sim.Run(nullptr, 10);
  REQUIRE(done.size() == 2);
  CHECK(done[0] == Approx(0.2));  // 5 Gbit/s each
  CHECK(done[1] == Approx(0.2));
  CHECK(sim.stats().max_link_load <= 1 + 1e-9);
}

TEST_CASE("max-min: a flow limited elsewhere leaves its share to the other") {
  SimConfig config = ConstantNetwork();
  config.network.probabilities = {1, 0, 0, 0, 0};  // every NIC 1 Gbit/s ...
  config.server_bps = 10e9;                         // ... except the server host 2
  const NetworkTrace trace(config, /*server_host=*/2);
  FluidSim sim(3, &trace);
  double a = 0, b = 0;
  // Both into host 0's 1G downlink? No: 0->1 and 2->1 share host 1's 1G
  // downlink; host 2's 10G uplink is not the limit.
  sim.StartFlow(0, 1, 1e9, [&] { a = sim.now(); });
  sim.StartFlow(2, 1, 0.5e9, [&] { b = sim.now(); });
  sim.Run(nullptr, 100);
  CHECK(b == Approx(1.0));  // 0.5 Gbit/s each until b is done
  CHECK(a == Approx(1.5));  // then a alone at 1 Gbit/s for the last 0.5 Gbit
}

TEST_CASE("a reserved flow follows its segments; best effort takes the rest") {
  const SimConfig config = ConstantNetwork();
  const NetworkTrace trace(config, -1);
  FluidSim sim(3, &trace);
  double reserved_done = 0, best_effort_done = 0;
  sim.StartReservedFlow(0, 2, 4e8, {{0, 0.1, 4e9}}, [&] { reserved_done = sim.now(); });
  sim.StartFlow(1, 2, 6e8, [&] { best_effort_done = sim.now(); });
  sim.Run(nullptr, 10);
  CHECK(reserved_done == Approx(0.1));
  CHECK(best_effort_done == Approx(0.1));  // 6 Gbit/s residual
  CHECK(sim.stats().reserved_flows_late == 0);
  CHECK(sim.stats().max_link_load <= 1 + 1e-9);
}

TEST_CASE("over-reserved links are scaled down and late flows finish best effort") {
  SimConfig config = ConstantNetwork();
  config.network.probabilities = {1, 0, 0, 0, 0};  // 1 Gbit/s, but plans assume 10
  const NetworkTrace trace(config, -1);
  FluidSim sim(2, &trace);
  double done = 0;
  sim.StartReservedFlow(0, 1, 1e9, {{0, 0.1, 10e9}}, [&] { done = sim.now(); });
  sim.Run(nullptr, 100);
  CHECK(done == Approx(1.0));
  CHECK(sim.stats().reserved_flows_late == 1);
  CHECK(sim.stats().max_link_load <= 1 + 1e-9);
}

TEST_CASE("events at equal times run in scheduling order") {
  const SimConfig config = ConstantNetwork();
  const NetworkTrace trace(config, -1);
  FluidSim sim(1, &trace);
  std::vector<int> order;
  sim.At(1, [&] { order.push_back(1); });
  sim.At(1, [&] { order.push_back(2); });
  sim.At(0.5, [&] { order.push_back(0); });
  sim.Run(nullptr, 5);
  CHECK(order == std::vector<int>{0, 1, 2});
}

TEST_CASE("N-traces are seeded, periodic and use only the paper's rates") {
  SimConfig config;
  config.network = NetworkSettingByName("N3").value();
  const NetworkTrace trace(config, -1);
  int ones = 0, tens = 0;
  for (int h = 0; h < 50; ++h) {
    for (int k = 0; k < 10; ++k) {
      const double r = trace.CapacityBps(h, true, 5.0 * k + 1);
      CHECK(r == trace.CapacityBps(h, true, 5.0 * k + 4.9));  // constant within T
      if (r == 1e9) ++ones;
      if (r == 10e9) ++tens;
    }
  }
  CHECK(ones + tens == 500);
  CHECK(ones > 200);
  CHECK(tens > 200);
}

}  // namespace
}  // namespace mlfabric::sim
