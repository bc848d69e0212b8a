#include "scheduler/service/scheduler_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mlfabric {
namespace {

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

grpc::Status Precondition(const std::string& message) {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, message);
}

constexpr size_t kRecentDrops = 200;
constexpr size_t kRecentDelays = 1000;
constexpr size_t kLinkSamples = 240;
constexpr double kLinkSamplePeriodS = 0.25;

int PlannerThreads(int64_t configured) {
  if (configured > 0) return static_cast<int>(configured);
  return std::max(1u, std::thread::hardware_concurrency());
}

// Sum of the rates of `segments` in force at `t`.
double RateAt(const std::vector<core::RateSegment>& segments, double t) {
  double sum = 0;
  for (const core::RateSegment& s : segments) {
    if (s.from_s <= t && t < s.to_s) sum += s.rate_bps;
  }
  return sum;
}

// `capacity - reservations` from `now_s` on, as a capacity profile.
std::vector<core::ProfilePoint> ResidualProfile(double capacity_bps, double now_s,
                                                const std::vector<core::RateSegment>& reserved) {
  std::set<double> times = {now_s};
  for (const core::RateSegment& s : reserved) {
    if (s.to_s <= now_s) continue;
    if (s.from_s > now_s) times.insert(s.from_s);
    times.insert(s.to_s);
  }
  std::vector<core::ProfilePoint> profile;
  for (double t : times) {
    const double rate = std::max(0.0, capacity_bps - RateAt(reserved, t));
    if (!profile.empty() && profile.back().second == rate) continue;
    profile.push_back({t, rate});
  }
  return profile;
}

// A short, stable label for a failure reason (metrics and dashboard).
std::string FailureCategory(const std::string& reason) {
  if (reason.rfind("timed out", 0) == 0) return "timed_out";
  if (reason.find(" is down") != std::string::npos) return "host_down";
  if (reason.rfind("scheduler could not plan", 0) == 0) return "plan_error";
  if (reason.find("aggregator") != std::string::npos) return "aggregation_unsupported";
  if (reason.find("ended mid-transfer") != std::string::npos ||
      reason.find("connection") != std::string::npos) {
    return "connection_lost";
  }
  return "transfer_failed";
}

}  // namespace

SchedulerService::SchedulerService(SchedulerConfig config, const Clock* clock,
                                   std::unique_ptr<core::Planner> planner)
    : config_(std::move(config)),
      clock_(clock),
      planner_(std::move(planner)),
      planner_threads_(PlannerThreads(config_.planner_threads)),
      started_s_(clock_->NowSeconds()) {
  delay_histogram_.bounds = {0, 1, 2, 4, 8, 16, 32, 64, 128};
  delay_histogram_.counts.assign(delay_histogram_.bounds.size() + 1, 0);
  uint32_t next_job_id = 1;
  for (const JobConfig& job : config_.jobs) {
    JobState state;
    state.id = next_job_id++;
    state.config = job;
    jobs_[job.name] = std::move(state);
  }
}

SchedulerService::~SchedulerService() { Stop(); }

void SchedulerService::Start() { batch_thread_ = std::thread([this] { BatchLoop(); }); }

void SchedulerService::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  commands_cv_.notify_all();
  servers_cv_.notify_all();
  if (batch_thread_.joinable()) batch_thread_.join();
}

SchedulerService::Stats SchedulerService::GetStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

ClusterSnapshot SchedulerService::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  ClusterSnapshot snap;
  snap.now_s = clock_->NowSeconds();
  snap.started_s = started_s_;
  snap.planner = planner_->Name();
  snap.batch_interval_ms = config_.batch_interval_ms;
  snap.planner_threads = planner_threads_;
  snap.stats = stats_;
  std::map<std::string, std::vector<core::RateSegment>> up, down;
  ReservationsLocked(&up, &down);
  for (const auto& [name, host] : hosts_) {
    HostView view;
    view.name = name;
    view.data_address = host.data_address;
    view.alive = host.alive;
    view.draining = host.draining;
    view.capacity_up_bps = host.capacity_up_bps;
    view.capacity_down_bps = host.capacity_down_bps;
    view.reported_up_bps = host.uplink_bps;
    view.reported_down_bps = host.downlink_bps;
    view.last_report_s = host.last_report_s;
    view.reports = host.reports;
    view.reserved_up_bps = up.count(name) ? RateAt(up.at(name), snap.now_s) : 0;
    view.reserved_down_bps = down.count(name) ? RateAt(down.at(name), snap.now_s) : 0;
    view.available_up_bps = std::max(0.0, view.reported_up_bps - view.reserved_up_bps);
    view.available_down_bps = std::max(0.0, view.reported_down_bps - view.reserved_down_bps);
    snap.hosts.push_back(std::move(view));
  }
  for (const auto& [name, job] : jobs_) {
    JobView view;
    view.id = job.id;
    view.params = job.config;
    view.params.token.clear();
    view.applied = job.applied;
    view.dropped = job.dropped;
    view.failed = job.failed;
    for (const auto& [server_name, server] : job.servers) {
      view.servers.push_back({server_name, server.host, server.model_version,
                              static_cast<int64_t>(server.pending.size()), server.in_flight});
    }
    snap.jobs.push_back(std::move(view));
  }
  snap.recent_batches.assign(recent_batches_.begin(), recent_batches_.end());
  for (const auto& [id, record] : updates_) {
    if (record.state == UpdateState::kInFlight) snap.in_flight.push_back(record.planned);
  }
  snap.recent_drops.assign(recent_drops_.begin(), recent_drops_.end());
  snap.drops_by_category = drops_by_category_;
  snap.recent_delays.assign(recent_delays_.begin(), recent_delays_.end());
  snap.delay_histogram = delay_histogram_;
  snap.link_samples.assign(link_samples_.begin(), link_samples_.end());
  return snap;
}

absl::Status SchedulerService::UpdateJobParams(const std::string& job_name,
                                               const JobParamsUpdate& update) {
  std::lock_guard<std::mutex> lock(mu_);
  JobState* job = FindJobLocked(job_name);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("unknown job '", job_name, "'"));
  if (update.tau_max && (*update.tau_max < 0 || *update.tau_max > 1000000)) {
    return absl::InvalidArgumentError("tau_max: must be in [0, 1000000]");
  }
  if (update.staleness_k && (*update.staleness_k < 0 || *update.staleness_k > 1000000)) {
    return absl::InvalidArgumentError("staleness_k: must be in [0, 1000000]");
  }
  if (update.divergence_max &&
      (!std::isfinite(*update.divergence_max) || *update.divergence_max < 0)) {
    return absl::InvalidArgumentError("divergence_max: must be finite and >= 0");
  }
  if (update.momentum && !(*update.momentum >= 0 && *update.momentum < 1)) {
    return absl::InvalidArgumentError("momentum: must be in [0, 1)");
  }
  if (update.priority_class && (*update.priority_class < 0 || *update.priority_class > 7)) {
    return absl::InvalidArgumentError("priority_class: must be in [0, 7]");
  }
  JobConfig& config = job->config;
  if (update.tau_max) config.tau_max = *update.tau_max;
  if (update.staleness_k) config.staleness_k = *update.staleness_k;
  if (update.divergence_max) config.divergence_max = *update.divergence_max;
  if (update.momentum) config.momentum = *update.momentum;
  if (update.priority_class) config.priority_class = *update.priority_class;
  MLF_LOG(INFO) << "admin: job " << job_name << " now tau_max " << config.tau_max
                << ", staleness_k " << config.staleness_k << ", divergence_max "
                << config.divergence_max << ", momentum " << config.momentum
                << ", priority_class " << config.priority_class;
  return absl::OkStatus();
}

absl::Status SchedulerService::DrainHost(const std::string& host_name, bool drain) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = hosts_.find(host_name);
  if (it == hosts_.end()) {
    return absl::NotFoundError(absl::StrCat("host '", host_name, "' is not registered"));
  }
  it->second.draining = drain;
  MLF_LOG(INFO) << "admin: host " << host_name << (drain ? " drained" : " back in service");
  return absl::OkStatus();
}

SchedulerService::JobState* SchedulerService::FindJobLocked(const std::string& job) {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : &it->second;
}

