#include "monitor/estimator.h"

#include <algorithm>
#include <cmath>

namespace mlfabric::monitor {
namespace {

// Bytes in the interval not accounted for by MLfabric itself; 0 after a reset.
double BackgroundBits(uint64_t total_then, uint64_t total_now, uint64_t own_then, uint64_t own_now) {
  if (total_now < total_then) return 0;
  const double total = static_cast<double>(total_now - total_then);
  const double own = own_now >= own_then ? static_cast<double>(own_now - own_then) : 0;
  return 8.0 * std::max(0.0, total - own);
}

}  // namespace

BandwidthEstimator::BandwidthEstimator(EstimatorOptions options) : options_(options) {
  Recompute();
}

Estimate BandwidthEstimator::Add(const CounterSample& sample) {
  if (last_.has_value()) {
    const double dt = sample.at_s - last_->at_s;
    if (!(dt > 0)) return current_;
    const bool reset = sample.rx_bytes < last_->rx_bytes || sample.tx_bytes < last_->tx_bytes;
    if (!reset) {
      const double up = BackgroundBits(last_->tx_bytes, sample.tx_bytes, last_->own_tx_bytes,
                                       sample.own_tx_bytes) / dt;
      const double down = BackgroundBits(last_->rx_bytes, sample.rx_bytes, last_->own_rx_bytes,
                                         sample.own_rx_bytes) / dt;
      if (!have_rate_) {
        current_.background_up_bps = up;
        current_.background_down_bps = down;
        have_rate_ = true;
      } else {
        const double weight = 1.0 - std::exp(-dt / std::max(1e-9, options_.ewma_tau_s));
        current_.background_up_bps += weight * (up - current_.background_up_bps);
        current_.background_down_bps += weight * (down - current_.background_down_bps);
      }
    }
  }
  last_ = sample;
  current_.at_s = sample.at_s;
  Recompute();
  return current_;
}

void BandwidthEstimator::SetCapacity(double up_bps, double down_bps) {
  options_.capacity_up_bps = up_bps;
  options_.capacity_down_bps = down_bps;
  Recompute();
}

void BandwidthEstimator::Recompute() {
  auto available = [&](double capacity, double background) {
    const double floor = options_.min_available_fraction * capacity;
    return std::clamp(capacity - background, floor, capacity);
  };
  current_.up_bps = available(options_.capacity_up_bps, current_.background_up_bps);
  current_.down_bps = available(options_.capacity_down_bps, current_.background_down_bps);
}

}  // namespace mlfabric::monitor
