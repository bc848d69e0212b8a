// The fluid network kernel: max-min sharing, reserved segments, capacity.
#include "eval/sim/fluid_sim.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
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

// The kernel's definition, computed from scratch at every instant: at each
// change (a start, a last bit, a segment boundary, a trace period) every
// reserved flow takes its segment's rate, scaled down on overbooked links,
// and the best-effort flows share the rest max-min fairly (naive
// progressive filling). FluidSim keeps these rates incrementally; the
// random test below holds it to this.
struct FlowSpec {
  double start_s;
  int src;
  int dst;
  double bits;
  std::vector<core::RateSegment> segments;  // empty: best effort
};

std::vector<double> ReferenceFinishTimes(int hosts, const NetworkTrace& trace,
                                         const std::vector<FlowSpec>& specs) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr double kEps = 1e-12;
  const int n = static_cast<int>(specs.size());
  std::vector<double> left(n), rate(n, 0), finish(n, -1);
  std::vector<bool> started(n, false), reserved(n);
  for (int i = 0; i < n; ++i) {
    left[i] = specs[i].bits;
    reserved[i] = !specs[i].segments.empty();
  }
  auto active = [&](int i) { return started[i] && finish[i] < 0; };
  const int links = 2 * hosts;
  double now = 0;
  while (true) {
    for (int i = 0; i < n; ++i) {
      if (!started[i] && specs[i].start_s <= now) started[i] = true;
    }
    std::vector<double> capacity(links);
    for (int l = 0; l < links; ++l) capacity[l] = trace.CapacityBps(l / 2, l % 2 == 0, now);
    std::vector<double> planned(n, 0), planned_sum(links, 0);
    for (int i = 0; i < n; ++i) {
      if (!active(i) || !reserved[i]) continue;
      double end = 0;
      for (const core::RateSegment& s : specs[i].segments) end = std::max(end, s.to_s);
      if (now >= end - kEps) {
        reserved[i] = false;  // plan over: best effort from now on
        continue;
      }
      for (const core::RateSegment& s : specs[i].segments) {
        if (s.from_s <= now + kEps && now + kEps < s.to_s) planned[i] = s.rate_bps;
      }
      planned_sum[2 * specs[i].src] += planned[i];
      planned_sum[2 * specs[i].dst + 1] += planned[i];
    }
    std::vector<double> residual = capacity;
    std::vector<int> best_effort;
    for (int i = 0; i < n; ++i) {
      if (!active(i)) continue;
      const int up = 2 * specs[i].src, down = 2 * specs[i].dst + 1;
      if (!reserved[i]) {
        best_effort.push_back(i);
        continue;
      }
      auto scale = [&](int l) {
        return planned_sum[l] > capacity[l] ? capacity[l] / planned_sum[l] : 1.0;
      };
      rate[i] = planned[i] * std::min(scale(up), scale(down));
      residual[up] -= rate[i];
      residual[down] -= rate[i];
    }
    for (double& r : residual) r = std::max(0.0, r);
    std::vector<bool> frozen(n, false);
    for (size_t round = 0; round < best_effort.size(); ++round) {
      std::vector<int> count(links, 0);
      for (int i : best_effort) {
        if (frozen[i]) continue;
        ++count[2 * specs[i].src];
        ++count[2 * specs[i].dst + 1];
      }
      int bottleneck = -1;
      for (int l = 0; l < links; ++l) {
        if (count[l] > 0 && (bottleneck < 0 || residual[l] / count[l] <
                                                   residual[bottleneck] / count[bottleneck])) {
          bottleneck = l;
        }
      }
      if (bottleneck < 0) break;
      const double share = residual[bottleneck] / count[bottleneck];
      for (int i : best_effort) {
        const int up = 2 * specs[i].src, down = 2 * specs[i].dst + 1;
        if (frozen[i] || (up != bottleneck && down != bottleneck)) continue;
        frozen[i] = true;
        rate[i] = share;
        residual[up] = std::max(0.0, residual[up] - share);
        residual[down] = std::max(0.0, residual[down] - share);
      }
    }
    // The next change.
    double next = kInf;
    bool any = false;
    for (int i = 0; i < n; ++i) {
      if (!started[i]) next = std::min(next, specs[i].start_s);
      if (!active(i)) continue;
      any = true;
      if (rate[i] > 0) next = std::min(next, now + left[i] / rate[i]);
      if (reserved[i]) {
        for (const core::RateSegment& s : specs[i].segments) {
          if (s.from_s > now + kEps) next = std::min(next, s.from_s);
          if (s.to_s > now + kEps) next = std::min(next, s.to_s);
        }
      }
    }
    if (any) next = std::min(next, trace.NextChangeS(now));
    if (next == kInf) break;
    for (int i = 0; i < n; ++i) {
      if (active(i)) left[i] = std::max(0.0, left[i] - rate[i] * (next - now));
    }
    now = next;
    for (int i = 0; i < n; ++i) {
      if (active(i) && (left[i] <= 1e-6 || (rate[i] > 0 && left[i] / rate[i] <= kEps))) {
        finish[i] = now;
      }
    }
  }
  return finish;
}

