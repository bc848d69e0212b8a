// Monitor behaviour with fake counters and a fake clock: the estimator's
// EWMA and own-traffic accounting, the reporting policy's threshold,
// heartbeat and lag, the N1-N3 trace generator, and the ticking monitor.
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include <catch2/catch.hpp>

#include "common/clock.h"
#include "monitor/bandwidth_monitor.h"
#include "monitor/estimator.h"
#include "monitor/report_policy.h"
#include "monitor/sampler.h"
#include "monitor/trace.h"

namespace mlfabric::monitor {
namespace {

constexpr double kGbit = 1e9;
constexpr uint64_t BytesFor(double bps, double seconds) {
  return static_cast<uint64_t>(bps * seconds / 8);
}

TEST_CASE("Idle NIC: the estimate is the capacity") {
  BandwidthEstimator est({10 * kGbit, 5 * kGbit, 0.5, 0.05});
  est.Add({0.0, 1000, 1000, 0, 0});
  Estimate e = est.Add({1.0, 1000, 1000, 0, 0});
  CHECK(e.up_bps == 10 * kGbit);
  CHECK(e.down_bps == 5 * kGbit);
}

TEST_CASE("Background load is subtracted; MLfabric's own traffic is not") {
  BandwidthEstimator est({10 * kGbit, 10 * kGbit, 0.5, 0.05});
  uint64_t tx = 0, rx = 0, own_tx = 0;
  est.Add({0.0, rx, tx, 0, own_tx});
  // Every 100 ms: 3 Gbit/s background out, plus 4 Gbit/s of our own out.
  Estimate e;
  for (int i = 1; i <= 50; ++i) {
    tx += BytesFor(3 * kGbit, 0.1) + BytesFor(4 * kGbit, 0.1);
    own_tx += BytesFor(4 * kGbit, 0.1);
    e = est.Add({0.1 * i, rx, tx, 0, own_tx});
  }
  CHECK(e.background_up_bps == Approx(3 * kGbit).epsilon(1e-6));
  CHECK(e.up_bps == Approx(7 * kGbit).epsilon(1e-6));
  CHECK(e.down_bps == 10 * kGbit);
}

TEST_CASE("EWMA: a step in load is 63% absorbed after one time constant") {
  const double tau = 0.5;
  BandwidthEstimator est({10 * kGbit, 10 * kGbit, tau, 0.0});
  uint64_t rx = 0;
  est.Add({0.0, rx, 0, 0, 0});
  rx += 0;
  est.Add({0.1, rx, 0, 0, 0});  // first rate: 0 background
  Estimate e;
  for (int i = 2; i <= 6; ++i) {  // 0.5 s of 8 Gbit/s inbound
    rx += BytesFor(8 * kGbit, 0.1);
    e = est.Add({0.1 * i, rx, 0, 0, 0});
  }
  CHECK(e.background_down_bps == Approx(8 * kGbit * (1 - std::exp(-1.0))).epsilon(1e-6));
  // Irregular sampling gives the same answer: one 0.5 s interval.
  BandwidthEstimator coarse({10 * kGbit, 10 * kGbit, tau, 0.0});
  coarse.Add({0.0, 0, 0, 0, 0});
  coarse.Add({0.1, 0, 0, 0, 0});
  Estimate c = coarse.Add({0.6, BytesFor(8 * kGbit, 0.5), 0, 0, 0});
  CHECK(c.background_down_bps == Approx(e.background_down_bps).epsilon(1e-6));
}

TEST_CASE("Estimates are clamped; counter resets and stale samples are ignored") {
  BandwidthEstimator est({1 * kGbit, 1 * kGbit, 0.1, 0.05});
  est.Add({0.0, 0, 0, 0, 0});
  Estimate e = est.Add({1.0, BytesFor(5 * kGbit, 1), 0, 0, 0});  // more than capacity
  CHECK(e.down_bps == Approx(0.05 * kGbit));
  e = est.Add({1.0, 1, 1, 0, 0});  // same timestamp: ignored
  CHECK(e.down_bps == Approx(0.05 * kGbit));
  e = est.Add({2.0, 10, 10, 0, 0});  // counter went backwards: new baseline, no rate
  CHECK(e.down_bps == Approx(0.05 * kGbit));
  est.SetCapacity(2 * kGbit, 2 * kGbit);
  CHECK(est.Current().up_bps == 2 * kGbit);
}

TEST_CASE("Report policy: first value, threshold, heartbeat") {
  ReportPolicy policy({0.1, 2.0, 0.0});
  policy.Observe(0.0, 10, 10);
  auto r = policy.Poll(0.0);
  REQUIRE(r.has_value());
  CHECK(r->up_bps == 10);
  policy.Observe(0.1, 10.5, 10);  // 5%: below threshold
  CHECK(!policy.Poll(0.1).has_value());
  policy.Observe(0.2, 10, 8);  // 20% down
  r = policy.Poll(0.2);
  REQUIRE(r.has_value());
  CHECK(r->down_bps == 8);
  policy.Observe(1.0, 10, 8);
  CHECK(!policy.Poll(1.0).has_value());
  policy.Observe(2.2, 10, 8);
  r = policy.Poll(2.2);  // 2 s since the last report: heartbeat
  REQUIRE(r.has_value());
  CHECK(r->at_s == 2.2);
}

TEST_CASE("Report policy: a change is reported lag seconds after it was measured") {
  for (double lag : {0.2, 0.5, 2.0}) {
    ReportPolicy policy({0.1, 100.0, lag});
    std::vector<Report> reports;
    for (int i = 0; i <= 400; ++i) {
      const double t = 0.01 * i;
      policy.Observe(t, t < 1.0 ? 10 : 2.5, 10);
      if (auto r = policy.Poll(t)) reports.push_back(*r);
    }
    REQUIRE(reports.size() == 2);
    CHECK(reports[0].at_s == Approx(lag));  // the first estimate, matured
    CHECK(reports[1].up_bps == 2.5);
    CHECK(reports[1].measured_at_s == Approx(1.0));
    CHECK(reports[1].at_s == Approx(1.0 + lag).margin(0.011));
  }
}

TEST_CASE("Traces draw rates with the setting's probabilities, deterministically") {
  const std::map<std::string, std::vector<double>> expected = {
      {"n1", {0, 0, 0, 0.1, 0.9}}, {"n2", {0, 0.1, 0.1, 0.1, 0.7}}, {"n3", {0.5, 0, 0, 0, 0.5}}};
  for (const auto& [setting, p] : expected) {
    auto trace = BandwidthTrace::FromSpec(setting + ",seed=11,period_s=2,scale=0.5");
    REQUIRE(trace.ok());
    std::vector<int> counts(5, 0);
    const int kSteps = 20000;
    for (int k = 0; k < kSteps; ++k) {
      const TraceRate r = trace->RateAt(2.0 * k + 0.7);
      CHECK(r.up_bps == trace->RateAt(2.0 * k).up_bps);  // constant within a step
      for (int i = 0; i < 5; ++i) counts[i] += r.up_bps == kTraceRatesBps[i] * 0.5;
    }
    INFO(setting);
    for (int i = 0; i < 5; ++i) CHECK(counts[i] / double(kSteps) == Approx(p[i]).margin(0.015));
  }
  auto a = BandwidthTrace::FromSpec("n2,seed=3").value();
  auto b = BandwidthTrace::FromSpec("n2,seed=3").value();
  auto c = BandwidthTrace::FromSpec("n2,seed=4").value();
  int same = 0, differ = 0;
  for (int k = 0; k < 200; ++k) {
    same += a.RateAt(5.0 * k).down_bps == b.RateAt(5.0 * k).down_bps;
    differ += a.RateAt(5.0 * k).down_bps != c.RateAt(5.0 * k).down_bps;
  }
  CHECK(same == 200);
  CHECK(differ > 20);
  CHECK(a.NextChangeAfter(7.0) == 10.0);
  CHECK(!BandwidthTrace::FromSpec("n4").ok());
  auto bad = BandwidthTrace::FromSpec("n1,sede=2");
  REQUIRE(!bad.ok());
  CHECK(std::string(bad.status().message()).find("sede") != std::string::npos);
  CHECK(HtbRateCommand("veth0", "1:10", 2.5e9) ==
        std::vector<std::string>{"tc", "class", "change", "dev", "veth0", "parent", "1:",
                                 "classid", "1:10", "htb", "rate", "2500000000bit", "ceil",
                                 "2500000000bit"});
}

class FakeCounters : public CounterSource {
 public:
  absl::StatusOr<NicCounters> Read() override { return counters; }
  NicCounters counters;
};

TEST_CASE("Monitor: fake counters and clock, reports after the lag") {
  FakeClock clock(100.0);
  auto fake = std::make_unique<FakeCounters>();
  FakeCounters* counters = fake.get();
  OwnBytes own;
  std::vector<std::pair<double, double>> reports;
  std::vector<double> report_times;
  MonitorConfig config;
  config.capacity_up_bps = 10 * kGbit;
  config.capacity_down_bps = 10 * kGbit;
  config.ewma_tau_s = 0.05;
  config.report_lag_s = 0.3;
  config.report_max_interval_s = 100;
  auto monitor = BandwidthMonitor::Create(
      config, &clock,
      [&](double up, double down) {
        reports.push_back({up, down});
        report_times.push_back(clock.NowSeconds());
      },
      [&] { return own; }, std::move(fake));
  REQUIRE(monitor.ok());
  for (int i = 0; i < 30; ++i) {  // 3 s; background 6 Gbit/s out from t = 101
    if (clock.NowSeconds() >= 101.0) counters->counters.tx_bytes += BytesFor(6 * kGbit, 0.1);
    own.tx_bytes += BytesFor(2 * kGbit, 0.1);  // ours: ignored
    counters->counters.tx_bytes += BytesFor(2 * kGbit, 0.1);
    (*monitor)->Tick();
    clock.Advance(0.1);
  }
  REQUIRE(reports.size() >= 2);
  CHECK(reports.front().first == 10 * kGbit);
  CHECK(report_times.front() == Approx(100.3));
  // 6 Gbit/s of background, 2 Gbit/s of our own: 4 Gbit/s left; the last
  // report is within the 10 % threshold of the converged estimate.
  CHECK((*monitor)->LastEstimate().up_bps == Approx(4 * kGbit).epsilon(0.01));
  CHECK(reports.back().first == Approx(4 * kGbit).epsilon(0.1));
  // The change measured at 101.0 is reported at 101.3 (lag), give or take a tick.
  CHECK(report_times[1] >= 101.3 - 1e-9);
  CHECK(report_times[1] <= 101.4 + 1e-9);
}

TEST_CASE("Monitor: trace replay without counters reports the trace") {
  FakeClock clock(0.0);
  std::vector<double> ups;
  MonitorConfig config;
  config.trace = "n3,seed=5,period_s=1,scale=0.1";
  config.report_lag_s = 0;
  auto monitor =
      BandwidthMonitor::Create(config, &clock, [&](double up, double) { ups.push_back(up); });
  REQUIRE(monitor.ok());
  const BandwidthTrace* trace = (*monitor)->trace();
  REQUIRE(trace != nullptr);
  for (int i = 0; i < 100; ++i) {
    (*monitor)->Tick();
    CHECK((*monitor)->LastEstimate().up_bps == trace->RateAt(clock.NowSeconds()).up_bps);
    clock.Advance(0.1);
  }
  CHECK(ups.size() >= 3);  // n3 alternates between 0.1 and 1 Gbit/s

  config.trace = "n9";
  auto bad = BandwidthMonitor::Create(config, &clock, [](double, double) {});
  REQUIRE(!bad.ok());
  CHECK(std::string(bad.status().message()).find("monitor_trace") != std::string::npos);
}

TEST_CASE("Sysfs sampler reads counters, and names a missing interface") {
  const std::string root = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR")
                                                                   : "/tmp") + "/sysfs";
  std::filesystem::create_directories(root + "/veth7/statistics");
  std::ofstream(root + "/veth7/statistics/rx_bytes") << "12345\n";
  std::ofstream(root + "/veth7/statistics/tx_bytes") << "678\n";
  SysfsCounterSource source("veth7", root);
  auto counters = source.Read();
  REQUIRE(counters.ok());
  CHECK(counters->rx_bytes == 12345);
  CHECK(counters->tx_bytes == 678);
  auto missing = SysfsCounterSource("nope0", root).Read();
  REQUIRE(!missing.ok());
  CHECK(std::string(missing.status().message()).find("nope0") != std::string::npos);
  // The real loopback device exists on every Linux machine.
  if (std::filesystem::exists("/sys/class/net/lo/statistics/rx_bytes")) {
    CHECK(SysfsCounterSource("lo").Read().ok());
  }
}

}  // namespace
}  // namespace mlfabric::monitor
