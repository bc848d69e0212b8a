// ReportPolicy: when a host's monitor tells the scheduler its available
// bandwidth (docs/architecture.md §6). Pure: estimates with timestamps in, reports out.
//
// Reporting lag. An estimate made at time t only becomes reportable at
// t + lag_s (the paper's §7 studies lags of 0.2-2 s: how stale the
// scheduler's view is). With lag 0 the latest estimate is used.
// Among the matured estimates the latest one counts; it is reported when
//   - nothing was reported yet, or
//   - either direction changed by more than `threshold_fraction` relative
//     to the last report, or
//   - `max_interval_s` passed since the last report (a heartbeat, so the
//     scheduler can tell a live quiet monitor from a dead one).
// So a change is reported at most lag + one polling period after it was
// estimated.
//
//   ReportPolicy policy({.threshold_fraction = 0.1, .max_interval_s = 2, .lag_s = 0.2});
//   policy.Observe(now, est.up_bps, est.down_bps);
//   if (auto r = policy.Poll(now)) client.ReportBandwidth(r->up_bps, r->down_bps);
//
// Thread safety: none (a plain value).
#ifndef MLFABRIC_MONITOR_REPORT_POLICY_H_
#define MLFABRIC_MONITOR_REPORT_POLICY_H_

#include <deque>
#include <optional>

namespace mlfabric::monitor {

struct ReportPolicyOptions {
  double threshold_fraction = 0.1;
  double max_interval_s = 2.0;
  double lag_s = 0.0;
};

struct Report {
  double at_s = 0;           // when the report is made
  double measured_at_s = 0;  // when the reported estimate was made
  double up_bps = 0;
  double down_bps = 0;
};

class ReportPolicy {
 public:
  explicit ReportPolicy(ReportPolicyOptions options) : options_(options) {}

  // Records the estimate made at `at_s` (non-decreasing).
  void Observe(double at_s, double up_bps, double down_bps);

  // The report to send at `now_s`, if one is due.
  std::optional<Report> Poll(double now_s);

  std::optional<Report> last_report() const { return last_; }

 private:
  struct Observation {
    double at_s, up_bps, down_bps;
  };
  ReportPolicyOptions options_;
  std::deque<Observation> waiting_;  // not yet matured (younger than lag)
  std::optional<Observation> matured_;
  std::optional<Report> last_;
};

}  // namespace mlfabric::monitor

#endif  // MLFABRIC_MONITOR_REPORT_POLICY_H_
