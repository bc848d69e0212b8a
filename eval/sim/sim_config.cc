#include "eval/sim/sim_config.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mlfabric::sim {

absl::StatusOr<ComputeSetting> ComputeSettingByName(const std::string& name) {
  if (name == "C0") return ComputeSetting{"C0", 0.0, 1.0};
  if (name == "C1") return ComputeSetting{"C1", 0.10, 2.0};
  if (name == "C2") return ComputeSetting{"C2", 0.10, 4.0};
  if (name == "C3") return ComputeSetting{"C3", 0.04, 2.0};
  return absl::InvalidArgumentError(
      absl::StrCat("compute: '", name, "' is not one of C0, C1, C2, C3"));
}

absl::StatusOr<NetworkSetting> NetworkSettingByName(const std::string& name) {
  if (name == "N0") return NetworkSetting{"N0", {0, 0, 0, 0, 1}};
  if (name == "N1") return NetworkSetting{"N1", {0, 0, 0, 0.1, 0.9}};
  if (name == "N2") return NetworkSetting{"N2", {0, 0.1, 0.1, 0.1, 0.7}};
  if (name == "N3") return NetworkSetting{"N3", {0.5, 0, 0, 0, 0.5}};
  return absl::InvalidArgumentError(
      absl::StrCat("network: '", name, "' is not one of N0, N1, N2, N3"));
}

absl::Status ValidateConfig(const SimConfig& c) {
  if (c.workers < 2 || c.workers > 1000) {
    return absl::InvalidArgumentError("workers: must be in [2, 1000]");
  }
  if (c.workers_per_host < 1 || c.workers_per_host > c.workers) {
    return absl::InvalidArgumentError("workers_per_host: must be in [1, workers]");
  }
  if (c.intra_host_bps <= 0) return absl::InvalidArgumentError("intra_host_bps: must be > 0");
  if (c.servers < 1 || c.servers > 1000) {
    return absl::InvalidArgumentError("servers: must be in [1, 1000]");
  }
  if (c.model_bytes < c.servers) {
    return absl::InvalidArgumentError("servers: more shards than the model has bytes");
  }
  const int machines = (c.workers + c.workers_per_host - 1) / c.workers_per_host;
  if (c.aggregators < -1 || c.aggregators > 1000) {
    return absl::InvalidArgumentError("aggregators: must be in [-1, 1000]");
  }
  if (c.aggregators_on_workers && c.aggregators > machines) {
    return absl::InvalidArgumentError(
        "aggregators: with aggregators_on_workers at most one per worker machine");
  }
  if (c.distributors < -1) return absl::InvalidArgumentError("distributors: must be >= -1");
  if (c.max_outstanding_pushes < 0) {
    return absl::InvalidArgumentError("max_outstanding_pushes: must be >= 0");
  }
  if (c.trace_period_s <= 0) return absl::InvalidArgumentError("trace_period_s: must be > 0");
  if (c.model_bytes <= 0) return absl::InvalidArgumentError("model_bytes: must be > 0");
  if (c.compute_s <= 0) return absl::InvalidArgumentError("compute_s: must be > 0");
  if (c.batch_interval_s <= 0) return absl::InvalidArgumentError("batch_interval_s: must be > 0");
  if (c.monitor_lag_s < 0) return absl::InvalidArgumentError("monitor_lag_s: must be >= 0");
  if (c.tau_max < 1) return absl::InvalidArgumentError("tau_max: must be >= 1");
  if (c.max_sim_s <= 0) return absl::InvalidArgumentError("max_sim_s: must be > 0");
  if (c.eval_interval_s <= 0) return absl::InvalidArgumentError("eval_interval_s: must be > 0");
  if (c.target_accuracy <= 0 || c.target_accuracy > 1) {
    return absl::InvalidArgumentError("target_accuracy: must be in (0, 1]");
  }
  double total = 0;
  for (double p : c.network.probabilities) {
    if (p < 0) return absl::InvalidArgumentError("network: negative probability");
    total += p;
  }
  if (std::fabs(total - 1) > 1e-9) {
    return absl::InvalidArgumentError("network: probabilities must sum to 1");
  }
  if (c.compute.straggler_probability < 0 || c.compute.straggler_probability > 1 ||
      c.compute.slowdown < 1) {
    return absl::InvalidArgumentError("compute: need r in [0, 1] and s >= 1");
  }
  if (c.sgd.features < 1 || c.sgd.classes < 2 || c.sgd.batch < 1 || c.sgd.test_samples < 1 ||
      c.sgd.lr <= 0) {
    return absl::InvalidArgumentError("sgd: features >= 1, classes >= 2, batch >= 1, lr > 0");
  }
  return absl::OkStatus();
}

