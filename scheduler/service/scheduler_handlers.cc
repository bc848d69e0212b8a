// SchedulerService: the control-plane handlers (proto/scheduler.proto),
// each validating its request, naming what is wrong, and changing the
// cluster state under the service's lock.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "scheduler/core/distribution.h"
#include "scheduler/core/network.h"
#include "common/logging.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "scheduler/service/scheduler_service.h"

#include "scheduler/service/failover.h"
#include "scheduler/service/in_doubt.h"
#include "scheduler/service/replica_sync.h"
#include "scheduler/service/round_grants.h"
#include "scheduler/service/round_tracker.h"
#include "scheduler/service/server_groups.h"

namespace mlfabric {
namespace {

// Link rates a host may register or report, as for default_link_bps
// (scheduler_config.cc): a rate near zero (a denormal passes "finite and
// positive") plans a transfer to end at infinity, and the daemon is sent a
// segment it cannot pace.
constexpr double kMinLinkBps = 1e3;
constexpr double kMaxLinkBps = 1e13;

// ReportCompletion for a transfer towards a replica: a punted copy on its
// way to the replica's aggregator, or a replica copy. False: neither.
bool EndReplicaTransfer(ClusterState* state, const v1::CompletionReport& request) {
  // A punted copy on its way to the replica's aggregator reports only
  // when it fails to move; the aggregate fails with it.
  if (std::optional<uint64_t> aggregate =
          state->replicas().AggregateFed(request.transfer_id())) {
    if (!request.applied()) {
      state->EndReplicaCopy(*aggregate, /*applied=*/false,
                            absl::StrCat("its punted copy ", request.transfer_id(),
                                         " failed to reach the aggregator",
                                         request.error().empty() ? "" : ": ", request.error()),
                            0);
    }
    return true;
  }
  if (state->replicas().HasCopy(request.transfer_id())) {
    state->EndReplicaCopy(request.transfer_id(), request.applied(),
                          request.error().empty() ? "replica copy failed" : request.error(),
                          request.model_version());
    return true;
  }
  return false;
}

// ReportCompletion for a hop of a streaming chain. False: it is none.
bool EndChainHop(ClusterState* state, const v1::CompletionReport& request) {
  // A streaming chain's partial sum reports only when it fails to move.
  const std::optional<uint64_t> aggregate_id =
      state->aggregates().AggregateOfHop(request.transfer_id());
  if (!aggregate_id.has_value()) return false;
  if (!request.applied()) {
    // Named by the host that sends it (the receiver may know only an address).
    std::string from;
    if (const AggregateRecord* aggregate = state->aggregates().Find(*aggregate_id)) {
      for (const AggregateRecord::Hop& hop : aggregate->hops) {
        if (hop.id == request.transfer_id()) from = hop.host;
      }
    }
    state->FailAggregate(
        *aggregate_id,
        absl::StrCat("its chain's partial sum ", request.transfer_id(),
                     from.empty() ? "" : absl::StrCat(" from ", from), " failed",
                     request.error().empty() ? "" : absl::StrCat(": ", request.error())));
  }
  return true;
}

// ReportCompletion for an aggregate: its constituents are applied, or the
// aggregate fails. False: it is none.
bool EndAggregate(ClusterState* state, const v1::CompletionReport& request) {
  AggregateRecord* aggregate = state->aggregates().Find(request.transfer_id());
  if (aggregate == nullptr) return false;
  if (!request.applied()) {
    // Skipped at the server as asked (FailAggregateWhenCancelled): it
    // fails for the first reason.
    const std::string asked = aggregate->cancel_pending;  // FailAggregate forgets it
    state->FailAggregate(request.transfer_id(), !asked.empty()            ? asked
                                                : request.error().empty() ? "aggregate failed"
                                                                          : request.error());
    return true;
  }
  const std::vector<uint64_t> constituents = aggregate->constituents;
  state->aggregates().ForgetHops(request.transfer_id());
  bool in_round = false;
  if (JobState* job = state->FindJob(aggregate->job)) {
    ServerState& server = job->servers[aggregate->server];
    server.model_version = std::max(server.model_version, request.model_version());
    in_round = RoundSize(*job, server) > 0;
  }
  // The server applied the constituents as consecutive versions ending at
  // model_version, in commit order; a synchronous round's members all
  // land in the one version the round produced. (Taken out after: each
  // Complete reads when the aggregate was planned to reach the server.)
  const int64_t n = static_cast<int64_t>(constituents.size());
  for (int64_t i = 0; i < n; ++i) {
    state->Complete(constituents[i], v1::OUTCOME_APPLIED, "",
                    in_round ? request.model_version()
                             : request.model_version() - (n - 1 - i));
  }
  state->aggregates().Take(request.transfer_id());
  return true;
}

// SubmitUpdate: the push's own fields (its type, size, version, norm and
// tensors).
absl::Status CheckPushFields(const v1::SubmitUpdateRequest& request, int64_t max_update_bytes) {
  if (!v1::DType_IsValid(request.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype: unknown element type ", request.dtype()));
  }
  if (request.bytes() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes: must be positive, got ", request.bytes()));
  }
  if (request.bytes() > max_update_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes: ", request.bytes(), " exceeds max_update_bytes (", max_update_bytes, ")"));
  }
  if (request.version() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("version: must be >= 0, got ", request.version()));
  }
  if (!std::isfinite(request.norm()) || request.norm() < 0) {
    return absl::InvalidArgumentError("norm: must be finite and >= 0");
  }
  if (request.has_shape()) {
    if (request.shape().dims_size() > kMaxShapeDims) {
      return absl::InvalidArgumentError(absl::StrCat("shape: ", request.shape().dims_size(),
                                                     " dimensions, more than ", kMaxShapeDims));
    }
    for (int64_t dim : request.shape().dims()) {
      if (dim < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shape: [", absl::StrJoin(request.shape().dims(), ", "), "] has a negative dimension"));
      }
    }
  }
  if (request.tensors_size() > 0) {
    uint64_t total = 0;
    for (const auto& tensor : request.tensors()) total += tensor.bytes();
    if (total != static_cast<uint64_t>(request.bytes())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors: sizes add up to ", total, " bytes, not ", request.bytes()));
    }
  }
  return absl::OkStatus();
}

// SubmitUpdate: the pushing host is registered and not drained.
absl::Status CheckPushSource(const ClusterState& state, const v1::SubmitUpdateRequest& request) {
  const HostState* src = state.AliveHost(request.src_host());
  if (src == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("src_host '", request.src_host(), "' is not registered"));
  }
  if (src->draining) {
    return absl::UnavailableError(absl::StrCat(
        "src_host '", request.src_host(), "' is drained by an operator; it takes no new pushes"));
  }
  return absl::OkStatus();
}

// PlanDistribution: `host`'s links as the planner sees them, its rates
// less what the scheduled transfers have reserved from `now_s` on.
core::HostLink ResidualHostLink(const std::string& name, const HostState& host, double now_s,
                                const std::map<std::string, std::vector<core::RateSegment>>& up,
                                const std::map<std::string, std::vector<core::RateSegment>>& down) {
  core::HostLink l{name, host.uplink_bps, host.downlink_bps, {}, {}};
  if (auto it = up.find(name); it != up.end()) {
    l.uplink_profile = core::ResidualProfile(host.uplink_bps, now_s, it->second);
  }
  if (auto it = down.find(name); it != down.end()) {
    l.downlink_profile = core::ResidualProfile(host.downlink_bps, now_s, it->second);
  }
  return l;
}

// PlanDistribution: a route per requester (via a forwarding requester, with
// its address, or from the server) and the plan's figures.
void FillDistributionReply(const core::DistributionPlan& plan,
                           const core::DistributionRequest& plan_in,
                           const std::map<std::string, std::string>& addresses,
                           v1::PlanDistributionReply* reply) {
  for (const core::Delivery& delivery : plan.deliveries) {
    v1::DistributionRoute* route = reply->add_routes();
    route->set_host(delivery.host);
    if (delivery.via != plan_in.server) {
      route->set_via_host(delivery.via);
      auto address = addresses.find(delivery.via);
      route->set_via_address(address == addresses.end() ? std::string() : address->second);
    }
    route->set_rate_bps(delivery.rate_bps);
    route->set_uplink_bps(delivery.uplink_bps);
    route->set_children(delivery.children);
  }
  reply->set_copy_bps(plan.copy_bps);
  reply->set_server_bound(plan.server_bound);
  reply->set_server_copies(plan.direct + plan.distributors_used);
  reply->set_total_s(plan.total_s - plan_in.now_s);
}

}  // namespace