grpc::Status SchedulerService::RegisterHost(grpc::ServerContext*,
                                            const v1::RegisterHostRequest* request,
                                            v1::RegisterHostReply* reply) {
  if (request->protocol_version() != 1) {
    return Invalid(absl::StrCat("protocol_version ", request->protocol_version(),
                                " is not supported; this scheduler speaks version 1"));
  }
  if (request->host().empty()) return Invalid("host: must name the host");
  if (request->data_address().empty()) return Invalid("data_address: must be ip:port");
  for (double bps : {request->uplink_bps(), request->downlink_bps()}) {
    if (!std::isfinite(bps) || bps < 0) {
      return Invalid("uplink_bps/downlink_bps: must be finite and >= 0 (0 = scheduler default)");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  HostState& host = hosts_[request->host()];
  if (host.alive) MarkHostDownLocked(request->host(), "host re-registered (daemon restarted)");
  host.data_address = request->data_address();
  host.capacity_up_bps =
      request->uplink_bps() > 0 ? request->uplink_bps() : config_.default_link_bps;
  host.capacity_down_bps =
      request->downlink_bps() > 0 ? request->downlink_bps() : config_.default_link_bps;
  host.uplink_bps = host.capacity_up_bps;
  host.downlink_bps = host.capacity_down_bps;
  host.last_report_s = -1;
  host.incarnation = next_incarnation_++;
  host.alive = true;
  host.commands.clear();
  reply->set_incarnation(host.incarnation);
  reply->set_scheduler_time_s(clock_->NowSeconds());
  MLF_LOG(INFO) << "host " << request->host() << " registered at " << host.data_address
                << " (incarnation " << host.incarnation << ")";
  return grpc::Status::OK;
}

grpc::Status SchedulerService::RegisterEntity(grpc::ServerContext*,
                                              const v1::RegisterEntityRequest* request,
                                              v1::RegisterEntityReply* reply) {
  std::lock_guard<std::mutex> lock(mu_);
  JobState* job = FindJobLocked(request->job());
  if (job == nullptr) {
    return Invalid(absl::StrCat("unknown job '", request->job(),
                                "'; jobs are declared in the scheduler's config"));
  }
  if (request->job_token() != job->config.token) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("wrong token for job '", request->job(), "'"));
  }
  auto host = hosts_.find(request->host());
  if (host == hosts_.end() || !host->second.alive) {
    return Precondition(absl::StrCat("host '", request->host(), "' is not registered"));
  }
  if (request->name().empty()) return Invalid("name: must not be empty");
  reply->set_job_id(job->id);
  switch (request->role()) {
    case v1::ROLE_SERVER: {
      for (const auto& [other_name, other] : jobs_) {
        if (&other != job && other.servers.count(request->name()) &&
            other.servers.at(request->name()).host == request->host()) {
          MLF_LOG(INFO) << "server name '" << request->name() << "' on " << request->host()
                        << " is used by jobs '" << other_name << "' and '" << request->job()
                        << "'; they stay separate";
        }
      }
      if (request->round_size() < 0 || request->round_size() > 65536) {
        return Invalid(absl::StrCat("round_size ", request->round_size(),
                                    " is out of range [0, 65536]"));
      }
      ServerState& server = job->servers[request->name()];
      server.host = request->host();
      server.round_size = request->round_size();
      servers_cv_.notify_all();
      reply->set_model_version(server.model_version);
      MLF_LOG(INFO) << "job " << request->job() << ": server " << request->name() << " on "
                    << request->host();
      break;
    }
    case v1::ROLE_WORKER: {
      if (request->delay_bound() < -1) {
        return Invalid(absl::StrCat("delay_bound ", request->delay_bound(),
                                    " is negative (-1 = the job's)"));
      }
      if (!std::isfinite(request->divergence_bound())) {
        return Invalid("divergence_bound: must be finite");
      }
      WorkerInfo& worker = job->workers[request->name()];
      worker.host = request->host();
      worker.delay_bound = request->delay_bound();
      worker.divergence_bound = request->divergence_bound() > 0 ? request->divergence_bound() : -1;
      MLF_LOG(INFO) << "job " << request->job() << ": worker " << request->name() << " on "
                    << request->host()
                    << (worker.delay_bound >= 0
                            ? absl::StrCat(" (delay bound ", worker.delay_bound, ")")
                            : std::string());
      break;
    }
    case v1::ROLE_REPLICA:
      // A replica names the server it shadows (§5.3); one per server.
      job->replica_hosts[request->name()] = request->host();
      MLF_LOG(INFO) << "job " << request->job() << ": " << v1::Role_Name(request->role()) << " "
                    << request->name() << " on " << request->host();
      break;
    default:
      return Invalid("role: must be ROLE_WORKER, ROLE_SERVER or ROLE_REPLICA");
  }
  return grpc::Status::OK;
}

grpc::Status SchedulerService::SubmitUpdate(grpc::ServerContext*,
                                            const v1::SubmitUpdateRequest* request,
                                            v1::SubmitUpdateReply* reply) {
  std::unique_lock<std::mutex> lock(mu_);
  auto reject = [&](grpc::Status status) {
    ++stats_.rejected;
    MLF_LOG(WARNING) << "rejected push from " << request->src_host() << ": "
                     << status.error_message();
    return status;
  };
  JobState* job = FindJobLocked(request->job());
  if (job == nullptr) return reject(Invalid(absl::StrCat("unknown job '", request->job(), "'")));
  if (!v1::DType_IsValid(request->dtype())) {
    return reject(Invalid(absl::StrCat("dtype: unknown element type ", request->dtype())));
  }
  if (request->bytes() <= 0) {
    return reject(Invalid(absl::StrCat("bytes: must be positive, got ", request->bytes())));
  }
  if (request->bytes() > config_.max_update_bytes) {
    return reject(Invalid(absl::StrCat("bytes: ", request->bytes(),
                                       " exceeds max_update_bytes (", config_.max_update_bytes,
                                       ")")));
  }
  if (request->version() < 0) {
    return reject(Invalid(absl::StrCat("version: must be >= 0, got ", request->version())));
  }
  if (!std::isfinite(request->norm()) || request->norm() < 0) {
    return reject(Invalid("norm: must be finite and >= 0"));
  }
  if (request->tensors_size() > 0) {
    uint64_t total = 0;
    for (const auto& tensor : request->tensors()) total += tensor.bytes();
    if (total != static_cast<uint64_t>(request->bytes())) {
      return reject(Invalid(absl::StrCat("tensors: sizes add up to ", total, " bytes, not ",
                                         request->bytes())));
    }
  }
  auto src = hosts_.find(request->src_host());
  if (src == hosts_.end() || !src->second.alive) {
    return reject(Precondition(absl::StrCat("src_host '", request->src_host(),
                                            "' is not registered")));
  }
  if (src->second.draining) {
    return reject(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               absl::StrCat("src_host '", request->src_host(),
                                            "' is drained by an operator; it takes no new pushes")));
  }
  auto server = job->servers.find(request->server());
  bool owned_elsewhere = false;
  for (const auto& [other_name, other] : jobs_) {
    owned_elsewhere |= other_name != request->job() && other.servers.count(request->server());
  }
  if (server == job->servers.end() && !owned_elsewhere && config_.server_wait_s > 0) {
    // Workers often start before their server: give it a moment to register.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(config_.server_wait_s));
    servers_cv_.wait_until(lock, deadline, [&] {
      return stopping_ || job->servers.count(request->server()) > 0;
    });
    server = job->servers.find(request->server());
    src = hosts_.find(request->src_host());
    if (src == hosts_.end() || !src->second.alive) {
      return reject(Precondition(absl::StrCat("src_host '", request->src_host(),
                                              "' went down while waiting for server '",
                                              request->server(), "'")));
    }
  }
  if (server == job->servers.end()) {
    for (const auto& [other_name, other] : jobs_) {
      if (other_name != request->job() && other.servers.count(request->server())) {
        return reject(grpc::Status(
            grpc::StatusCode::PERMISSION_DENIED,
            absl::StrCat("server '", request->server(), "' belongs to job '", other_name,
                         "', not to job '", request->job(),
                         "': a job's pushes may only go to its own servers")));
      }
    }
    return reject(Precondition(absl::StrCat("server '", request->server(), "' of job '",
                                            request->job(), "' is not registered (waited ",
                                            config_.server_wait_s, " s; see server_wait_s)")));
  }
  auto server_host = hosts_.find(server->second.host);
  if (server_host == hosts_.end() || !server_host->second.alive) {
    return reject(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               absl::StrCat("server '", request->server(), "' is down (host '",
                                            server->second.host, "')")));
  }
  if (server_host->second.draining) {
    return reject(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               absl::StrCat("server '", request->server(), "' is on host '",
                                            server->second.host,
                                            "', which an operator drained; no new pushes")));
  }
  UpdateRecord record;
  record.transfer_id = next_transfer_id_++;
  record.job = request->job();
  record.server = request->server();
  record.src_host = request->src_host();
  record.worker = request->worker();
  record.local_id = request->local_id();
  record.bytes = request->bytes();
  record.version = request->version();
  record.norm = request->norm();
  record.dtype = request->dtype();
  record.submitted_s = clock_->NowSeconds();
  server->second.pending.push_back(record.transfer_id);
  reply->set_transfer_id(record.transfer_id);
  updates_[record.transfer_id] = std::move(record);
  return grpc::Status::OK;
}

