#include "scheduler/service/round_grants.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "scheduler/service/commands.h"

namespace mlfabric {

namespace {

// Whether `now` lies within `fraction` of `then` (a capacity the plan saw).
bool Within(double now, double then, double fraction) {
  return then > 0 && std::abs(now - then) <= fraction * then;
}

}  // namespace

bool GrantsAllowed(const SchedulerConfig& config, const JobState& job,
                   const std::string& server_name, const ServerState& server) {
  return config.round_grants && RoundSize(job, server) > 0 && server.shards.empty() &&
         server.group.empty() && !server.plan_on_arrival && server.backup_workers == 0 &&
         job.config.backup_workers == 0 && job.replica_hosts.count(server_name) == 0;
}

std::optional<v1::RoundGrant> IssueRoundGrant(ClusterState* state, const SchedulerConfig& config,
                                              const JobState& job, const std::string& server_name,
                                              ServerState* server, const UpdateRecord& record,
                                              double rate_bps, const std::string& dst_address,
                                              const IssuedGrant* planned) {
  server->grants.erase(record.worker);
  if (!GrantsAllowed(config, job, server_name, *server) || !record.round_member ||
      !(rate_bps > 0) || !std::isfinite(rate_bps)) {
    return std::nullopt;
  }
  const HostState* src = state->AliveHost(record.src_host);
  const HostState* dst = state->AliveHost(server->host);
  if (src == nullptr || dst == nullptr || dst->draining) return std::nullopt;
  IssuedGrant grant;
  if (planned != nullptr) {
    // The plan reused once more: only while the network and the membership
    // are still the ones it was made for.
    if (planned->generation != job.membership.generation() ||
        !Within(src->uplink_bps, planned->src_uplink_bps, config.round_grant_change) ||
        !Within(dst->downlink_bps, planned->dst_downlink_bps, config.round_grant_change)) {
      return std::nullopt;
    }
    grant = *planned;
  } else {
    grant.generation = job.membership.generation();
    grant.src_uplink_bps = src->uplink_bps;
    grant.dst_downlink_bps = dst->downlink_bps;
    grant.rate_bps = rate_bps;
  }
  grant.transfer_id = state->NewTransferId();
  grant.round = record.version + 1;
  grant.bytes = record.bytes;
  grant.src_host = record.src_host;
  server->grants[record.worker] = grant;
  ++state->stats.round_grants;
  v1::RoundGrant out;
  out.set_transfer_id(grant.transfer_id);
  out.set_round(grant.round);
  out.set_bytes(grant.bytes);
  out.set_rate_bps(grant.rate_bps);
  out.set_dst_host(server->host);
  out.set_dst_address(dst_address);
  return out;
}

bool TakeRoundGrant(ServerState* server, const v1::SubmitUpdateRequest& request,
                    IssuedGrant* grant, std::string* why) {
  const uint64_t id = request.granted_transfer_id();
  auto it = server->grants.find(request.worker());
  if (it == server->grants.end() || it->second.transfer_id != id) {
    *why = absl::StrCat("it was sent on grant ", id,
                        ", which this scheduler did not give to worker '", request.worker(),
                        "' (a scheduler that restarted, or a grant given again since)");
    return false;
  }
  const IssuedGrant& held = it->second;
  if (held.round != request.version() || held.bytes != request.bytes() ||
      held.src_host != request.src_host()) {
    *why = absl::StrCat("it was sent on grant ", id, ", which is for round ", held.round, ", ",
                        held.bytes, " bytes from host '", held.src_host, "', not round ",
                        request.version(), ", ", request.bytes(), " bytes from '",
                        request.src_host(), "'");
    server->grants.erase(it);
    return false;
  }
  *grant = held;
  server->grants.erase(it);
  return true;
}

std::optional<v1::RoundGrant> DispatchGranted(ClusterState* state, const SchedulerConfig& config,
                                              const JobState& job, const std::string& server_name,
                                              ServerState* server, UpdateRecord* record,
                                              const IssuedGrant& grant, double now_s) {
  record->state = UpdateState::kInFlight;
  record->sequence = server->next_sequence++;
  ++server->in_flight;
  const double end_s = now_s + 8.0 * static_cast<double>(record->bytes) / grant.rate_bps;
  TransferView& planned = record->planned;
  planned.transfer_id = record->transfer_id;
  planned.job = record->job;
  planned.server = server_name;
  planned.src = record->src_host;
  planned.dst = server->host;
  planned.bytes = record->bytes;
  planned.start_s = now_s;
  planned.end_s = end_s;
  // As a planned round member's (PlanDispatcher): applied once the whole
  // round is in.
  planned.deadline_s = end_s + config.transfer_slack_s + config.round_timeout_s;
  planned.planned_at_s = now_s;
  planned.segments = {{now_s, end_s, grant.rate_bps}};

  const auto round = server->rounds.find(record->version);
  commands::Expect expect;
  expect.transfer_id = record->transfer_id;
  expect.job_id = job.id;
  expect.server = server_name;
  expect.sequence = record->sequence;
  expect.bytes = record->bytes;
  expect.src_host = record->src_host;
  expect.worker = record->worker;
  expect.version = record->version;
  expect.norm = record->norm;
  expect.dtype = record->dtype;
  expect.round_size = round != server->rounds.end() && round->second.size > 0
                          ? round->second.size
                          : RoundSize(job, *server);
  expect.contributions = 1;
  state->Enqueue(server->host, commands::ExpectDelivery(expect));
  ++state->stats.planned;
  ++state->stats.granted_pushes;
  const HostState* dst = state->AliveHost(server->host);
  return IssueRoundGrant(state, config, job, server_name, server, *record, grant.rate_bps,
                         dst != nullptr ? dst->data_address : "", &grant);
}

void DiscardGranted(ClusterState* state, const ServerState& server,
                    const std::string& server_name, uint64_t transfer_id,
                    const std::string& reason) {
  if (state->AliveHost(server.host) == nullptr) return;  // its bytes went with it
  state->Enqueue(server.host, commands::DiscardGranted(transfer_id, server_name, reason));
}

}  // namespace mlfabric