absl::Status SchedulerService::RegisterHost(const v1::RegisterHostRequest& request,
                                            v1::RegisterHostReply* reply) {
  if (request.protocol_version() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("protocol_version ", request.protocol_version(),
                                                   " is not supported; this scheduler speaks version 1"));
  }
  if (request.host().empty()) return absl::InvalidArgumentError("host: must name the host");
  if (request.data_address().empty()) {
    return absl::InvalidArgumentError("data_address: must be ip:port");
  }
  for (const auto& [field, bps] : {std::pair{"uplink_bps", request.uplink_bps()},
                                   std::pair{"downlink_bps", request.downlink_bps()}}) {
    if (bps != 0 && !(bps >= kMinLinkBps && bps <= kMaxLinkBps)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", bps, " is out of range [", kMinLinkBps, ", ", kMaxLinkBps,
          "] (0 = the scheduler's default_link_bps)"));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (state_.AliveHost(request.host()) != nullptr) {
    FailOverServersOn(&state_, request.host(), "host re-registered (daemon restarted)");
    state_.MarkHostDown(request.host(), "host re-registered (daemon restarted)");
    MembersOnHostLeft(&state_, request.host(), "host re-registered (daemon restarted)");
  }
  HostState& host = state_.hosts().Register(request.host());
  host.data_address = request.data_address();
  host.capacity_up_bps =
      request.uplink_bps() > 0 ? request.uplink_bps() : config_.default_link_bps;
  host.capacity_down_bps =
      request.downlink_bps() > 0 ? request.downlink_bps() : config_.default_link_bps;
  host.uplink_bps = host.capacity_up_bps;
  host.downlink_bps = host.capacity_down_bps;
  host.last_report_s = -1;
  host.incarnation = state_.NewIncarnation();
  host.session_token = ControlAuth::NewSessionToken();
  host.alive = true;
  outbox_.Open(request.host(), host.incarnation);
  // An aggregator of a job gets its data key now: a constituent's sender
  // may prove the job to it before the task reaches it.
  for (const auto& [job_name, job] : state_.jobs()) {
    const auto& aggregators = job.config.aggregators;
    if (std::find(aggregators.begin(), aggregators.end(), request.host()) != aggregators.end()) {
      outbox_.EnsureJobKey(request.host(), job.id);
    }
  }
  // What it held when its stream broke (in_doubt.h).
  AcceptHostReport(&state_, request);
  ResolveInDoubt(&state_, config_.in_doubt_wait_s);
  reply->set_incarnation(host.incarnation);
  reply->set_session_token(host.session_token);
  reply->set_data_key(auth_.data_key());
  reply->set_data_encryption(auth_.data_encryption());
  reply->set_scheduler_time_s(clock_->NowSeconds());
  reply->set_scheduler_epoch(state_.epoch());
  MLF_LOG(INFO) << "host " << request.host() << " registered at " << host.data_address
                << " (incarnation " << host.incarnation << ")";
  return absl::OkStatus();
}