grpc::Status SchedulerService::StreamSchedules(grpc::ServerContext* context,
                                               const v1::StreamSchedulesRequest* request,
                                               grpc::ServerWriter<v1::DaemonCommand>* writer) {
  const std::string host_name = request->host();
  std::unique_lock<std::mutex> lock(mu_);
  auto it = hosts_.find(host_name);
  if (it == hosts_.end() || it->second.incarnation != request->incarnation()) {
    return Precondition(absl::StrCat("host '", host_name,
                                     "' must RegisterHost before streaming schedules"));
  }
  it->second.streaming = true;
  const uint64_t incarnation = request->incarnation();
  std::string end_reason = "scheduler stopping";
  while (true) {
    HostState& host = hosts_[host_name];
    if (host.incarnation != incarnation) {
      end_reason.clear();  // superseded by a newer registration: nothing to fail
      break;
    }
    if (stopping_) break;
    if (context->IsCancelled()) {
      end_reason = "daemon disconnected";
      break;
    }
    if (host.commands.empty()) {
      // Wake up periodically to notice a cancelled stream.
      commands_cv_.wait_for(lock, std::chrono::milliseconds(100));
      continue;
    }
    v1::DaemonCommand command = std::move(host.commands.front());
    host.commands.pop_front();
    lock.unlock();
    const bool written = writer->Write(command);
    lock.lock();
    if (!written) {
      end_reason = "schedule stream broken";
      break;
    }
  }
  HostState& host = hosts_[host_name];
  if (host.incarnation == incarnation && !end_reason.empty() && !stopping_) {
    MarkHostDownLocked(host_name, end_reason);
  }
  return grpc::Status::OK;
}

grpc::Status SchedulerService::ReportCompletion(grpc::ServerContext*,
                                                const v1::CompletionReport* request,
                                                v1::CompletionAck*) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto copy = replica_copies_.find(request->transfer_id()); copy != replica_copies_.end()) {
    if (JobState* job = FindJobLocked(copy->second.job)) {
      ReplicaTrack& replica = job->servers[copy->second.server].replica;
      replica.in_flight.erase(copy->first);
      if (request->applied()) ++replica.applied;
    }
    if (!request->applied()) {
      MLF_LOG(WARNING) << "replica copy " << copy->first << " of push " << copy->second.source
                       << " failed: " << request->error();
      CancelReplicaCopyLocked(copy->first, copy->second, request->error());
    }
    replica_copies_.erase(copy);
    return grpc::Status::OK;
  }
  if (auto agg = aggregates_.find(request->transfer_id()); agg != aggregates_.end()) {
    if (!request->applied()) {
      FailAggregateLocked(agg->first,
                          request->error().empty() ? "aggregate failed" : request->error());
      return grpc::Status::OK;
    }
    const std::vector<uint64_t> constituents = agg->second.constituents;
    bool in_round = false;
    if (JobState* job = FindJobLocked(agg->second.job)) {
      ServerState& server = job->servers[agg->second.server];
      server.model_version = std::max(server.model_version, request->model_version());
      in_round = RoundSizeLocked(*job, server) > 0;
    }
    aggregates_.erase(agg);
    // The server applied the constituents as consecutive versions ending at
    // model_version, in commit order; a synchronous round's members all
    // land in the one version the round produced.
    const int64_t n = static_cast<int64_t>(constituents.size());
    for (int64_t i = 0; i < n; ++i) {
      CompleteLocked(constituents[i], v1::OUTCOME_APPLIED, "",
                     in_round ? request->model_version()
                              : request->model_version() - (n - 1 - i));
    }
    return grpc::Status::OK;
  }
  auto it = updates_.find(request->transfer_id());
  if (it == updates_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("transfer ", request->transfer_id(), " is not in flight"));
  }
  if (request->applied()) {
    JobState* job = FindJobLocked(it->second.job);
    if (job != nullptr) {
      ServerState& server = job->servers[it->second.server];
      server.model_version = std::max(server.model_version, request->model_version());
    }
    CompleteLocked(request->transfer_id(), v1::OUTCOME_APPLIED, "", request->model_version());
  } else {
    CompleteLocked(request->transfer_id(), v1::OUTCOME_FAILED,
                   request->error().empty() ? "transfer failed" : request->error(), 0);
  }
  return grpc::Status::OK;
}

grpc::Status SchedulerService::ReportBandwidth(grpc::ServerContext*,
                                               const v1::BandwidthReport* request,
                                               v1::BandwidthAck*) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = hosts_.find(request->host());
  if (it == hosts_.end()) {
    return Precondition(absl::StrCat("host '", request->host(), "' is not registered"));
  }
  for (double bps : {request->uplink_bps(), request->downlink_bps()}) {
    if (!std::isfinite(bps) || bps <= 0) return Invalid("bandwidth must be finite and positive");
  }
  it->second.uplink_bps = request->uplink_bps();
  it->second.downlink_bps = request->downlink_bps();
  it->second.last_report_s = clock_->NowSeconds();
  ++it->second.reports;
  ++stats_.bandwidth_reports;
  return grpc::Status::OK;
}

grpc::Status SchedulerService::ResolveServer(grpc::ServerContext*,
                                             const v1::ResolveServerRequest* request,
                                             v1::ResolveServerReply* reply) {
  std::lock_guard<std::mutex> lock(mu_);
  JobState* job = FindJobLocked(request->job());
  if (job == nullptr) return Invalid(absl::StrCat("unknown job '", request->job(), "'"));
  auto server = job->servers.find(request->server());
  if (server == job->servers.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("server '", request->server(), "' of job '", request->job(),
                                     "' is not registered"));
  }
  auto host = hosts_.find(server->second.host);
  if (host == hosts_.end() || !host->second.alive) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("server '", request->server(), "' is down"));
  }
  reply->set_host(server->second.host);
  reply->set_data_address(host->second.data_address);
  reply->set_job_id(job->id);
  reply->set_round_size(RoundSizeLocked(*job, server->second));
  return grpc::Status::OK;
}

grpc::Status SchedulerService::SyncClock(grpc::ServerContext*, const v1::SyncClockRequest*,
                                         v1::SyncClockReply* reply) {
  reply->set_scheduler_time_s(clock_->NowSeconds());
  return grpc::Status::OK;
}

void SchedulerService::EnqueueLocked(const std::string& host, v1::DaemonCommand command) {
  auto it = hosts_.find(host);
  if (it == hosts_.end() || !it->second.alive) return;
  it->second.commands.push_back(std::move(command));
  commands_cv_.notify_all();
}

