#include "monitor/trace.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace mlfabric::monitor {
namespace {

// SplitMix64: a good 64-bit mix, enough to seed one draw per step.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

absl::StatusOr<BandwidthTrace> BandwidthTrace::Create(const TraceOptions& options) {
  std::array<double, 5> p;
  if (options.setting == "n1") {
    p = {0, 0, 0, 0.1, 0.9};
  } else if (options.setting == "n2") {
    p = {0, 0.1, 0.1, 0.1, 0.7};
  } else if (options.setting == "n3") {
    p = {0.5, 0, 0, 0, 0.5};
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("trace setting '", options.setting, "' is not one of n1, n2, n3"));
  }
  if (!(options.period_s > 0) || !std::isfinite(options.period_s)) {
    return absl::InvalidArgumentError("trace period_s: must be a positive number of seconds");
  }
  if (!(options.scale > 0) || !std::isfinite(options.scale)) {
    return absl::InvalidArgumentError("trace scale: must be positive");
  }
  return BandwidthTrace(options, p);
}

absl::StatusOr<BandwidthTrace> BandwidthTrace::FromSpec(const std::string& spec) {
  TraceOptions options;
  bool first = true;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    if (first) {
      options.setting = std::string(part);
      first = false;
      continue;
    }
    std::pair<std::string, std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    bool ok = false;
    if (kv.first == "seed") {
      ok = absl::SimpleAtoi(kv.second, &options.seed);
    } else if (kv.first == "period_s") {
      ok = absl::SimpleAtod(kv.second, &options.period_s);
    } else if (kv.first == "scale") {
      ok = absl::SimpleAtod(kv.second, &options.scale);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "trace spec '", spec, "': unknown key '", kv.first, "' (known: seed, period_s, scale)"));
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("trace spec '", spec, "': bad value for ", kv.first, ": '", kv.second, "'"));
    }
  }
  return Create(options);
}

double BandwidthTrace::Draw(int64_t step, int direction) const {
  const uint64_t bits =
      Mix(Mix(options_.seed) ^ Mix(static_cast<uint64_t>(step) * 2 + direction));
  const double u = static_cast<double>(bits >> 11) * 0x1.0p-53;  // [0, 1)
  double cumulative = 0;
  for (size_t i = 0; i < probabilities_.size(); ++i) {
    cumulative += probabilities_[i];
    if (u < cumulative) return kTraceRatesBps[i] * options_.scale;
  }
  return kTraceRatesBps.back() * options_.scale;
}

TraceRate BandwidthTrace::RateAt(double t_s) const {
  const int64_t step = static_cast<int64_t>(std::floor(std::max(0.0, t_s) / options_.period_s));
  return {Draw(step, 0), Draw(step, 1)};
}

double BandwidthTrace::NextChangeAfter(double t_s) const {
  return (std::floor(std::max(0.0, t_s) / options_.period_s) + 1) * options_.period_s;
}

std::vector<std::string> HtbRateCommand(const std::string& device, const std::string& classid,
                                        double rate_bps) {
  const std::string rate = absl::StrCat(static_cast<uint64_t>(std::llround(rate_bps)), "bit");
  return {"tc", "class", "change", "dev", device, "parent", "1:", "classid", classid,
          "htb", "rate", rate, "ceil", rate};
}

}  // namespace mlfabric::monitor