absl::Status SchedulerService::RegisterEntity(const v1::RegisterEntityRequest& request,
                                              v1::RegisterEntityReply* reply) {
  std::lock_guard<std::mutex> lock(mu_);
  JobState* job = state_.FindJob(request.job());
  if (job == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown job '", request.job(), "'; jobs are declared in the scheduler's config"));
  }
  if (!ConstantTimeEquals(request.job_token(), job->config.token)) {
    return absl::PermissionDeniedError(
        absl::StrCat("wrong token for job '", request.job(), "'"));
  }
  if (state_.AliveHost(request.host()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("host '", request.host(), "' is not registered"));
  }
  if (request.name().empty()) return absl::InvalidArgumentError("name: must not be empty");
  if (!job->config.user.empty() && request.app_user() != job->config.user) {
    return absl::PermissionDeniedError(absl::StrCat(
        "job '", request.job(), "' admits applications of user '", job->config.user,
        "' only; this one runs as '", request.app_user(), "' (uid ", request.app_uid(),
        ") on host ", request.host()));
  }
  reply->set_job_id(job->id);
  reply->set_job_data_key(auth_.JobDataKey(job->id));
  reply->set_ssp(job->config.mode == JobMode::kSsp);
  reply->set_staleness(job->config.staleness_k);
  switch (request.role()) {
    case v1::ROLE_SERVER:
      return RegisterServerLocked(job, request, reply);
    case v1::ROLE_WORKER:
      return RegisterWorkerLocked(job, request);
    case v1::ROLE_REPLICA:
      RegisterReplicaLocked(job, request);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError("role: must be ROLE_WORKER, ROLE_SERVER or ROLE_REPLICA");
  }
}

absl::Status SchedulerService::RegisterServerLocked(JobState* job,
                                                    const v1::RegisterEntityRequest& request,
                                                    v1::RegisterEntityReply* reply) {
  for (const auto& [other_name, other] : state_.jobs()) {
    if (&other != job && other.servers.count(request.name()) &&
        other.servers.at(request.name()).host == request.host()) {
      MLF_LOG(INFO) << "server name '" << request.name() << "' on " << request.host()
                    << " is used by jobs '" << other_name << "' and '" << request.job()
                    << "'; they stay separate";
    }
  }
  if (request.round_size() < 0 || request.round_size() > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("round_size ", request.round_size(),
                                                   " is out of range [0, 65536]"));
  }
  if (request.backup_workers() < 0 ||
      (request.backup_workers() > 0 && request.backup_workers() >= request.round_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backup_workers ", request.backup_workers(), " must be in [0, round_size ",
        request.round_size(), ") (a round needs at least one push)"));
  }
  if (auto known = job->servers.find(request.name());
      known != job->servers.end() && known->second.host != request.host() &&
      !job->failovers.empty() && state_.AliveHost(known->second.host) != nullptr) {
    // Its replica took over (failover.h): the model it serves is the
    // job's now, and an old server coming back must not replace it.
    return absl::FailedPreconditionError(absl::StrCat(
        "server '", request.name(), "' of job '", request.job(), "' failed over to host ",
        known->second.host, " and is served from there; register as its replica "
        "(RegisterAsReplica) to stand by again"));
  }
  RETURN_IF_ERROR(RegisterServerOfGroups(&state_, job, request));  // server_groups.h
  ServerState& server = job->servers[request.name()];
  server.host = request.host();
  // Registering again with a restarted scheduler: its rounds go on from
  // the version its daemon last saw.
  server.model_version = std::max(server.model_version, request.model_version());
  server.round_size = request.round_size();
  if (request.model_version() > 0 && RoundSize(*job, server) > 0 &&
      server.rounds.count(request.model_version()) == 0) {
    // The round that may have been in progress when the old scheduler
    // died was planned by it alone: it fails, with the reason, so that
    // no worker's get waits for it (its daemon spares a round it has
    // handed to the application already).
    state_.FailRound(request.job(), request.name(), request.model_version(),
                     "the scheduler restarted during the round; the next round goes on");
  }
  server.backup_workers = request.backup_workers();
  server.plan_on_arrival = request.plan_on_arrival() && request.round_size() == 0;
  if (WantReplicaSnapshot(&state_, job, request.name(), false)) loop_.Wake();
  servers_cv_.notify_all();
  ResolveInDoubt(&state_, config_.in_doubt_wait_s);  // its pushes in doubt are decided
  reply->set_model_version(server.model_version);
  MLF_LOG(INFO) << "job " << request.job() << ": server " << request.name() << " on "
                << request.host() << ShardText(request.shard());
  return absl::OkStatus();
}

absl::Status SchedulerService::RegisterWorkerLocked(JobState* job,
                                                    const v1::RegisterEntityRequest& request) {
  if (request.delay_bound() < -1) {
    return absl::InvalidArgumentError(absl::StrCat("delay_bound ", request.delay_bound(),
                                                   " is negative (-1 = the job's)"));
  }
  if (request.delay_bound() >= 0) {
    RETURN_IF_ERROR(ValidateDelayBound("delay_bound", request.delay_bound()));
  }
  if (!std::isfinite(request.divergence_bound())) {
    return absl::InvalidArgumentError("divergence_bound: must be finite");
  }
  WorkerInfo& worker = job->workers[request.name()];
  worker.host = request.host();
  worker.delay_bound = request.delay_bound();
  worker.divergence_bound = request.divergence_bound() > 0 ? request.divergence_bound() : -1;
  MemberJoined(&state_, request.job(), request.name(), request.host());  // round_tracker.h
  MLF_LOG(INFO) << "job " << request.job() << ": worker " << request.name() << " on "
                << request.host()
                << (worker.delay_bound >= 0
                        ? absl::StrCat(" (delay bound ", worker.delay_bound, ")")
                        : std::string());
  return absl::OkStatus();
}