void SchedulerService::CompleteLocked(uint64_t transfer_id, v1::Outcome outcome,
                                      const std::string& reason, int64_t applied_version) {
  auto it = updates_.find(transfer_id);
  if (it == updates_.end()) return;
  const UpdateRecord& record = it->second;
  if (record.state == UpdateState::kInFlight) {
    if (JobState* job = FindJobLocked(record.job)) {
      auto server = job->servers.find(record.server);
      if (server != job->servers.end()) {
        --server->second.in_flight;
        if (outcome != v1::OUTCOME_APPLIED && record.aggregate_id == 0 && record.sequence != 0) {
          // The server's daemon waits for this sequence number: tell it to
          // skip, so later updates are not held back behind it.
          v1::DaemonCommand command;
          v1::CancelDelivery* cancel = command.mutable_cancel();
          cancel->set_transfer_id(transfer_id);
          cancel->set_server(record.server);
          cancel->set_sequence(record.sequence);
          cancel->set_reason(reason);
          EnqueueLocked(server->second.host, std::move(command));
        }
      }
    }
  }
  v1::DaemonCommand command;
  v1::PushOutcome* result = command.mutable_outcome();
  result->set_transfer_id(transfer_id);
  result->set_local_id(record.local_id);
  result->set_outcome(outcome);
  result->set_reason(reason);
  if (outcome == v1::OUTCOME_APPLIED) {
    result->set_applied_version(applied_version);
    // Its replica copy was punted (§5.3): the source keeps the bytes until
    // a later batch sends them to the replica.
    if (record.replica_punted) {
      if (JobState* job = FindJobLocked(record.job)) {
        job->servers[record.server].replica.pending.push_back(
            {transfer_id, record.src_host, record.worker, record.bytes, record.version,
             record.norm});
        result->set_hold_for_replica(true);
      }
    }
    // The update was computed on v(g) and applied as version applied_version:
    // applied_version - 1 - v(g) other updates came in between (§3.1).
    result->set_delay(std::max<int64_t>(0, applied_version - 1 - record.version));
    ++stats_.applied;
  } else if (outcome == v1::OUTCOME_DROPPED) {
    ++stats_.dropped;
  } else {
    ++stats_.failed;
    MLF_LOG(WARNING) << "push " << transfer_id << " from " << record.src_host
                     << " failed: " << reason;
  }
  EnqueueLocked(record.src_host, std::move(command));
  JobState* job = FindJobLocked(record.job);
  if (outcome == v1::OUTCOME_APPLIED) {
    if (job) ++job->applied;
    DelayView delay;
    delay.transfer_id = transfer_id;
    delay.job = record.job;
    delay.server = record.server;
    delay.src = record.src_host;
    delay.delay = result->delay();
    delay.at_s = clock_->NowSeconds();
    delay.latency_s = delay.at_s - record.submitted_s;
    recent_delays_.push_back(delay);
    if (recent_delays_.size() > kRecentDelays) recent_delays_.pop_front();
    DelayHistogram& h = delay_histogram_;
    const size_t bucket =
        std::lower_bound(h.bounds.begin(), h.bounds.end(), delay.delay) - h.bounds.begin();
    ++h.counts[bucket];
    ++h.total;
    h.sum += delay.delay;
  } else {
    if (job) ++(outcome == v1::OUTCOME_DROPPED ? job->dropped : job->failed);
    RecordDropLocked(record, outcome,
                     outcome == v1::OUTCOME_DROPPED ? reason : FailureCategory(reason), reason);
  }
  const uint64_t aggregate_id = outcome == v1::OUTCOME_APPLIED ? 0 : record.aggregate_id;
  const bool fails_round = outcome != v1::OUTCOME_APPLIED && record.round_member;
  const std::string round_job = record.job, round_server = record.server;
  const int64_t round = record.version;
  updates_.erase(it);
  // Without this member the synchronous round can never be complete.
  if (fails_round) {
    FailRoundLocked(round_job, round_server, round,
                    absl::StrCat("push ", transfer_id, " of the round failed: ", reason));
  }
  // Without this constituent the aggregate can never be complete.
  if (aggregate_id != 0) {
    FailAggregateLocked(aggregate_id,
                        absl::StrCat("constituent ", transfer_id, " failed: ", reason));
  }
}

void SchedulerService::FailAggregateLocked(uint64_t aggregate_id, const std::string& reason) {
  auto it = aggregates_.find(aggregate_id);
  if (it == aggregates_.end()) return;
  const AggregateRecord aggregate = std::move(it->second);
  aggregates_.erase(it);  // before failing constituents, which call back here
  v1::DaemonCommand cancel_command;
  v1::CancelDelivery* cancel = cancel_command.mutable_cancel();
  cancel->set_transfer_id(aggregate_id);
  cancel->set_server(aggregate.server);
  cancel->set_sequence(aggregate.sequence);
  cancel->set_reason(reason);
  EnqueueLocked(aggregate.host, cancel_command);
  if (JobState* job = FindJobLocked(aggregate.job)) {
    auto server = job->servers.find(aggregate.server);
    if (server != job->servers.end()) EnqueueLocked(server->second.host, cancel_command);
  }
  for (uint64_t constituent : aggregate.constituents) {
    auto record = updates_.find(constituent);
    if (record == updates_.end()) continue;
    record->second.aggregate_id = 0;  // the aggregate is gone already
    record->second.sequence = 0;      // nothing at the server waits for it
    CompleteLocked(constituent, v1::OUTCOME_FAILED,
                   absl::StrCat("its in-network aggregate failed: ", reason), 0);
  }
}

void SchedulerService::RecordDropLocked(const UpdateRecord& record, v1::Outcome outcome,
                                        const std::string& category, const std::string& reason) {
  DropView drop;
  drop.transfer_id = record.transfer_id;
  drop.job = record.job;
  drop.server = record.server;
  drop.src = record.src_host;
  drop.outcome = outcome == v1::OUTCOME_DROPPED ? "dropped" : "failed";
  drop.category = category;
  drop.reason = reason;
  drop.at_s = clock_->NowSeconds();
  ++drops_by_category_[category];
  recent_drops_.push_back(std::move(drop));
  if (recent_drops_.size() > kRecentDrops) recent_drops_.pop_front();
}

void SchedulerService::MarkHostDownLocked(const std::string& host_name, const std::string& reason) {
  auto host = hosts_.find(host_name);
  if (host == hosts_.end()) return;
  host->second.alive = false;
  host->second.streaming = false;
  host->second.commands.clear();
  MLF_LOG(WARNING) << "host " << host_name << " is down: " << reason;
  std::vector<uint64_t> aggregates_there;
  for (const auto& [id, aggregate] : aggregates_) {
    if (aggregate.host == host_name) aggregates_there.push_back(id);
  }
  for (uint64_t id : aggregates_there) {
    FailAggregateLocked(id, absl::StrCat("aggregator host ", host_name, " is down: ", reason));
  }
  std::vector<uint64_t> to_fail;
  for (auto& [id, record] : updates_) {
    JobState* job = FindJobLocked(record.job);
    if (job == nullptr) continue;
    ServerState& server = job->servers[record.server];
    const bool source_down = record.src_host == host_name;
    const bool server_down = server.host == host_name;
    if (!source_down && !server_down) continue;
    if (record.state == UpdateState::kPending) {
      auto& pending = server.pending;
      pending.erase(std::remove(pending.begin(), pending.end(), id), pending.end());
    }
    to_fail.push_back(id);
  }
  // Replica copies from or to the host are gone; a replica that is gone
  // takes its punted copies with it.
  for (auto copy = replica_copies_.begin(); copy != replica_copies_.end();) {
    if (copy->second.src_host != host_name && copy->second.replica_host != host_name) {
      ++copy;
      continue;
    }
    if (JobState* job = FindJobLocked(copy->second.job)) {
      job->servers[copy->second.server].replica.in_flight.erase(copy->first);
    }
    if (copy->second.replica_host != host_name) {
      CancelReplicaCopyLocked(copy->first, copy->second,
                              absl::StrCat("source host ", host_name, " is down"));
    }
    copy = replica_copies_.erase(copy);
  }
  for (auto& [job_name, job] : jobs_) {
    for (auto& [server_name, server] : job.servers) {
      auto replica = job.replica_hosts.find(server_name);
      if (replica != job.replica_hosts.end() && replica->second == host_name) {
        DropReplicaPendingLocked(&server, absl::StrCat("replica host ", host_name, " is down"));
      }
    }
  }
  for (uint64_t id : to_fail) {
    const UpdateRecord& record = updates_[id];
    const std::string why = record.src_host == host_name
                                ? absl::StrCat("source host ", host_name, " is down: ", reason)
                                : absl::StrCat("server host ", host_name, " is down: ", reason);
    CompleteLocked(id, v1::OUTCOME_FAILED, why, 0);
  }
}

