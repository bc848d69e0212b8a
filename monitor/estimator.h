// BandwidthEstimator: available bandwidth per direction of one host's NIC,
// from cumulative byte counters (docs/architecture.md §6). Pure: samples (with their
// timestamps) in, estimates out; no clock, no I/O, no threads.
//
// Model. Between two samples the NIC moved `d_total` bytes in a direction,
// `d_own` of them MLfabric's own scheduled traffic (the scheduler already
// reserves those, so they are not background load). The background rate is
// `max(0, d_total - d_own) * 8 / dt`. It is smoothed by a time-based EWMA
// with time constant `ewma_tau_s` (weight of a new interval
// `1 - exp(-dt / tau)`, so irregular sampling is handled and a step change
// in background load is 63 % absorbed after tau seconds). The estimate is
// `capacity - smoothed_background`, clamped to
// [min_available_fraction * capacity, capacity]: the scheduler never sees a
// link as fully gone, because background traffic measured on a shared NIC
// also yields to MLfabric's transfers.
//
// Uplink = transmitted (tx) bytes, downlink = received (rx) bytes.
// A counter that goes backwards (NIC reset, wrap) restarts the baseline.
//
//   BandwidthEstimator est({.capacity_up_bps = 10e9, .capacity_down_bps = 10e9});
//   est.Add({0.0, rx, tx, own_rx, own_tx});
//   Estimate e = est.Add({0.1, rx2, tx2, own_rx2, own_tx2});  // e.up_bps, e.down_bps
//
// Thread safety: none (a plain value); the owner serialises calls.
#ifndef MLFABRIC_MONITOR_ESTIMATOR_H_
#define MLFABRIC_MONITOR_ESTIMATOR_H_

#include <cstdint>
#include <optional>

namespace mlfabric::monitor {

struct CounterSample {
  double at_s = 0;
  uint64_t rx_bytes = 0;      // NIC totals (e.g. /sys/class/net/<if>/statistics)
  uint64_t tx_bytes = 0;
  uint64_t own_rx_bytes = 0;  // of which MLfabric's own traffic (cumulative)
  uint64_t own_tx_bytes = 0;
};

struct EstimatorOptions {
  double capacity_up_bps = 10e9;
  double capacity_down_bps = 10e9;
  double ewma_tau_s = 0.5;
  double min_available_fraction = 0.05;
};

struct Estimate {
  double at_s = 0;
  double up_bps = 0;              // available
  double down_bps = 0;
  double background_up_bps = 0;   // smoothed non-MLfabric load
  double background_down_bps = 0;
};

class BandwidthEstimator {
 public:
  explicit BandwidthEstimator(EstimatorOptions options);

  // Feeds one sample (timestamps must not go backwards; a sample at or
  // before the previous one is ignored) and returns the estimate after it.
  Estimate Add(const CounterSample& sample);

  // Changes the capacity (trace replay, a tc class rate); takes effect on
  // the current estimate at once.
  void SetCapacity(double up_bps, double down_bps);

  Estimate Current() const { return current_; }

 private:
  void Recompute();

  EstimatorOptions options_;
  std::optional<CounterSample> last_;
  bool have_rate_ = false;
  Estimate current_;
};

}  // namespace mlfabric::monitor

#endif  // MLFABRIC_MONITOR_ESTIMATOR_H_