void SchedulerService::RegisterReplicaLocked(JobState* job,
                                             const v1::RegisterEntityRequest& request) {
  // A replica names the server it shadows (§5.3); one per server. One
  // that installs snapshots starts from the server's model
  // (replica_sync.h).
  job->replica_hosts[request.name()] = request.host();
  if (request.installs_snapshots()) {
    job->snapshot_replicas.insert(request.name());
  } else {
    job->snapshot_replicas.erase(request.name());
  }
  if (WantReplicaSnapshot(&state_, job, request.name(), true)) loop_.Wake();
  MLF_LOG(INFO) << "job " << request.job() << ": " << v1::Role_Name(request.role()) << " "
                << request.name() << " on " << request.host()
                << (request.installs_snapshots() ? " (starts from a snapshot)" : "");
}

absl::Status SchedulerService::SubmitUpdate(const v1::SubmitUpdateRequest& request,
                                            v1::SubmitUpdateReply* reply) {
  std::unique_lock<std::mutex> lock(mu_);
  auto reject = [&](absl::Status status) {
    ++state_.stats.rejected;
    MLF_LOG(WARNING) << "rejected push from " << request.src_host() << ": " << status.message();
    DiscardRefusedGrantLocked(request, std::string(status.message()));
    return status;
  };
  JobState* job = state_.FindJob(request.job());
  if (job == nullptr) {
    return reject(absl::InvalidArgumentError(absl::StrCat("unknown job '", request.job(), "'")));
  }
  if (absl::Status fields = CheckPushFields(request, config_.max_update_bytes); !fields.ok()) {
    return reject(fields);
  }
  if (absl::Status src = CheckPushSource(state_, request); !src.ok()) return reject(src);
  absl::StatusOr<ServerState*> server = WaitForPushServerLocked(&lock, job, request);
  if (!server.ok()) return reject(server.status());
  if (absl::Status ready = CheckPushServerLocked(&lock, job, request, *server); !ready.ok()) {
    return reject(ready);
  }
  if (MemberSizedRounds(*job, **server) && job->workers.count(request.worker()) > 0 &&
      !job->membership.Contains(request.worker())) {
    // Its rounds are sized without it now: a push would take a member's place.
    return reject(absl::FailedPreconditionError(absl::StrCat(
        "worker '", request.worker(), "' is no member of job '", request.job(), "' (it left: ",
        job->membership.WhyLeft(request.worker()), "); register it again to rejoin")));
  }
  AcceptPushLocked(job, *server, request, reply);
  return absl::OkStatus();
}

absl::StatusOr<ServerState*> SchedulerService::WaitForPushServerLocked(
    std::unique_lock<std::mutex>* lock, JobState* job, const v1::SubmitUpdateRequest& request) {
  // The job owning `server` if it is another job's, else "".
  auto owner_elsewhere = [&]() -> std::string {
    for (const auto& [other_name, other] : state_.jobs()) {
      if (other_name != request.job() && other.servers.count(request.server())) return other_name;
    }
    return "";
  };
  auto server = job->servers.find(request.server());
  if (server == job->servers.end() && owner_elsewhere().empty() && config_.server_wait_s > 0) {
    // Workers often start before their server: give it a moment to register.
    ++state_.stats.server_waits;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(config_.server_wait_s));
    servers_cv_.wait_until(*lock, deadline, [&] {
      return stopping_ || job->servers.count(request.server()) > 0;
    });
    server = job->servers.find(request.server());
    if (state_.AliveHost(request.src_host()) == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("src_host '", request.src_host(), "' went down while waiting for server '",
                       request.server(), "'"));
    }
  }
  if (server == job->servers.end()) {
    if (const std::string owner = owner_elsewhere(); !owner.empty()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "server '", request.server(), "' belongs to job '", owner, "', not to job '",
          request.job(), "': a job's pushes may only go to its own servers"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("server '", request.server(), "' of job '", request.job(),
                     "' is not registered (waited ", config_.server_wait_s,
                     " s; see server_wait_s)"));
  }
  return &server->second;
}

absl::Status SchedulerService::CheckPushServerLocked(std::unique_lock<std::mutex>* lock,
                                                     JobState* job,
                                                     const v1::SubmitUpdateRequest& request,
                                                     ServerState* server) {
  if (!server->shards.empty() && config_.server_wait_s > 0) {
    // A server group whose shards are still registering: as for a server.
    servers_cv_.wait_for(*lock, std::chrono::duration<double>(config_.server_wait_s), [&] {
      return stopping_ || GroupIncomplete(state_, *job, *server).empty();
    });
  }
  RETURN_IF_ERROR(CheckGroupPush(state_, *job, request.server(), *server,
                                 request.bytes()));  // server_groups.h
  const HostState* server_host = state_.AliveHost(server->host);
  if (server_host == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "server '", request.server(), "' is down (host '", server->host, "')"));
  }
  if (server_host->draining) {
    return absl::UnavailableError(
        absl::StrCat("server '", request.server(), "' is on host '", server->host,
                     "', which an operator drained; no new pushes"));
  }
  return absl::OkStatus();
}

void SchedulerService::DiscardRefusedGrantLocked(const v1::SubmitUpdateRequest& request,
                                                 const std::string& why) {
  if (request.granted_transfer_id() == 0) return;
  // Its bytes left on a grant: the root's daemon must not keep them.
  const JobState* job = state_.FindJob(request.job());
  if (job == nullptr) return;
  auto server = job->servers.find(request.server());
  if (server == job->servers.end()) return;
  DiscardGranted(&state_, server->second, request.server(), request.granted_transfer_id(),
                 absl::StrCat("its push was refused: ", why));
}