void SchedulerService::BatchLoop() {
  const auto interval = std::chrono::duration<double, std::milli>(config_.batch_interval_ms);
  auto next = std::chrono::steady_clock::now();
  while (true) {
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(interval);
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_cv_.wait_until(lock, next, [this] { return stopping_; })) return;
    }
    RunBatchCycle();
  }
}

void SchedulerService::ReservationsLocked(
    std::map<std::string, std::vector<core::RateSegment>>* up,
    std::map<std::string, std::vector<core::RateSegment>>* down) const {
  for (const auto& [id, record] : updates_) {
    if (record.state != UpdateState::kInFlight) continue;
    auto& src = (*up)[record.planned.src];
    auto& dst = (*down)[record.planned.dst];
    src.insert(src.end(), record.planned.segments.begin(), record.planned.segments.end());
    dst.insert(dst.end(), record.planned.segments.begin(), record.planned.segments.end());
  }
  for (const auto& [id, aggregate] : aggregates_) {
    auto& src = (*up)[aggregate.planned.src];
    auto& dst = (*down)[aggregate.planned.dst];
    src.insert(src.end(), aggregate.planned.segments.begin(), aggregate.planned.segments.end());
    dst.insert(dst.end(), aggregate.planned.segments.begin(), aggregate.planned.segments.end());
  }
}

void SchedulerService::ExpireOverdueLocked(double now_s) {
  std::vector<uint64_t> overdue;
  for (const auto& [id, record] : updates_) {
    if (record.state == UpdateState::kInFlight && now_s > record.planned.deadline_s) {
      overdue.push_back(id);
    }
  }
  for (uint64_t id : overdue) {
    const UpdateRecord& record = updates_[id];
    const std::string reason = absl::StrCat(
        "timed out: transfer ", id, " from ", record.src_host, " to ", record.planned.dst,
        " was planned to end at ", record.planned.end_s, " s and was not completed within ",
        config_.transfer_slack_s, " s after that (slow or vanished daemon)");
    ++stats_.timed_out;
    CompleteLocked(id, v1::OUTCOME_FAILED, reason, 0);
  }
}

void SchedulerService::SampleLinksLocked(double now_s) {
  if (now_s - last_link_sample_s_ < kLinkSamplePeriodS) return;
  last_link_sample_s_ = now_s;
  std::map<std::string, std::vector<core::RateSegment>> up, down;
  ReservationsLocked(&up, &down);
  LinkSample sample;
  sample.at_s = now_s;
  for (const auto& [name, host] : hosts_) {
    if (!host.alive) continue;
    sample.links.push_back({name, RateAt(up[name], now_s), RateAt(down[name], now_s),
                            host.uplink_bps, host.downlink_bps});
  }
  link_samples_.push_back(std::move(sample));
  if (link_samples_.size() > kLinkSamples) link_samples_.pop_front();
}

// ------------------------------------------------------ synchronous rounds
//
// A server registered with round_size M > 0 (or any server of a sync-mode
// job, with M = the job's registered workers) runs Mercury PS rounds
// (mercury.md §IV Key idea 3, mlfabric.md §6): round v is the M pushes
// computed from model version v, one per worker. They are planned like any
// batch (list order, §6; Alg. 3 may route some through aggregators), and
// the server's daemon sums them packet by packet. A push that cannot belong
// to the open round is dropped or failed here with the reason; a member
// that fails takes its round down, so no worker waits for a sum that can
// never be complete.

namespace {
// A transfer's reserved rate segments as daemons take them (empty segments,
// which carry nothing, are left out).
void AddSegments(const std::vector<core::RateSegment>& segments,
                 google::protobuf::RepeatedPtrField<v1::RateSegment>* out) {
  for (const core::RateSegment& segment : segments) {
    if (!(segment.to_s > segment.from_s)) continue;
    v1::RateSegment* s = out->Add();
    s->set_from_s(segment.from_s);
    s->set_to_s(segment.to_s);
    s->set_rate_bps(segment.rate_bps);
  }
}

const char* DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return "float32";
    case v1::DTYPE_FLOAT64: return "float64";
    case v1::DTYPE_INT32: return "int32";
    case v1::DTYPE_INT64: return "int64";
    case v1::DTYPE_OPAQUE: return "opaque bytes";
    default: return "an unknown type";
  }
}
}  // namespace

int32_t SchedulerService::RoundSizeLocked(const JobState& job, const ServerState& server) const {
  if (server.round_size > 0) return server.round_size;
  if (job.config.mode == "sync") return static_cast<int32_t>(job.workers.size());
  return 0;
}

double SchedulerService::DivergenceBoundLocked(const JobState& job) const {
  double bound = job.config.divergence_max;
  for (const auto& [name, worker] : job.workers) {
    if (worker.divergence_bound > 0) {
      bound = bound > 0 ? std::min(bound, worker.divergence_bound) : worker.divergence_bound;
    }
  }
  return bound;
}

void SchedulerService::CancelReplicaCopyLocked(uint64_t copy_id, const ReplicaCopy& copy,
                                               const std::string& reason) {
  // The replica's daemon delivers in sequence: tell it to skip this one.
  v1::DaemonCommand command;
  v1::CancelDelivery* cancel = command.mutable_cancel();
  cancel->set_transfer_id(copy_id);
  cancel->set_server("replica:" + copy.server);
  cancel->set_sequence(copy.sequence);
  cancel->set_reason(reason);
  EnqueueLocked(copy.replica_host, std::move(command));
}

void SchedulerService::DropReplicaPendingLocked(ServerState* server, const std::string& reason) {
  for (const PendingReplica& pending : server->replica.pending) {
    v1::DaemonCommand command;
    v1::CancelDelivery* release = command.mutable_cancel();
    release->set_transfer_id(pending.id);
    release->set_release_hold(true);
    release->set_reason(reason);
    EnqueueLocked(pending.src_host, std::move(command));
  }
  if (!server->replica.pending.empty()) {
    MLF_LOG(WARNING) << "dropping " << server->replica.pending.size()
                     << " punted replica copies: " << reason;
  }
  server->replica.pending.clear();
}

int64_t SchedulerService::DelayBoundLocked(const JobState& job) const {
  int64_t bound = job.config.mode == "ssp" ? job.config.staleness_k : job.config.tau_max;
  for (const auto& [name, worker] : job.workers) {
    if (worker.delay_bound >= 0) bound = std::min(bound, worker.delay_bound);
  }
  return bound;
}

