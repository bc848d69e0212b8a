#include "monitor/bandwidth_monitor.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mlfabric::monitor {
namespace {

absl::Status Check(bool ok, const std::string& key, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InvalidArgumentError(absl::StrCat(key, ": ", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BandwidthMonitor>> BandwidthMonitor::Create(
    MonitorConfig config, const Clock* clock, ReportFn report, OwnTrafficFn own,
    std::unique_ptr<CounterSource> counters) {
  for (const absl::Status& s :
       {Check(config.capacity_up_bps > 0 && std::isfinite(config.capacity_up_bps),
              "capacity_up_bps", "must be positive"),
        Check(config.capacity_down_bps > 0 && std::isfinite(config.capacity_down_bps),
              "capacity_down_bps", "must be positive"),
        Check(config.period_s >= 0.001 && config.period_s <= 60, "monitor_period_s",
              "must be in [0.001, 60] seconds"),
        Check(config.ewma_tau_s > 0, "monitor_ewma_tau_s", "must be positive"),
        Check(config.report_lag_s >= 0 && config.report_lag_s <= 60, "report_lag_s",
              "must be in [0, 60] seconds"),
        Check(config.report_threshold >= 0, "report_threshold", "must be >= 0"),
        Check(config.report_max_interval_s > 0, "report_max_interval_s", "must be positive"),
        Check(report != nullptr, "report", "a report function is required")}) {
    if (!s.ok()) return s;
  }
  std::optional<BandwidthTrace> trace;
  if (!config.trace.empty()) {
    auto parsed = BandwidthTrace::FromSpec(config.trace);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("monitor_trace: ", parsed.status().message()));
    }
    trace = *parsed;
  }
  if (!config.tc_class.empty()) {
    if (config.interface.empty()) {
      return absl::InvalidArgumentError(
          "monitor_tc_class: needs monitor_interface (the shaped NIC)");
    }
    if (auto ceil = TcClassCapacity(config.interface, config.tc_class).Read(); !ceil.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("monitor_tc_class: ", ceil.status().message()));
    }
  }
  if (counters == nullptr && !config.interface.empty()) {
    counters = std::make_unique<SysfsCounterSource>(config.interface, config.sysfs_root);
    if (auto first = counters->Read(); !first.ok()) return first.status();
  }
  return std::unique_ptr<BandwidthMonitor>(new BandwidthMonitor(
      std::move(config), clock, std::move(report), std::move(own), std::move(counters),
      std::move(trace)));
}

BandwidthMonitor::BandwidthMonitor(MonitorConfig config, const Clock* clock, ReportFn report,
                                   OwnTrafficFn own, std::unique_ptr<CounterSource> counters,
                                   std::optional<BandwidthTrace> trace)
    : config_(std::move(config)),
      clock_(clock),
      report_(std::move(report)),
      own_(std::move(own)),
      counters_(std::move(counters)),
      trace_(std::move(trace)),
      trace_start_s_(clock->NowSeconds()),
      estimator_({config_.capacity_up_bps, config_.capacity_down_bps, config_.ewma_tau_s, 0.05}),
      policy_({config_.report_threshold, config_.report_max_interval_s, config_.report_lag_s}) {}

BandwidthMonitor::~BandwidthMonitor() { Stop(); }

void BandwidthMonitor::Tick() {
  std::lock_guard<std::mutex> tick_lock(tick_mu_);
  const double now_s = clock_->NowSeconds();
  std::optional<NicCounters> nic;
  if (counters_ != nullptr) {
    auto read = counters_->Read();
    if (read.ok()) {
      nic = *read;
    } else if (!counter_error_logged_) {
      MLF_LOG(WARNING) << "monitor: " << read.status().message() << "; reporting capacity only";
      counter_error_logged_ = true;
    }
  }
  std::optional<double> tc_ceil_bps;
  if (!config_.tc_class.empty() && now_s - last_tc_read_s_ >= 1.0) {
    last_tc_read_s_ = now_s;
    auto ceil = TcClassCapacity(config_.interface, config_.tc_class).Read();
    if (ceil.ok()) {
      tc_ceil_bps = *ceil;
    } else if (!tc_error_logged_) {
      MLF_LOG(WARNING) << "monitor: " << ceil.status().message() << "; keeping the last capacity";
      tc_error_logged_ = true;
    }
  }
  const OwnBytes own = own_ ? own_() : OwnBytes{};
  std::optional<Report> report;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (trace_) {
      const TraceRate rate = trace_->RateAt(now_s - trace_start_s_);
      estimator_.SetCapacity(rate.up_bps, rate.down_bps);
    }
    if (tc_ceil_bps) {
      // htb shapes the NIC's egress: the class ceil bounds the uplink.
      estimator_.SetCapacity(*tc_ceil_bps, config_.capacity_down_bps);
    }
    Estimate estimate = estimator_.Current();
    if (nic) {
      estimate = estimator_.Add({now_s, nic->rx_bytes, nic->tx_bytes, own.rx_bytes, own.tx_bytes});
    }
    policy_.Observe(now_s, estimate.up_bps, estimate.down_bps);
    report = policy_.Poll(now_s);
  }
  if (report) report_(report->up_bps, report->down_bps);
}

void BandwidthMonitor::Start() {
  std::lock_guard<std::mutex> lock(run_mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] {
    const auto period = std::chrono::duration<double>(config_.period_s);
    auto next = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(run_mu_);
    while (!stopping_) {
      lock.unlock();
      Tick();
      lock.lock();
      next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
      run_cv_.wait_until(lock, next, [this] { return stopping_; });
    }
  });
}

void BandwidthMonitor::Stop() {
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(run_mu_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  run_cv_.notify_all();
  if (thread.joinable()) thread.join();
}

Estimate BandwidthMonitor::LastEstimate() const {
  std::lock_guard<std::mutex> lock(mu_);
  return estimator_.Current();
}

std::optional<Report> BandwidthMonitor::LastReport() const {
  std::lock_guard<std::mutex> lock(mu_);
  return policy_.last_report();
}

}  // namespace mlfabric::monitor