void SchedulerService::AcceptPushLocked(JobState* job, ServerState* server,
                                        const v1::SubmitUpdateRequest& request,
                                        v1::SubmitUpdateReply* reply) {
  // A push sent on a grant (round_grants.h) keeps the transfer id its bytes
  // carry, unless another push has it.
  const uint64_t granted = request.granted_transfer_id();
  IssuedGrant grant;
  std::string refused;
  const bool on_grant = granted != 0 && TakeRoundGrant(server, request, &grant, &refused);
  UpdateRecord record;
  record.transfer_id =
      granted != 0 && state_.FindPush(granted) == nullptr ? granted : state_.NewTransferId();
  record.job = request.job();
  record.server = request.server();
  record.src_host = request.src_host();
  record.worker = request.worker();
  record.local_id = request.local_id();
  record.bytes = request.bytes();
  record.version = request.version();
  record.norm = request.norm();
  record.dtype = request.dtype();
  record.submitted_s = clock_->NowSeconds();
  record.push_uid = request.push_uid();
  if (request.has_shape()) {
    record.shape.emplace(request.shape().dims().begin(), request.shape().dims().end());
  }
  state_.outcomes().RememberUid(record.push_uid, record.transfer_id, record.job, record.worker);
  state_.stragglers.OnPush(record.job, record.worker, record.submitted_s);
  if (job->config.mode == JobMode::kSsp) clocks_cv_.notify_all();
  reply->set_transfer_id(record.transfer_id);
  const uint64_t id = record.transfer_id;
  const int64_t round = record.version;
  if (granted != 0) {
    AcceptGrantedPushLocked(job, server, std::move(record), granted, on_grant ? &grant : nullptr,
                            refused, reply);
    return;
  }
  server->pending.push_back(id);
  state_.AddPush(std::move(record));
  OpenRound(*job, server, round);  // round_tracker.h: its size and generation
  // A synchronous round is planned as soon as all its pushes are in, not at
  // the next batch tick: an AllReduce then costs a plan, not up to a batch
  // interval; so is a push to a server registered to plan on arrival (an
  // Alltoall's exchange server). Other asynchronous pushes keep batching.
  const bool complete = RoundComplete(*job, *server, round) || server->plan_on_arrival;
  MLF_LOG(DEBUG) << "push " << reply->transfer_id() << " (local id " << request.local_id()
                 << ") from " << request.src_host() << " for round " << round << " at "
                 << absl::StrFormat("%.6f", clock_->NowSeconds())
                 << (complete ? ": planning now" : "");
  if (complete) loop_.Wake();
}

void SchedulerService::AcceptGrantedPushLocked(JobState* job, ServerState* server,
                                               UpdateRecord record, uint64_t sent_as,
                                               const IssuedGrant* grant,
                                               const std::string& refused,
                                               v1::SubmitUpdateReply* reply) {
  const uint64_t id = record.transfer_id;
  const uint64_t local_id = record.local_id;
  const std::string server_name = record.server, src_host = record.src_host;
  const int64_t round = record.version;
  state_.AddPush(std::move(record));
  if (grant == nullptr) {
    // Its bytes are on their way already, and nothing planned them.
    MLF_LOG(WARNING) << "push " << id << " from " << src_host << " failed: " << refused;
    DiscardGranted(&state_, *server, server_name, sent_as, refused);
    state_.Complete(id, v1::OUTCOME_FAILED, absl::StrCat("push not accepted: ", refused), 0);
    return;
  }
  OpenRound(*job, server, round);  // round_tracker.h
  UpdateRecord* admitted = state_.FindPush(id);
  if (!AdmitToRound(&state_, server, RoundSize(*job, *server), admitted)) {
    // Ended (dropped or failed, with why) before its root heard of it.
    DiscardGranted(&state_, *server, server_name, sent_as,
                   "its push ended before it was announced here");
    return;
  }
  const double now_s = clock_->NowSeconds();
  if (std::optional<v1::RoundGrant> next =
          DispatchGranted(&state_, config_, *job, server_name, server, admitted, *grant, now_s)) {
    *reply->mutable_next_round() = *std::move(next);
  }
  MLF_LOG(DEBUG) << "push " << id << " (local id " << local_id << ") from " << src_host
                 << " for round " << round << " at " << absl::StrFormat("%.6f", now_s)
                 << ": sent on its grant, announced";
  // Members still waiting to be planned complete the round now.
  if (!server->pending.empty() && RoundComplete(*job, *server, round)) loop_.Wake();
}

bool SchedulerService::RoundComplete(const JobState& job, const ServerState& server,
                                     int64_t round) const {
  int32_t round_size = RoundSize(job, server);
  if (round_size <= 0) return false;
  size_t members = 0;
  if (auto known = server.rounds.find(round); known != server.rounds.end()) {
    members = known->second.workers.size();
    if (known->second.size > 0) round_size = known->second.size;  // sized when it opened
  }
  for (uint64_t id : server.pending) {
    auto* it = state_.FindPush(id);
    if (it != nullptr && it->version == round) ++members;
  }
  return members >= static_cast<size_t>(round_size);
}

absl::Status SchedulerService::BeginStream(const std::string& host_name, uint64_t incarnation) {
  std::lock_guard<std::mutex> lock(mu_);
  const HostState* host = state_.hosts().Find(host_name);
  if (host == nullptr || host->incarnation != incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("host '", host_name, "' must RegisterHost before streaming schedules"));
  }
  return absl::OkStatus();
}

