// BandwidthMonitor: one host's monitor (docs/architecture.md §6), run by mlfabricd. Each
// tick it samples the NIC counters (if an interface is configured) and the
// daemon's own traffic, updates a BandwidthEstimator, applies the trace's
// capacity (if replaying one) and asks a ReportPolicy whether to report;
// reports go to a caller-supplied function (the daemon calls the
// scheduler's ReportBandwidth there).
//
//   MonitorConfig config;
//   config.interface = "eth0";           // or config.trace = "n2,seed=3,period_s=5,scale=0.01"
//   config.capacity_up_bps = config.capacity_down_bps = 10e9;
//   config.report_lag_s = 0.2;
//   auto monitor = BandwidthMonitor::Create(config, &clock,
//       [&](double up_bps, double down_bps) { client.ReportBandwidth(up_bps, down_bps); },
//       [&] { return OwnBytes{daemon.rx_bytes(), daemon.tx_bytes()}; }).value();
//   monitor->Start();   // a thread ticking every period_s; or call Tick() yourself
//   ...
//   monitor->Stop();
//
// Capacity: the configured capacity, replaced by the trace's current rate
// when a trace is replayed. Without an interface the estimate is the
// capacity itself (pure replay). The report function is called on the
// ticking thread without any lock held; it must not call Stop().
// Thread safety: Tick, Start, Stop and the getters may be called from any
// thread; ticks are serialised.
#ifndef MLFABRIC_MONITOR_BANDWIDTH_MONITOR_H_
#define MLFABRIC_MONITOR_BANDWIDTH_MONITOR_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "monitor/estimator.h"
#include "monitor/report_policy.h"
#include "monitor/sampler.h"
#include "monitor/tc_capacity.h"
#include "monitor/trace.h"

namespace mlfabric::monitor {

struct MonitorConfig {
  std::string interface;               // NIC to sample; empty = no counters
  std::string sysfs_root = "/sys/class/net";
  double capacity_up_bps = 10e9;       // configured NIC capacity
  double capacity_down_bps = 10e9;
  double period_s = 0.1;               // sampling/report-check period
  double ewma_tau_s = 0.5;             // estimator smoothing
  double report_lag_s = 0.2;           // the paper's reporting lag (0.2-2 s)
  double report_threshold = 0.1;       // relative change that triggers a report
  double report_max_interval_s = 2.0;  // heartbeat
  std::string trace;                   // "" or a BandwidthTrace spec, e.g. "n3,seed=1,period_s=5"
  // htb class shaping `interface` (e.g. "1:10"): its ceil, read every
  // second, is the uplink capacity (docs/architecture.md §6). "" = off.
  std::string tc_class;
};

// Cumulative bytes the daemon itself received and sent.
struct OwnBytes {
  uint64_t rx_bytes = 0;
  uint64_t tx_bytes = 0;
};

class BandwidthMonitor {
 public:
  using ReportFn = std::function<void(double up_bps, double down_bps)>;
  using OwnTrafficFn = std::function<OwnBytes()>;

  // `counters` defaults to SysfsCounterSource(config.interface) when an
  // interface is configured. Errors name the config key.
  static absl::StatusOr<std::unique_ptr<BandwidthMonitor>> Create(
      MonitorConfig config, const Clock* clock, ReportFn report, OwnTrafficFn own = nullptr,
      std::unique_ptr<CounterSource> counters = nullptr);
  ~BandwidthMonitor();

  // One sample/estimate/report step at clock->NowSeconds().
  void Tick();
  void Start();
  void Stop();

  Estimate LastEstimate() const;
  std::optional<Report> LastReport() const;
  // The replayed trace (nullptr without one) and when it started (its t = 0).
  const BandwidthTrace* trace() const { return trace_ ? &*trace_ : nullptr; }
  double trace_start_s() const { return trace_start_s_; }
  const MonitorConfig& config() const { return config_; }

 private:
  BandwidthMonitor(MonitorConfig config, const Clock* clock, ReportFn report, OwnTrafficFn own,
                   std::unique_ptr<CounterSource> counters, std::optional<BandwidthTrace> trace);

  const MonitorConfig config_;
  const Clock* clock_;
  const ReportFn report_;
  const OwnTrafficFn own_;
  std::unique_ptr<CounterSource> counters_;
  const std::optional<BandwidthTrace> trace_;
  const double trace_start_s_;

  mutable std::mutex mu_;  // guards the estimator and policy; held during a tick's math
  std::mutex tick_mu_;     // serialises ticks
  BandwidthEstimator estimator_;
  ReportPolicy policy_;
  bool counter_error_logged_ = false;
  double last_tc_read_s_ = -1e18;
  bool tc_error_logged_ = false;

  std::mutex run_mu_;
  std::condition_variable run_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace mlfabric::monitor

#endif  // MLFABRIC_MONITOR_BANDWIDTH_MONITOR_H_