bool SchedulerService::AdmitToRoundLocked(JobState* job, ServerState* server,
                                          int32_t round_size, UpdateRecord* record) {
  const int64_t round = record->version;
  const uint64_t id = record->transfer_id;
  // Rounds before the previous one can no longer be joined: forget them.
  server->rounds.erase(server->rounds.begin(),
                       server->rounds.lower_bound(server->model_version - 1));
  if (auto known = server->rounds.find(round);
      known != server->rounds.end() && !known->second.failed.empty()) {
    CompleteLocked(id, v1::OUTCOME_FAILED,
                   absl::StrCat("round ", round, " failed: ", known->second.failed), 0);
    return false;
  }
  if (round < server->model_version) {
    CompleteLocked(id, v1::OUTCOME_DROPPED,
                   absl::StrCat("stale: round ", round, " is over (the server is at version ",
                                server->model_version, "); get the new sum and push again"),
                   0);
    return false;
  }
  // A worker pushes round v + 1 only after getting round v's sum, which it
  // may have before the scheduler hears that round v is applied.
  if (round > server->model_version + 1) {
    CompleteLocked(id, v1::OUTCOME_DROPPED,
                   absl::StrCat("future round ", round, ": the server is at version ",
                                server->model_version,
                                "; push with the version your last get returned"),
                   0);
    return false;
  }
  RoundState& state = server->rounds[round];
  if (state.workers.count(record->worker)) {
    CompleteLocked(id, v1::OUTCOME_DROPPED,
                   absl::StrCat("duplicate: worker '", record->worker,
                                "' already has a push in round ", round),
                   0);
    return false;
  }
  if (static_cast<int32_t>(state.workers.size()) >= round_size) {
    CompleteLocked(id, v1::OUTCOME_DROPPED,
                   absl::StrCat("round ", round, " already has its ", round_size, " pushes"), 0);
    return false;
  }
  if (record->dtype == v1::DTYPE_OPAQUE) {
    const std::string reason = absl::StrCat(
        "a synchronous round sums its pushes: push ", id, " from '", record->worker,
        "' is opaque bytes; push float32, float64, int32 or int64");
    const std::string job_name = record->job, server_name = record->server;
    CompleteLocked(id, v1::OUTCOME_FAILED, reason, 0);  // erases *record
    FailRoundLocked(job_name, server_name, round, reason);
    return false;
  }
  if (state.bytes >= 0 && (state.bytes != record->bytes || state.dtype != record->dtype)) {
    // "mismatch:" lets AllReduce tell callers the inputs differ across ranks.
    const std::string reason = absl::StrCat(
        "mismatch: push ", id, " from '", record->worker, "' has ", record->bytes, " bytes of ",
        DTypeName(record->dtype), " but round ", round, " sums ", state.bytes, " bytes of ",
        DTypeName(state.dtype), " (every rank must pass the same shape and type)");
    const std::string job_name = record->job, server_name = record->server;
    CompleteLocked(id, v1::OUTCOME_FAILED, reason, 0);  // erases *record
    FailRoundLocked(job_name, server_name, round, reason);
    return false;
  }
  state.bytes = record->bytes;
  state.dtype = record->dtype;
  state.workers.insert(record->worker);
  record->round_member = true;
  return true;
}

void SchedulerService::FailRoundLocked(const std::string& job_name, const std::string& server_name,
                                       int64_t round, const std::string& reason) {
  JobState* job = FindJobLocked(job_name);
  if (job == nullptr) return;
  auto server = job->servers.find(server_name);
  if (server == job->servers.end()) return;
  RoundState& state = server->second.rounds[round];
  if (!state.failed.empty()) return;  // already failing (re-entered from CompleteLocked)
  state.failed = reason;
  // A failed round still uses its number: the workers' next round is
  // round + 1, so one bad round does not wedge the collective.
  server->second.model_version = std::max(server->second.model_version, round + 1);
  MLF_LOG(WARNING) << "job " << job_name << ": round " << round << " of server " << server_name
                   << " failed: " << reason;
  v1::DaemonCommand command;
  v1::CancelDelivery* cancel = command.mutable_cancel();
  cancel->set_server(server_name);
  cancel->set_fail_round(true);
  cancel->set_round(round);
  cancel->set_job_id(job->id);
  cancel->set_reason(reason);
  EnqueueLocked(server->second.host, std::move(command));
  std::vector<uint64_t> members;
  for (const auto& [id, record] : updates_) {
    if (record.job == job_name && record.server == server_name && record.version == round &&
        (record.round_member || record.state == UpdateState::kPending)) {
      members.push_back(id);
    }
  }
  for (uint64_t id : members) {
    auto& pending = server->second.pending;
    pending.erase(std::remove(pending.begin(), pending.end(), id), pending.end());
    CompleteLocked(id, v1::OUTCOME_FAILED, absl::StrCat("round ", round, " failed: ", reason), 0);
  }
}

void SchedulerService::RunBatchCycle() {
  std::vector<BatchWork> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const double now_s = clock_->NowSeconds();
    ExpireOverdueLocked(now_s);
    SampleLinksLocked(now_s);
    const bool use_reservations = planner_->Name() != "fifo";
    std::map<std::string, std::vector<core::RateSegment>> up, down;
    if (use_reservations) ReservationsLocked(&up, &down);
    for (auto& [job_name, job] : jobs_) {
      for (auto& [server_name, server] : job.servers) {
        // A server with no new pushes may still owe its replica copies
        // punted earlier (§5.3: they go "along with the next batch").
        const bool flush_replica = !server.replica.pending.empty() &&
                                   job.replica_hosts.count(server_name) > 0 && use_reservations;
        if (server.pending.empty() && !flush_replica) continue;
        const int32_t round_size = RoundSizeLocked(job, server);
        if (round_size > 0) {
          const std::vector<uint64_t> candidates = server.pending;
          server.pending.clear();
          for (uint64_t id : candidates) {
            auto record = updates_.find(id);
            if (record == updates_.end()) continue;
            if (AdmitToRoundLocked(&job, &server, round_size, &record->second)) {
              server.pending.push_back(id);
            }
          }
          if (server.pending.empty()) continue;
        }
        BatchWork item;
        item.batch_id = next_batch_id_++;
        item.job = job_name;
        item.server = server_name;
        item.priority_class = job.config.priority_class;
        item.round_size = round_size;
        core::Batch& batch = item.batch;
        batch.now_s = now_s;
        batch.mode = job.config.mode == "sync" || round_size > 0 ? core::Mode::kSync
                                                                 : core::Mode::kAsync;
        // The core has no stale-synchronous mode: a staleness bound of K
        // versions is the async delay bound tau_max = K. Workers may have
        // registered tighter bounds (Table 1, registerAsWorker(params)).
        batch.tau_max = DelayBoundLocked(job);
        // Updates already scheduled commit before this batch's (§5.1).
        batch.v_init = server.model_version + server.in_flight;
        batch.server = server.host;
        batch.seed = item.batch_id;
        std::set<std::string> involved = {server.host};
        // In-network aggregation sums element-wise: only updates of one
        // numeric type and one size can share an aggregate.
        // §6: a synchronous round's aggregation tree is built over the
        // job's own workers unless the job names its aggregators.
        std::vector<std::string> candidates = job.config.aggregators;
        if (candidates.empty() && round_size > 0) {
          for (const auto& [name, worker] : job.workers) candidates.push_back(worker.host);
          std::sort(candidates.begin(), candidates.end());
          candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
        }
        bool aggregatable = !candidates.empty() && !server.pending.empty();
        const UpdateRecord& first =
            server.pending.empty() ? UpdateRecord{} : updates_[server.pending.front()];
        for (uint64_t id : server.pending) {
          const UpdateRecord& record = updates_[id];
          batch.updates.push_back({std::to_string(id), record.src_host, record.bytes,
                                   record.version, record.norm});
          involved.insert(record.src_host);
          // Only members of one round may be summed together.
          // The aggregators' kernels sum floating point (aggregator/reduce.h).
          aggregatable = aggregatable &&
                         (record.dtype == v1::DTYPE_FLOAT32 || record.dtype == v1::DTYPE_FLOAT64) &&
                         record.dtype == first.dtype && record.bytes == first.bytes &&
                         (round_size == 0 || record.version == first.version);
        }
        if (aggregatable) {
          for (const std::string& name : candidates) {
            auto host = hosts_.find(name);
            if (name == server.host || host == hosts_.end() || !host->second.alive ||
                host->second.draining) {
              continue;
            }
            batch.aggregators.push_back(name);
            involved.insert(name);
          }
        }
        // §5.3: a registered replica gets this batch's updates (and the
        // copies punted earlier) within the divergence bound.
        if (auto replica = job.replica_hosts.find(server_name);
            round_size == 0 && use_reservations && replica != job.replica_hosts.end()) {
          auto replica_host = hosts_.find(replica->second);
          if (replica_host != hosts_.end() && replica_host->second.alive &&
              replica->second != server.host) {
            core::ReplicaSpec spec;
            spec.host = replica->second;
            const double bound = DivergenceBoundLocked(job);
            spec.divergence_bound = bound > 0 ? bound : 1e30;  // none: copies go as they can
            spec.momentum = job.config.momentum;
            for (const auto& [copy, norm] : server.replica.in_flight) spec.lead.push_back(norm);
            auto& punted = server.replica.pending;
            punted.erase(std::remove_if(punted.begin(), punted.end(),
                                        [&](const PendingReplica& p) {
                                          auto src = hosts_.find(p.src_host);
                                          return src == hosts_.end() || !src->second.alive;
                                        }),
                         punted.end());
            for (const PendingReplica& p : server.replica.pending) {
              core::UpdateRequest request;
              request.id = std::to_string(p.id);
              request.worker = p.src_host;
              request.bytes = p.bytes;
              request.version = p.version;
              request.norm = p.norm;
              spec.pending.push_back(std::move(request));
              involved.insert(p.src_host);
            }
            involved.insert(spec.host);
            batch.replica = std::move(spec);
          } else if (!server.replica.pending.empty()) {
            DropReplicaPendingLocked(&server, absl::StrCat("replica host ", replica->second,
                                                           " is not available"));
          }
        }
        for (const std::string& name : involved) {
          const HostState& host = hosts_[name];
          core::HostLink link{name, host.uplink_bps, host.downlink_bps, {}, {}};
          if (use_reservations) {
            if (up.count(name)) link.uplink_profile = ResidualProfile(host.uplink_bps, now_s, up[name]);
            if (down.count(name)) {
              link.downlink_profile = ResidualProfile(host.downlink_bps, now_s, down[name]);
            }
          }
          batch.hosts.push_back(std::move(link));
        }
        work.push_back(std::move(item));
      }
    }
    if (!work.empty()) ++stats_.batches;
  }
  if (work.empty()) return;
  // Urgent priority classes first: with fewer threads than batches they are
  // planned (and dispatched) first.
  std::stable_sort(work.begin(), work.end(), [](const BatchWork& a, const BatchWork& b) {
    return a.priority_class < b.priority_class;
  });
  PlanAll(&work);
  for (const BatchWork& item : work) {
    MLF_LOG(DEBUG) << "job " << item.job << " server " << item.server << ": "
                   << item.batch.updates.size() << " updates planned in " << item.compute_ms
                   << " ms on thread " << item.worker_thread;
    ApplyPlan(item);
  }
}