void SchedulerService::EndStream(const std::string& host_name, uint64_t incarnation,
                                 const std::string& reason) {
  if (reason.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  const HostState* host = state_.hosts().Find(host_name);
  if (host != nullptr && host->incarnation == incarnation && !stopping_) {
    FailOverServersOn(&state_, host_name, reason);
    state_.MarkHostDown(host_name, reason);
    MembersOnHostLeft(&state_, host_name, reason);  // round_tracker.h
    loop_.Wake();  // a round its workers held back may be complete now
    clocks_cv_.notify_all();  // its workers no longer hold back an ssp job
  }
}

std::pair<std::string, int64_t> SchedulerService::SlowestWorkerLocked(
    const std::string& job_name, const JobState& job) const {
  std::pair<std::string, int64_t> slowest{"", -1};
  // Only live members: a worker that left (its host died, or its
  // application disconnected from a daemon that lives on) holds no one back.
  for (const std::string& name : job.membership.members()) {
    const WorkerInfo* info = FindOrNull(job.workers, name);
    if (info == nullptr || state_.AliveHost(info->host) == nullptr) continue;
    const int64_t clock = state_.stragglers.Iterations(job_name, name);
    if (slowest.second < 0 || clock < slowest.second) slowest = {name, clock};
  }
  return slowest;
}

absl::Status SchedulerService::AwaitClock(const v1::AwaitClockRequest& request,
                                          v1::AwaitClockReply* reply) {
  std::unique_lock<std::mutex> lock(mu_);
  const JobState* job = state_.FindJob(request.job());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("unknown job '", request.job(), "'"));
  const int64_t clock = state_.stragglers.Iterations(request.job(), request.worker());
  reply->set_clock(clock);
  if (job->config.mode != JobMode::kSsp) return absl::OkStatus();
  const auto started = std::chrono::steady_clock::now();
  const auto deadline = started + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(config_.ssp_max_wait_s));
  const auto key = std::make_pair(request.job(), request.worker());
  bool waited = false, timed_out = false;
  std::pair<std::string, int64_t> slowest;
  while (true) {
    job = state_.FindJob(request.job());
    slowest = SlowestWorkerLocked(request.job(), *job);
    // Within K of the slowest (or no live worker to wait for): go ahead.
    if (slowest.second < 0 || clock - slowest.second <= job->config.staleness_k || stopping_) {
      break;
    }
    if (!waited) {
      waited = true;
      ++ssp_wait_counts_[request.job()].first;
    }
    ssp_waiting_[key] = {request.worker(), clock, slowest.second, slowest.first,
                         clock_->NowSeconds()};
    if (clocks_cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
        std::chrono::steady_clock::now() >= deadline) {
      timed_out = true;
      ++ssp_wait_counts_[request.job()].second;
      MLF_LOG(WARNING) << "ssp: worker " << request.worker() << " of job " << request.job()
                       << " (clock " << clock << ") waited " << config_.ssp_max_wait_s
                       << " s for worker " << slowest.first << " (clock " << slowest.second
                       << ", K " << job->config.staleness_k << "); its get goes ahead";
      break;
    }
  }
  ssp_waiting_.erase(key);
  reply->set_slowest_clock(slowest.second);
  reply->set_slowest_worker(slowest.first);
  reply->set_waited_s(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  reply->set_timed_out(timed_out);
  return absl::OkStatus();
}

absl::Status SchedulerService::ReportCompletions(const v1::CompletionReports& request,
                                                 v1::CompletionAcks* reply) {
  if (request.reports_size() > kMaxCompletionReports) {
    return absl::InvalidArgumentError(absl::StrCat("reports: ", request.reports_size(),
                                                   " in one call, at most ",
                                                   kMaxCompletionReports));
  }
  for (int i = 0; i < request.reports_size(); ++i) {
    const v1::CompletionReport& report = request.reports(i);
    const absl::Status status =
        report.host() == request.host()
            ? ReportCompletion(report)
            : absl::InvalidArgumentError(absl::StrCat("reports[", i, "].host: '", report.host(),
                                                      "' is not the call's host '",
                                                      request.host(), "'"));
    v1::CompletionResult* result = reply->add_results();
    result->set_code(static_cast<int32_t>(status.code()));
    result->set_message(std::string(status.message()));
  }
  return absl::OkStatus();
}

absl::Status SchedulerService::ReportCompletion(const v1::CompletionReport& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_.groups().IsPartOrFeed(request.transfer_id())) {  // server_groups.h
    if (request.part_ready()) {
      GroupPartReady(&state_, request.transfer_id());
    } else {
      GroupPartEnded(&state_, request.transfer_id(), request.applied(), request.model_version(),
                     request.error());
    }
    return absl::OkStatus();
  }
  if (ReplicaSnapshotEnded(&state_, request.transfer_id(), request.applied(),
                           request.model_version(), request.error())) {
    return absl::OkStatus();
  }
  if (request.part_ready()) {
    return absl::NotFoundError(
        absl::StrCat("transfer ", request.transfer_id(), " is no part of a group push in flight"));
  }
  if (EndReplicaTransfer(&state_, request) || EndChainHop(&state_, request) ||
      EndAggregate(&state_, request)) {
    return absl::OkStatus();
  }
  return CompletePushLocked(request);
}

