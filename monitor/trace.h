// Bandwidth traces for experiments (paper §7, network settings N1-N3):
// every `period_s` seconds each direction of a link gets a rate drawn from
// {1, 2.5, 3.3, 5, 10} Gbit/s (times `scale`, to fit a testbed) with the
// setting's probabilities:
//   N1 = (0, 0, 0, 0.1, 0.9)   mostly idle links
//   N2 = (0, 0.1, 0.1, 0.1, 0.7)
//   N3 = (0.5, 0, 0, 0, 0.5)   half the time congested to 1 Gbit/s
// A trace is a pure function of (setting, seed, period, scale): the rate of
// step k is drawn from a generator seeded with (seed, k, direction), so
// RateAt(t) needs no state, any host can replay any instant, and two hosts
// with different seeds get independent traces.
//
//   auto trace = BandwidthTrace::FromSpec("n3,seed=7,period_s=1,scale=0.01").value();
//   TraceRate r = trace.RateAt(12.5);  // seconds since the trace started
//
// The trace can drive the monitor's reports (replay) and, on emulated
// hosts, an htb class via HtbRateCommand (tc is run by the caller).
// Thread safety: immutable after construction; safe to share.
#ifndef MLFABRIC_MONITOR_TRACE_H_
#define MLFABRIC_MONITOR_TRACE_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mlfabric::monitor {

inline constexpr std::array<double, 5> kTraceRatesBps = {1e9, 2.5e9, 3.3e9, 5e9, 10e9};

struct TraceOptions {
  std::string setting = "n1";  // n1 | n2 | n3
  uint64_t seed = 1;
  double period_s = 5.0;
  double scale = 1.0;
};

struct TraceRate {
  double up_bps = 0;
  double down_bps = 0;
};

class BandwidthTrace {
 public:
  static absl::StatusOr<BandwidthTrace> Create(const TraceOptions& options);
  // "n2" or "n2,seed=7,period_s=1,scale=0.01" (keys optional, any order);
  // errors name the bad part.
  static absl::StatusOr<BandwidthTrace> FromSpec(const std::string& spec);

  TraceRate RateAt(double t_s) const;
  // The first step boundary strictly after `t_s`.
  double NextChangeAfter(double t_s) const;
  const TraceOptions& options() const { return options_; }
  const std::array<double, 5>& probabilities() const { return probabilities_; }

 private:
  BandwidthTrace(TraceOptions options, std::array<double, 5> probabilities)
      : options_(std::move(options)), probabilities_(probabilities) {}
  double Draw(int64_t step, int direction) const;

  TraceOptions options_;
  std::array<double, 5> probabilities_;
};

// argv for `tc class change dev <device> parent 1: classid <classid> htb
// rate <r>bit ceil <r>bit` (the htb tree itself is set up by the emulation
// harness; see shared notes on emulated hosts).
std::vector<std::string> HtbRateCommand(const std::string& device, const std::string& classid,
                                        double rate_bps);

}  // namespace mlfabric::monitor

#endif  // MLFABRIC_MONITOR_TRACE_H_