void SchedulerService::PlanAll(std::vector<BatchWork>* work) const {
  std::atomic<size_t> next{0};
  auto run = [&](int thread_index) {
    for (size_t i = next.fetch_add(1); i < work->size(); i = next.fetch_add(1)) {
      BatchWork& item = (*work)[i];
      const auto started = std::chrono::steady_clock::now();
      item.plan = planner_->PlanBatch(item.batch);
      item.compute_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
              .count();
      item.worker_thread = thread_index;
    }
  };
  const int threads = std::min<int>(planner_threads_, static_cast<int>(work->size()));
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(run, t);
  run(0);
  for (std::thread& helper : helpers) helper.join();
}

void SchedulerService::ApplyPlan(const BatchWork& work) {
  const absl::StatusOr<core::Plan>& plan = work.plan;
  std::lock_guard<std::mutex> lock(mu_);
  JobState* job = FindJobLocked(work.job);
  if (job == nullptr) return;
  stats_.plan_ms_total += work.compute_ms;
  stats_.plan_ms_max = std::max(stats_.plan_ms_max, work.compute_ms);
  BatchView view;
  view.id = work.batch_id;
  view.job = work.job;
  view.server = work.server;
  view.server_host = work.batch.server;
  view.planned_at_s = work.batch.now_s;
  view.compute_ms = work.compute_ms;
  view.worker_thread = work.worker_thread;
  view.updates = static_cast<int64_t>(work.batch.updates.size());
  view.network = work.batch.hosts;
  if (plan.ok()) view.drops = plan->dropped;
  else view.error = std::string(plan.status().message());
  view.dropped = static_cast<int64_t>(view.drops.size());
  // Recorded on every return path below.
  struct Record {
    SchedulerService* self;
    BatchView* view;
    ~Record() {
      self->recent_batches_.push_back(std::move(*view));
      while (self->recent_batches_.size() > static_cast<size_t>(self->config_.history_batches)) {
        self->recent_batches_.pop_front();
      }
    }
  } record_on_exit{this, &view};
  ServerState& server = job->servers[work.server];
  std::set<uint64_t> in_batch;
  for (const core::UpdateRequest& update : work.batch.updates) {
    in_batch.insert(std::stoull(update.id));
  }
  // Updates that failed while the batch was being planned are gone already.
  auto& pending = server.pending;
  pending.erase(std::remove_if(pending.begin(), pending.end(),
                               [&](uint64_t id) { return in_batch.count(id) > 0; }),
                pending.end());
  if (!plan.ok()) {
    MLF_LOG(ERROR) << "planner " << planner_->Name() << " failed for server " << work.server
                   << ": " << plan.status().message();
    for (uint64_t id : in_batch) {
      CompleteLocked(id, v1::OUTCOME_FAILED,
                     absl::StrCat("scheduler could not plan: ", plan.status().message()), 0);
    }
    return;
  }
  const auto server_host = hosts_.find(server.host);
  if (server_host == hosts_.end() || !server_host->second.alive) {
    for (uint64_t id : in_batch) {
      CompleteLocked(id, v1::OUTCOME_FAILED, absl::StrCat("server host ", server.host, " is down"),
                     0);
    }
    return;
  }
  for (const core::Drop& drop : plan->dropped) {
    const uint64_t id = std::stoull(drop.id);
    if (updates_.count(id)) CompleteLocked(id, v1::OUTCOME_DROPPED, drop.reason, 0);
  }
  std::map<std::string, const core::Transfer*> direct;
  std::map<std::string, const core::Transfer*> to_aggregator;
  std::map<std::string, const core::Transfer*> aggregate_of;  // constituent -> aggregate
  for (const core::Transfer& transfer : plan->transfers) {
    if (transfer.kind == core::TransferKind::kDirect) direct[transfer.update] = &transfer;
    if (transfer.kind == core::TransferKind::kToAggregator) {
      to_aggregator[transfer.update] = &transfer;
    }
    if (transfer.kind == core::TransferKind::kAggregate) {
      for (const std::string& constituent : transfer.constituents) {
        aggregate_of[constituent] = &transfer;
      }
    }
  }
  std::map<const core::Transfer*, uint64_t> aggregate_ids;
  // Opens the aggregate the first time one of its constituents comes up in
  // the commit order; returns its id, or 0 when it cannot be carried out.
  auto open_aggregate = [&](const core::Transfer& transfer) -> uint64_t {
    if (auto known = aggregate_ids.find(&transfer); known != aggregate_ids.end()) {
      return known->second;
    }
    uint64_t id = 0;
    auto host = hosts_.find(transfer.src);
    std::vector<uint64_t> constituents;
    for (const std::string& text : transfer.constituents) {
      const uint64_t constituent = std::stoull(text);
      if (updates_.count(constituent)) constituents.push_back(constituent);
    }
    if (host != hosts_.end() && host->second.alive && !constituents.empty()) {
      id = next_transfer_id_++;
      AggregateRecord& aggregate = aggregates_[id];
      aggregate.id = id;
      aggregate.job = work.job;
      aggregate.server = work.server;
      aggregate.host = transfer.src;
      aggregate.constituents = constituents;
      aggregate.sequence = server.next_sequence++;
      TransferView& planned = aggregate.planned;
      planned.transfer_id = id;
      planned.batch_id = work.batch_id;
      planned.job = work.job;
      planned.server = work.server;
      planned.src = transfer.src;
      planned.dst = server.host;
      planned.bytes = transfer.bytes;
      planned.start_s = transfer.start_s;
      planned.end_s = transfer.end_s;
      planned.deadline_s = transfer.end_s + config_.transfer_slack_s;
      planned.segments = transfer.segments;
      view.transfers.push_back(planned);
      const UpdateRecord& first = updates_[constituents.front()];

      v1::DaemonCommand expect_command;
      v1::ExpectDelivery* expect = expect_command.mutable_expect();
      expect->set_transfer_id(id);
      expect->set_job_id(job->id);
      expect->set_server(work.server);
      expect->set_sequence(aggregate.sequence);
      expect->set_bytes(transfer.bytes);
      expect->set_src_host(transfer.src);
      expect->set_worker(absl::StrCat("aggregate of ", constituents.size()));
      expect->set_version(first.version);
      for (uint64_t constituent : constituents) expect->add_constituents(constituent);
      if (work.round_size > 0) {
        expect->set_round_size(work.round_size);
        expect->set_contributions(static_cast<int32_t>(constituents.size()));
        expect->set_dtype(first.dtype);
      }
      EnqueueLocked(server.host, std::move(expect_command));

      v1::DaemonCommand task_command;
      v1::AggregateTask* task = task_command.mutable_aggregate();
      task->set_aggregate_id(id);
      task->set_job_id(job->id);
      for (uint64_t constituent : constituents) {
        task->add_constituents(constituent);
        task->add_weights(1.0);  // asynchronous updates are summed as they are
      }
      task->set_dst_host(server.host);
      task->set_dst_address(server_host->second.data_address);
      task->set_start_s(transfer.start_s);
      AddSegments(transfer.segments, task->mutable_segments());
      task->set_bytes(transfer.bytes);
      task->set_dtype(first.dtype);
      EnqueueLocked(transfer.src, std::move(task_command));
      ++stats_.aggregates;
    }
    aggregate_ids[&transfer] = id;
    return id;
  };
  for (const std::string& id_text : plan->order) {
    const uint64_t id = std::stoull(id_text);
    auto it = updates_.find(id);
    if (it == updates_.end()) continue;  // failed meanwhile
    UpdateRecord& record = it->second;
    auto transfer = direct.find(id_text);
    if (transfer == direct.end()) {
      auto hop = to_aggregator.find(id_text);
      auto aggregate = aggregate_of.find(id_text);
      if (hop == to_aggregator.end() || aggregate == aggregate_of.end()) {
        CompleteLocked(id, v1::OUTCOME_FAILED,
                       "the plan has no transfer for this update (planner bug)", 0);
        continue;
      }
      const uint64_t aggregate_id = open_aggregate(*aggregate->second);
      if (aggregate_id == 0) {
        CompleteLocked(id, v1::OUTCOME_FAILED,
                       absl::StrCat("aggregator host ", aggregate->second->src, " is down"), 0);
        continue;
      }
      const core::Transfer& to_agg = *hop->second;
      auto aggregator = hosts_.find(to_agg.dst);
      record.state = UpdateState::kInFlight;
      record.sequence = aggregates_[aggregate_id].sequence;
      record.aggregate_id = aggregate_id;
      ++server.in_flight;
      TransferView& planned = record.planned;
      planned.transfer_id = id;
      planned.batch_id = work.batch_id;
      planned.job = work.job;
      planned.server = work.server;
      planned.src = record.src_host;
      planned.dst = to_agg.dst;
      planned.bytes = record.bytes;
      planned.start_s = to_agg.start_s;
      planned.end_s = to_agg.end_s;
      // It is applied only when its aggregate is.
      planned.deadline_s = aggregate->second->end_s + config_.transfer_slack_s +
                           (work.round_size > 0 ? config_.round_timeout_s : 0);
      planned.segments = to_agg.segments;
      view.transfers.push_back(planned);
      ++view.scheduled;

      v1::DaemonCommand send_command;
      v1::SendTransfer* send = send_command.mutable_send();
      send->set_transfer_id(id);
      send->set_job_id(job->id);
      send->set_dst_host(to_agg.dst);
      send->set_dst_address(aggregator->second.data_address);
      send->set_start_s(to_agg.start_s);
      send->set_bytes(record.bytes);
      AddSegments(to_agg.segments, send->mutable_segments());
      EnqueueLocked(record.src_host, std::move(send_command));
      ++stats_.planned;
      continue;
    }
    record.state = UpdateState::kInFlight;
    record.sequence = server.next_sequence++;
    ++server.in_flight;
    TransferView& planned = record.planned;
    planned.transfer_id = id;
    planned.batch_id = work.batch_id;
    planned.job = work.job;
    planned.server = work.server;
    planned.src = record.src_host;
    planned.dst = server.host;
    planned.bytes = record.bytes;
    planned.start_s = transfer->second->start_s;
    planned.end_s = transfer->second->end_s;
    planned.deadline_s = planned.end_s + config_.transfer_slack_s;
    planned.segments = transfer->second->segments;
    view.transfers.push_back(planned);
    ++view.scheduled;

    v1::DaemonCommand expect_command;
    v1::ExpectDelivery* expect = expect_command.mutable_expect();
    expect->set_transfer_id(id);
    expect->set_job_id(job->id);
    expect->set_server(work.server);
    expect->set_sequence(record.sequence);
    expect->set_bytes(record.bytes);
    expect->set_src_host(record.src_host);
    expect->set_worker(record.worker);
    expect->set_version(record.version);
    expect->set_norm(record.norm);
    if (work.round_size > 0) {
      expect->set_round_size(work.round_size);
      expect->set_contributions(1);
      expect->set_dtype(record.dtype);
      planned.deadline_s += config_.round_timeout_s;
    }
    EnqueueLocked(server.host, std::move(expect_command));

    v1::DaemonCommand send_command;
    v1::SendTransfer* send = send_command.mutable_send();
    send->set_transfer_id(id);
    send->set_job_id(job->id);
    send->set_dst_host(server.host);
    send->set_dst_address(server_host->second.data_address);
    send->set_start_s(transfer->second->start_s);
    send->set_bytes(record.bytes);
    AddSegments(transfer->second->segments, send->mutable_segments());
    EnqueueLocked(record.src_host, std::move(send_command));
    ++stats_.planned;
  }
  DispatchReplicaLocked(work, *plan, job, &server);
}