absl::Status SchedulerService::CompletePushLocked(const v1::CompletionReport& request) {
  auto* it = state_.FindPush(request.transfer_id());
  if (it == nullptr) {
    // A delivery of the scheduler before a restart: its pushes may be in
    // doubt at their sources (in_doubt.h).
    if (AcceptLateCompletion(&state_, request)) {
      ResolveInDoubt(&state_, config_.in_doubt_wait_s);
      return absl::OkStatus();
    }
    return absl::NotFoundError(
        absl::StrCat("transfer ", request.transfer_id(), " is not in flight"));
  }
  // Still waiting in its server's batch: no daemon has been told to move it,
  // so none can report it (and completing it here would leave its id in the
  // server's pending list for the next batch to plan as an empty update).
  if (it->state == UpdateState::kPending) {
    return absl::FailedPreconditionError(absl::StrCat(
        "transfer_id ", request.transfer_id(), " is not scheduled yet; only a transfer in flight ",
        "can complete"));
  }
  if (request.applied()) {
    if (JobState* job = state_.FindJob(it->job)) {
      ServerState& server = job->servers[it->server];
      server.model_version = std::max(server.model_version, request.model_version());
    }
    state_.Complete(request.transfer_id(), v1::OUTCOME_APPLIED, "", request.model_version());
  } else {
    // Waits for a failover if the replica holds its copy (failover.h) and
    // the failure is not the server's own word (its daemon or application
    // refusing it): the server may be dying, and the scheduler may not
    // have noticed yet (within the keepalive).
    const JobState* job = state_.FindJob(it->job);
    const bool from_server =
        job != nullptr && job->servers.count(it->server) &&
        job->servers.at(it->server).host == request.host();
    state_.FailTransfer(request.transfer_id(),
                        request.error().empty() ? "transfer failed" : request.error(),
                        from_server ? 0 : 2 * config_.keepalive_s + 1);
  }
  return absl::OkStatus();
}

absl::Status SchedulerService::ReportEntityGone(const v1::EntityGoneReport& request) {
  std::lock_guard<std::mutex> lock(mu_);
  JobState* job = state_.FindJob(request.job());
  if (job == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown job '", request.job(), "'"));
  }
  if (state_.AliveHost(request.host()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("host '", request.host(), "' is not registered"));
  }
  const std::string why =
      absl::StrCat("its application left host ", request.host(),
                   request.reason().empty() ? "" : absl::StrCat(" (", request.reason(), ")"));
  switch (request.role()) {
    case v1::ROLE_SERVER: {
      auto server = job->servers.find(request.name());
      if (server == job->servers.end() || server->second.host != request.host()) {
        // Its replica took over already, or it never registered here.
        return absl::FailedPreconditionError(absl::StrCat(
            "server '", request.name(), "' of job '", request.job(), "' is not served from host ",
            request.host()));
      }
      if (!PromoteReplica(&state_, request.job(), request.name(), why)) {
        MLF_LOG(WARNING) << "job " << request.job() << ": server " << request.name() << ": "
                         << why << "; it has no live replica to take over, so its pushes fail "
                         << "until it registers again";
      }
      loop_.Wake();  // plan its waiting pushes to the new host now
      return absl::OkStatus();
    }
    case v1::ROLE_REPLICA: {
      auto replica = job->replica_hosts.find(request.name());
      if (replica == job->replica_hosts.end() || replica->second != request.host()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "no replica of server '", request.name(), "' of job '", request.job(),
            "' is on host ", request.host()));
      }
      job->replica_hosts.erase(replica);
      const std::string copy_why = absl::StrCat("the replica of server '", request.name(), "' left: ", why);
      if (auto server = job->servers.find(request.name()); server != job->servers.end()) {
        state_.DropReplicaPending(&server->second, copy_why);
        ForgetReplicaSnapshot(&state_, &server->second);
      }
      std::vector<uint64_t> copies;
      state_.replicas().ForEachCopy([&](uint64_t id, const ReplicaCopy& copy) {
        if (copy.job == request.job() && copy.server == request.name() && !copy.to_promoted) {
          copies.push_back(id);
        }
      });
      for (uint64_t id : copies) state_.EndReplicaCopy(id, /*applied=*/false, copy_why, 0);
      MLF_LOG(WARNING) << "job " << request.job() << ": the replica of server " << request.name()
                       << " on " << request.host() << " left; the server runs without one";
      return absl::OkStatus();
    }
    case v1::ROLE_WORKER: {
      auto worker = job->workers.find(request.name());
      if (worker == job->workers.end() || worker->second.host != request.host()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker '", request.name(), "' of job '", request.job(),
            "' is not registered from host ", request.host()));
      }
      // Its pushes in rounds end with their own outcomes; the job's rounds
      // go on without it (round_tracker.h MemberLeft).
      MemberLeft(&state_, request.job(), request.name(), why);
      loop_.Wake();  // a round it held back may be complete now
      clocks_cv_.notify_all();  // nor does it hold back an ssp job's clocks
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          "role: must be ROLE_WORKER, ROLE_SERVER or ROLE_REPLICA");
  }
}

absl::Status SchedulerService::ReportBandwidth(const v1::BandwidthReport& request) {
  std::lock_guard<std::mutex> lock(mu_);
  HostState* host = state_.hosts().Find(request.host());
  if (host == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("host '", request.host(), "' is not registered"));
  }
  for (const auto& [field, bps] : {std::pair{"uplink_bps", request.uplink_bps()},
                                   std::pair{"downlink_bps", request.downlink_bps()}}) {
    if (!(bps >= kMinLinkBps && bps <= kMaxLinkBps)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", bps, " is out of range [",
                                                     kMinLinkBps, ", ", kMaxLinkBps, "]"));
    }
  }
  host->uplink_bps = request.uplink_bps();
  host->downlink_bps = request.downlink_bps();
  host->last_report_s = clock_->NowSeconds();
  ++host->reports;
  ++state_.stats.bandwidth_reports;
  return absl::OkStatus();
}

