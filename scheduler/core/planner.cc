#include "scheduler/core/planner.h"

#include <cmath>
#include <unordered_set>

#include "absl/strings/str_cat.h"

namespace mlfabric::core {

namespace {

absl::Status CheckCapacity(const std::string& field, double bps) {
  if (!std::isfinite(bps) || bps <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": capacity must be a positive number of bits per second, got ", bps));
  }
  return absl::OkStatus();
}

absl::Status CheckProfile(const std::string& field, const std::vector<ProfilePoint>& profile) {
  for (size_t i = 0; i < profile.size(); ++i) {
    const std::string point = absl::StrCat(field, "[", i, "]");
    if (!std::isfinite(profile[i].first)) {
      return absl::InvalidArgumentError(absl::StrCat(point, ": time must be finite"));
    }
    if (i > 0 && profile[i].first <= profile[i - 1].first) {
      return absl::InvalidArgumentError(
          absl::StrCat(point, ": times must be strictly increasing"));
    }
    if (!std::isfinite(profile[i].second) || profile[i].second < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(point, ": rate must be a non-negative number of bits per second"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateBatch(const Batch& batch) {
  if (!std::isfinite(batch.now_s)) return absl::InvalidArgumentError("now_s: must be finite");
  if (batch.tau_max < 0) return absl::InvalidArgumentError("tau_max: must be >= 0");
  if (batch.server.empty()) return absl::InvalidArgumentError("server: must name a host");
  std::unordered_set<std::string> hosts;
  for (size_t i = 0; i < batch.hosts.size(); ++i) {
    const HostLink& host = batch.hosts[i];
    const std::string field = absl::StrCat("hosts[", i, "]");
    if (host.name.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ".name: empty"));
    if (!hosts.insert(host.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: duplicate host '", host.name, "'"));
    }
    if (host.uplink_profile.empty()) {
      if (auto s = CheckCapacity(field + ".uplink_bps", host.uplink_bps); !s.ok()) return s;
    }
    if (host.downlink_profile.empty()) {
      if (auto s = CheckCapacity(field + ".downlink_bps", host.downlink_bps); !s.ok()) return s;
    }
    if (auto s = CheckProfile(field + ".uplink_profile", host.uplink_profile); !s.ok()) return s;
    if (auto s = CheckProfile(field + ".downlink_profile", host.downlink_profile); !s.ok()) {
      return s;
    }
  }
  if (!hosts.count(batch.server)) {
    return absl::InvalidArgumentError(
        absl::StrCat("server: '", batch.server, "' is not in hosts"));
  }
  for (size_t i = 0; i < batch.aggregators.size(); ++i) {
    if (!hosts.count(batch.aggregators[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "aggregators[", i, "]: '", batch.aggregators[i], "' is not in hosts"));
    }
  }
  std::unordered_set<std::string> ids;
  for (size_t i = 0; i < batch.updates.size(); ++i) {
    const UpdateRequest& u = batch.updates[i];
    const std::string field = absl::StrCat("updates[", i, "]");
    if (u.id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ".id: empty"));
    if (!ids.insert(u.id).second) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".id: duplicate id '", u.id, "'"));
    }
    if (!hosts.count(u.worker)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".worker: '", u.worker, "' is not in hosts"));
    }
    if (u.bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".bytes: must be positive, got ", u.bytes));
    }
    if (!std::isfinite(u.norm) || u.norm < 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".norm: must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace mlfabric::core