void SchedulerService::DispatchReplicaLocked(const BatchWork& work, const core::Plan& plan,
                                             JobState* job, ServerState* server) {
  auto replica = job->replica_hosts.find(work.server);
  if (replica == job->replica_hosts.end() || !work.batch.replica.has_value()) return;
  auto replica_host = hosts_.find(replica->second);
  if (replica_host == hosts_.end() || !replica_host->second.alive) return;
  std::map<std::string, const core::Transfer*> copies;
  for (const core::Transfer& t : plan.transfers) {
    if (t.kind == core::TransferKind::kReplica && t.dst == replica->second) copies[t.update] = &t;
  }
  // Copies go in the replica's commit order, which is also its delivery
  // order (§5.3).
  for (const core::Commit& commit : plan.replica_commits) {
    auto transfer = copies.find(commit.update);
    if (transfer == copies.end()) continue;
    const uint64_t source = std::stoull(commit.update);
    PendingReplica what;
    if (auto record = updates_.find(source); record != updates_.end()) {
      what = {source, record->second.src_host, record->second.worker, record->second.bytes,
              record->second.version, record->second.norm};
    } else {
      auto& pending = server->replica.pending;
      auto held = std::find_if(pending.begin(), pending.end(),
                               [&](const PendingReplica& p) { return p.id == source; });
      if (held == pending.end()) continue;  // failed meanwhile
      what = *held;
      pending.erase(held);
    }
    const uint64_t copy = next_transfer_id_++;
    replica_copies_[copy] = {work.job, work.server, source, what.src_host, replica->second,
                             server->replica.next_sequence};
    server->replica.in_flight[copy] = what.norm;

    v1::DaemonCommand expect_command;
    v1::ExpectDelivery* expect = expect_command.mutable_expect();
    expect->set_transfer_id(copy);
    expect->set_job_id(job->id);
    expect->set_server("replica:" + work.server);
    expect->set_sequence(server->replica.next_sequence++);
    expect->set_bytes(what.bytes);
    expect->set_src_host(what.src_host);
    expect->set_worker(what.worker);
    expect->set_version(what.version);
    expect->set_norm(what.norm);
    EnqueueLocked(replica->second, std::move(expect_command));

    v1::DaemonCommand send_command;
    v1::SendTransfer* send = send_command.mutable_send();
    send->set_transfer_id(copy);
    send->set_source_transfer_id(source);
    send->set_job_id(job->id);
    send->set_dst_host(replica->second);
    send->set_dst_address(replica_host->second.data_address);
    send->set_start_s(transfer->second->start_s);
    send->set_bytes(what.bytes);
    AddSegments(transfer->second->segments, send->mutable_segments());
    EnqueueLocked(what.src_host, std::move(send_command));
    ++stats_.replica_copies;
  }
  for (const std::string& id_text : plan.punted) {
    auto record = updates_.find(std::stoull(id_text));
    if (record != updates_.end()) record->second.replica_punted = true;
  }
}

}  // namespace mlfabric