TEST_CASE("random flows finish when the from-scratch definition says they do") {
  SimConfig config;
  config.network = NetworkSettingByName("N3").value();  // 1 or 10 Gbit/s per period
  config.trace_period_s = 0.5;
  std::mt19937_64 random(42);
  std::uniform_real_distribution<double> unit(0, 1);
  auto next = [&] { return unit(random); };
  for (int round = 0; round < 30; ++round) {
    INFO("round " << round);
    config.seed = round + 1;
    const NetworkTrace trace(config, -1);
    const int hosts = 3 + round % 4;
    std::vector<FlowSpec> specs;
    for (int i = 0; i < 40; ++i) {
      FlowSpec f;
      f.start_s = std::floor(next() * 40) / 20;  // shared instants, too
      f.src = static_cast<int>(next() * hosts);
      f.dst = (f.src + 1 + static_cast<int>(next() * (hosts - 1))) % hosts;
      f.bits = 1e8 + 2e9 * next();
      if (next() < 0.6) {  // reserved: 1-3 segments with gaps, often overbooked
        double t = f.start_s + (next() < 0.5 ? 0 : 0.1 * next());
        const int segments = 1 + static_cast<int>(next() * 3);
        for (int k = 0; k < segments; ++k) {
          const double length = 0.05 + 0.4 * next();
          f.segments.push_back({t, t + length, 1e9 + 6e9 * next()});
          t += length + (next() < 0.5 ? 0 : 0.2 * next());
        }
      }
      specs.push_back(f);
    }
    const std::vector<double> expected = ReferenceFinishTimes(hosts, trace, specs);

    FluidSim sim(hosts, &trace);
    std::vector<double> finish(specs.size(), -1);
    for (size_t i = 0; i < specs.size(); ++i) {
      sim.At(specs[i].start_s, [&, i] {
        const FlowSpec& f = specs[i];
        auto done = [&, i] { finish[i] = sim.now(); };
        if (f.segments.empty()) {
          sim.StartFlow(f.src, f.dst, f.bits, done);
        } else {
          sim.StartReservedFlow(f.src, f.dst, f.bits, f.segments, done);
        }
      });
    }
    sim.Run(nullptr, 1e4);
    double bits = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      INFO("flow " << i);
      REQUIRE(expected[i] > 0);
      CHECK(finish[i] == Approx(expected[i]).epsilon(1e-9));
      bits += specs[i].bits;
    }
    CHECK(sim.active_flows() == 0);
    CHECK(sim.stats().flows_completed == static_cast<int64_t>(specs.size()));
    CHECK(sim.stats().bits_delivered == Approx(bits).epsilon(1e-12));
    CHECK(sim.stats().max_link_load <= 1 + 1e-9);
  }
}

}  // namespace
}  // namespace mlfabric::sim
