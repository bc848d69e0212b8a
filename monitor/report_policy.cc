#include "monitor/report_policy.h"

#include <cmath>

namespace mlfabric::monitor {
namespace {

bool Changed(double before, double now, double threshold) {
  if (before <= 0) return now > 0;
  return std::abs(now - before) > threshold * before;
}

}  // namespace

void ReportPolicy::Observe(double at_s, double up_bps, double down_bps) {
  waiting_.push_back({at_s, up_bps, down_bps});
}

std::optional<Report> ReportPolicy::Poll(double now_s) {
  // A small epsilon keeps "exactly lag_s old" matured despite rounding.
  while (!waiting_.empty() && waiting_.front().at_s <= now_s - options_.lag_s + 1e-9) {
    matured_ = waiting_.front();
    waiting_.pop_front();
  }
  if (!matured_.has_value()) return std::nullopt;
  const Observation& m = *matured_;
  const bool due =
      !last_.has_value() || Changed(last_->up_bps, m.up_bps, options_.threshold_fraction) ||
      Changed(last_->down_bps, m.down_bps, options_.threshold_fraction) ||
      now_s - last_->at_s >= options_.max_interval_s;
  if (!due) return std::nullopt;
  last_ = Report{now_s, m.at_s, m.up_bps, m.down_bps};
  return last_;
}

}  // namespace mlfabric::monitor