HostLayout MakeLayout(const SimConfig& c) {
  HostLayout l;
  l.workers_per_host = c.workers_per_host;
  l.machines = (c.workers + c.workers_per_host - 1) / c.workers_per_host;
  l.server = l.machines;
  l.servers = c.servers;
  const int after_servers = l.machines + l.servers;
  if (c.aggregators_on_workers) {
    l.aggregators = c.aggregators < 0 ? l.machines : c.aggregators;
    for (int a = 0; a < l.aggregators; ++a) l.aggregator_hosts.push_back(a);
    l.hosts = after_servers;
  } else {
    l.aggregators = c.aggregators < 0 ? 4 : c.aggregators;
    for (int a = 0; a < l.aggregators; ++a) l.aggregator_hosts.push_back(after_servers + a);
    l.hosts = after_servers + l.aggregators;
  }
  return l;
}

uint64_t MixSeed(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  uint64_t h = mix(seed);
  h = mix(h ^ a);
  h = mix(h ^ b);
  h = mix(h ^ c);
  h = mix(h ^ d);
  return h;
}

double UnitFromBits(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

NetworkTrace::NetworkTrace(const SimConfig& config, int server_host)
    : setting_(config.network),
      period_s_(config.trace_period_s),
      seed_(config.seed),
      server_host_(server_host),
      servers_(config.servers),
      server_follows_trace_(config.server_follows_trace),
      server_bps_(config.server_bps) {}

double NetworkTrace::CapacityBps(int host, bool up, double t_s) const {
  const bool server = server_host_ >= 0 && host >= server_host_ && host < server_host_ + servers_;
  if (server && !server_follows_trace_) return server_bps_;
  const int64_t period = static_cast<int64_t>(std::floor(std::max(0.0, t_s) / period_s_));
  const double u = UnitFromBits(MixSeed(seed_, 0x7472616365ULL, static_cast<uint64_t>(host),
                                        up ? 1 : 2, static_cast<uint64_t>(period)));
  double cumulative = 0;
  for (size_t i = 0; i < kRatesGbps.size(); ++i) {
    cumulative += setting_.probabilities[i];
    if (u < cumulative) return kRatesGbps[i] * 1e9;
  }
  for (size_t i = kRatesGbps.size(); i-- > 0;) {
    if (setting_.probabilities[i] > 0) return kRatesGbps[i] * 1e9;
  }
  return kRatesGbps.back() * 1e9;
}

double NetworkTrace::NextChangeS(double t_s) const {
  const double k = std::floor(std::max(0.0, t_s) / period_s_) + 1;
  return k * period_s_;
}

double ComputeTimeS(const SimConfig& config, int worker, int64_t iteration) {
  const double u = UnitFromBits(MixSeed(config.seed, 0x636f6d70ULL, static_cast<uint64_t>(worker),
                                        static_cast<uint64_t>(iteration)));
  const bool slow = u < config.compute.straggler_probability;
  return config.compute_s * (slow ? config.compute.slowdown : 1.0);
}

}  // namespace mlfabric::sim