absl::Status SchedulerService::ResolveServer(const v1::ResolveServerRequest& request,
                                             v1::ResolveServerReply* reply) {
  std::lock_guard<std::mutex> lock(mu_);
  JobState* job = state_.FindJob(request.job());
  if (job == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown job '", request.job(), "'"));
  }
  auto server = job->servers.find(request.server());
  if (server == job->servers.end()) {
    return absl::NotFoundError(absl::StrCat("server '", request.server(), "' of job '",
                                            request.job(), "' is not registered"));
  }
  RETURN_IF_ERROR(CheckGroupPush(state_, *job, server->first, server->second, -1));
  const HostState* host = state_.AliveHost(server->second.host);
  if (host == nullptr) {
    return absl::UnavailableError(absl::StrCat("server '", request.server(), "' is down"));
  }
  reply->set_host(server->second.host);
  reply->set_data_address(host->data_address);
  reply->set_job_id(job->id);
  reply->set_round_size(RoundSize(*job, server->second));
  auto replica = job->replica_hosts.find(request.server());
  reply->set_has_replica(replica != job->replica_hosts.end() &&
                         state_.AliveHost(replica->second) != nullptr);
  for (const ShardSlot& slot : server->second.shards) {  // a server group's
    v1::ShardLocation* shard = reply->add_shards();
    shard->set_server(slot.server);
    shard->set_begin(slot.begin);
    shard->set_end(slot.end);
  }
  return absl::OkStatus();
}

absl::Status SchedulerService::PlanDistribution(const v1::PlanDistributionRequest& request,
                                                v1::PlanDistributionReply* reply) {
  if (request.requesters().empty()) {
    return absl::InvalidArgumentError("requesters: must name at least one host");
  }
  if (request.model_bytes() <= 0 || request.model_bytes() > config_.max_update_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("model_bytes: ", request.model_bytes(),
                                                   " is out of range [1, ",
                                                   config_.max_update_bytes, "]"));
  }
  core::DistributionRequest plan_in;
  std::map<std::string, std::string> addresses;  // requester -> data address
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(DistributionRequestLocked(request, &plan_in, &addresses));
  }
  // The core is pure: plan outside the lock.
  absl::StatusOr<core::DistributionPlan> plan = PlanDistributionTree(plan_in);
  if (!plan.ok()) return plan.status();
  if (config_.get_reservations) ReserveDistribution(plan_in.now_s, *plan);
  FillDistributionReply(*plan, plan_in, addresses, reply);
  MLF_LOG(DEBUG) << "distribution for '" << request.job() << "/" << request.server() << "': "
                 << request.requesters_size() << " requesters, " << reply->server_copies()
                 << " server copies, " << reply->total_s() << " s";
  return absl::OkStatus();
}

absl::Status SchedulerService::DistributionRequestLocked(
    const v1::PlanDistributionRequest& request, core::DistributionRequest* plan_in,
    std::map<std::string, std::string>* addresses) {
  const JobState* job = state_.FindJob(request.job());
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown job '", request.job(), "'"));
  }
  auto server = job->servers.find(request.server());
  if (server == job->servers.end()) {
    return absl::NotFoundError(absl::StrCat("server '", request.server(), "' of job '",
                                            request.job(), "' is not registered"));
  }
  if (server->second.host != request.host()) {
    return absl::PermissionDeniedError(
        absl::StrCat("host '", request.host(), "' does not serve '", request.server(),
                     "' (its host is '", server->second.host, "')"));
  }
  const double now_s = clock_->NowSeconds();
  absl::flat_hash_set<std::string> links = {request.host()};  // the only links the tree may use
  links.insert(request.requesters().begin(), request.requesters().end());
  std::map<std::string, std::vector<core::RateSegment>> up, down;
  state_.Reservations(&up, &down, &links);
  const HostState* server_host = state_.AliveHost(request.host());
  if (server_host == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("host '", request.host(), "' is down"));
  }
  plan_in->now_s = now_s;
  plan_in->server = request.host();
  plan_in->model_bytes = request.model_bytes();
  plan_in->hosts.push_back(ResidualHostLink(request.host(), *server_host, now_s, up, down));
  std::set<std::string> seen;
  for (const std::string& name : request.requesters()) {
    if (name == request.host() || !seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "requesters: '", name, "' is ",
          name == request.host() ? "the server's own host" : "named twice"));
    }
    const HostState* host = state_.AliveHost(name);
    if (host == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("requester '", name, "' is not a live host"));
    }
    plan_in->requesters.push_back(name);
    (*addresses)[name] = host->data_address;
    plan_in->hosts.push_back(ResidualHostLink(name, *host, now_s, up, down));
    if (host->draining) {  // it receives, but forwards to nobody (a leaf)
      plan_in->hosts.back().uplink_bps = kMinLinkBps;
      plan_in->hosts.back().uplink_profile.clear();
    }
    // Every requester may forward (it receives the model anyway); a
    // draining host is not asked to.
    if (config_.get_trees && !host->draining) plan_in->distributors.push_back(name);
  }
  plan_in->seed = static_cast<uint64_t>(++distributions_planned_);
  return absl::OkStatus();
}

absl::StatusOr<core::DistributionPlan> SchedulerService::PlanDistributionTree(
    const core::DistributionRequest& plan_in) const {
  const bool cut_through = config_.get_trees && config_.get_tree_planner == "cut_through";
  absl::StatusOr<core::DistributionPlan> plan;
  if (cut_through) {
    core::CutThroughOptions options;
    options.max_fanout = static_cast<int>(config_.get_tree_max_fanout);
    options.min_saving = config_.get_tree_min_saving;
    plan = core::PlanCutThroughDistribution(plan_in, options);
  } else {
    plan = core::PlanModelDistribution(plan_in);
  }
  if (!cut_through && plan.ok() && config_.get_deadline_slack > 0 &&
      plan->distributors_used + plan->direct > 1) {
    core::DistributionOptions spare;
    spare.deadline_s = plan_in.now_s + config_.get_deadline_slack * (plan->total_s - plan_in.now_s);
    plan = core::PlanModelDistribution(plan_in, spare);
  }
  return plan;
}

}  // namespace mlfabric
