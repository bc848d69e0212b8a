#include "scheduler/core/fifo_planner.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

namespace mlfabric::core {

namespace {

// The lowest rate a direction ever offers: a rate that is safe to hold for
// any duration without exceeding the link's available bandwidth.
double FloorRate(double constant_bps, const std::vector<ProfilePoint>& profile) {
  if (profile.empty()) return constant_bps;
  double floor = std::numeric_limits<double>::infinity();
  for (const auto& point : profile) floor = std::min(floor, point.second);
  return floor;
}

}  // namespace

absl::StatusOr<Plan> FifoPlanner::PlanBatch(const Batch& batch) const {
  if (auto status = ValidateBatch(batch); !status.ok()) return status;
  std::unordered_map<std::string, const HostLink*> hosts;
  for (const HostLink& host : batch.hosts) hosts[host.name] = &host;
  const HostLink& server = *hosts.at(batch.server);
  const double server_down = FloorRate(server.downlink_bps, server.downlink_profile);

  Plan plan;
  double link_free_s = batch.now_s;
  int position = 0;
  for (const UpdateRequest& update : batch.updates) {
    const HostLink& worker = *hosts.at(update.worker);
    const double rate = std::min(FloorRate(worker.uplink_bps, worker.uplink_profile), server_down);
    if (rate <= 0) {
      plan.dropped.push_back({update.id, "no_bandwidth"});
      continue;
    }
    Transfer transfer;
    transfer.update = update.id;
    transfer.src = update.worker;
    transfer.dst = batch.server;
    transfer.kind = TransferKind::kDirect;
    transfer.start_s = link_free_s;
    transfer.end_s = link_free_s + 8.0 * static_cast<double>(update.bytes) / rate;
    transfer.bytes = update.bytes;
    transfer.segments.push_back({transfer.start_s, transfer.end_s, rate});
    link_free_s = transfer.end_s;
    plan.order.push_back(update.id);
    plan.commits.push_back({update.id, transfer.end_s, ++position});
    plan.transfers.push_back(std::move(transfer));
  }
  return plan;
}

}  // namespace mlfabric::core
