#include "scheduler/service/replica_tracker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mlfabric {

double OutstandingNorm(const ClusterState& state, const std::string& job,
                       const std::string& server) {
  double sum = 0;
  for (const auto& [id, update] : state.pushes()) {
    if ((update.replica_punted || update.replica_ahead) && update.job == job &&
        update.server == server) {
      sum += update.norm;
    }
  }
  return sum;
}

double DivergenceEstimate(const ClusterState& state, const JobState& job,
                          const std::string& server_name, const ServerState& server) {
  double sum = OutstandingNorm(state, job.config.name, server_name);
  for (const auto& [copy, norm] : server.replica.in_flight) sum += norm;
  for (const PendingReplica& p : server.replica.pending) sum += p.norm;
  return sum / (1.0 - std::clamp(job.config.momentum, 0.0, 0.999999));
}

size_t StrictReplicaAdmits(const ClusterState& state, const JobState& job,
                           const std::string& server_name, const ServerState& server) {
  const size_t all = server.pending.size();
  const double bound = DivergenceBound(job);
  auto replica = job.replica_hosts.find(server_name);
  if (bound <= 0 || replica == job.replica_hosts.end() || replica->second == server.host ||
      state.AliveHost(replica->second) == nullptr) {
    return all;
  }
  const double weight = 1.0 / (1.0 - std::clamp(job.config.momentum, 0.0, 0.999999));
  double held = DivergenceEstimate(state, job, server_name, server);
  size_t admitted = 0;
  for (uint64_t id : server.pending) {
    auto* record = state.FindPush(id);
    const double norm = record == nullptr ? 0.0 : weight * record->norm;
    const bool nothing_outstanding = held <= 0 && admitted == 0;
    if (!nothing_outstanding && held + norm > bound) break;
    held += norm;
    ++admitted;
  }
  return admitted;
}

std::optional<core::ReplicaSpec> ReplicaSpecFor(ClusterState* state, const JobState& job,
                                                const std::string& server_name,
                                                ServerState* server) {
  auto replica = job.replica_hosts.find(server_name);
  if (replica == job.replica_hosts.end()) return std::nullopt;
  if (state->AliveHost(replica->second) == nullptr || replica->second == server->host) {
    if (!server->replica.pending.empty()) {
      state->DropReplicaPending(server,
                                absl::StrCat("replica host ", replica->second, " is not available"));
    }
    return std::nullopt;
  }
  core::ReplicaSpec spec;
  spec.host = replica->second;
  const double bound = DivergenceBound(job);
  if (bound > 0) {
    const double weight = 1.0 / (1.0 - std::clamp(job.config.momentum, 0.0, 0.999999));
    spec.divergence_bound =
        std::max(0.0, bound - weight * OutstandingNorm(*state, job.config.name, server_name));
  } else {
    spec.divergence_bound = 1e30;  // none: copies go as they can
  }
  spec.momentum = job.config.momentum;
  for (const auto& [copy, norm] : server->replica.in_flight) spec.lead.push_back(norm);
  auto& punted = server->replica.pending;
  punted.erase(std::remove_if(punted.begin(), punted.end(),
                              [&](const PendingReplica& p) {
                                return state->AliveHost(p.src_host) == nullptr;
                              }),
               punted.end());
  for (const PendingReplica& p : punted) {
    core::UpdateRequest request;
    request.id = std::to_string(p.id);
    request.worker = p.src_host;
    request.bytes = p.bytes;
    request.version = p.version;
    request.norm = p.norm;
    spec.pending.push_back(std::move(request));
  }
  return spec;
}

void AllowReplicaAggregation(const ClusterState& state, const ServerState& server,
                             const std::vector<std::string>& aggregators, bool pending_only,
                             core::ReplicaSpec* spec) {
  if (aggregators.empty()) return;
  std::vector<std::pair<int64_t, v1::DType>> copies;
  for (const PendingReplica& p : server.replica.pending) copies.emplace_back(p.bytes, p.dtype);
  if (!pending_only) {
    for (uint64_t id : server.pending) {
      if (auto* record = state.FindPush(id)) {
        copies.emplace_back(record->bytes, record->dtype);
      }
    }
  }
  if (copies.size() < 2) return;
  for (const auto& [bytes, dtype] : copies) {
    if ((dtype != v1::DTYPE_FLOAT32 && dtype != v1::DTYPE_FLOAT64) || dtype != copies[0].second ||
        bytes != copies[0].first) {
      return;
    }
  }
  spec->aggregators = aggregators;
  spec->aggregate_pending_only = pending_only;
}

}  // namespace mlfabric
