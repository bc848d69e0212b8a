#include "scheduler/service/scheduler_service.h"

#include <algorithm>
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

}  // namespace

SchedulerService::SchedulerService(SchedulerConfig config, const Clock* clock,
                                   std::unique_ptr<core::Planner> planner)
    : config_(std::move(config)), clock_(clock), planner_(std::move(planner)) {
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
  if (batch_thread_.joinable()) batch_thread_.join();
}

SchedulerService::Stats SchedulerService::GetStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
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
  host.uplink_bps = request->uplink_bps() > 0 ? request->uplink_bps() : config_.default_link_bps;
  host.downlink_bps =
      request->downlink_bps() > 0 ? request->downlink_bps() : config_.default_link_bps;
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
      ServerState& server = job->servers[request->name()];
      server.host = request->host();
      reply->set_model_version(server.model_version);
      MLF_LOG(INFO) << "job " << request->job() << ": server " << request->name() << " on "
                    << request->host();
      break;
    }
    case v1::ROLE_WORKER:
    case v1::ROLE_REPLICA:
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
  std::lock_guard<std::mutex> lock(mu_);
  auto reject = [&](grpc::Status status) {
    ++stats_.rejected;
    MLF_LOG(WARNING) << "rejected push from " << request->src_host() << ": "
                     << status.error_message();
    return status;
  };
  JobState* job = FindJobLocked(request->job());
  if (job == nullptr) return reject(Invalid(absl::StrCat("unknown job '", request->job(), "'")));
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
  auto server = job->servers.find(request->server());
  if (server == job->servers.end()) {
    return reject(Precondition(absl::StrCat("server '", request->server(), "' of job '",
                                            request->job(), "' is not registered")));
  }
  auto server_host = hosts_.find(server->second.host);
  if (server_host == hosts_.end() || !server_host->second.alive) {
    return reject(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               absl::StrCat("server '", request->server(), "' is down (host '",
                                            server->second.host, "')")));
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
        if (outcome != v1::OUTCOME_APPLIED) {
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
  updates_.erase(it);
}

void SchedulerService::MarkHostDownLocked(const std::string& host_name, const std::string& reason) {
  auto host = hosts_.find(host_name);
  if (host == hosts_.end()) return;
  host->second.alive = false;
  host->second.streaming = false;
  host->second.commands.clear();
  MLF_LOG(WARNING) << "host " << host_name << " is down: " << reason;
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
    PlanPendingBatches();
  }
}

void SchedulerService::PlanPendingBatches() {
  std::vector<BatchWork> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const double now_s = clock_->NowSeconds();
    for (auto& [job_name, job] : jobs_) {
      for (auto& [server_name, server] : job.servers) {
        if (server.pending.empty()) continue;
        BatchWork item;
        item.job = job_name;
        item.server = server_name;
        core::Batch& batch = item.batch;
        batch.now_s = now_s;
        batch.mode = job.config.mode == "sync" ? core::Mode::kSync : core::Mode::kAsync;
        batch.tau_max = job.config.tau_max;
        // Updates already scheduled commit before this batch's (§5.1).
        batch.v_init = server.model_version + server.in_flight;
        batch.server = server.host;
        batch.seed = static_cast<uint64_t>(stats_.batches + 1);
        std::set<std::string> involved = {server.host};
        for (uint64_t id : server.pending) {
          const UpdateRecord& record = updates_[id];
          batch.updates.push_back({std::to_string(id), record.src_host, record.bytes,
                                   record.version, record.norm});
          involved.insert(record.src_host);
        }
        for (const std::string& name : involved) {
          const HostState& host = hosts_[name];
          batch.hosts.push_back({name, host.uplink_bps, host.downlink_bps, {}, {}});
        }
        work.push_back(std::move(item));
      }
    }
    if (!work.empty()) ++stats_.batches;
  }
  for (const BatchWork& item : work) {
    const auto started = std::chrono::steady_clock::now();
    absl::StatusOr<core::Plan> plan = planner_->PlanBatch(item.batch);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    MLF_LOG(DEBUG) << "job " << item.job << " server " << item.server << ": "
                   << item.batch.updates.size() << " updates planned in " << ms << " ms";
    ApplyPlan(item, plan);
  }
}

void SchedulerService::ApplyPlan(const BatchWork& work, const absl::StatusOr<core::Plan>& plan) {
  std::lock_guard<std::mutex> lock(mu_);
  JobState* job = FindJobLocked(work.job);
  if (job == nullptr) return;
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
  for (const core::Transfer& transfer : plan->transfers) {
    if (transfer.kind == core::TransferKind::kDirect) direct[transfer.update] = &transfer;
  }
  for (const std::string& id_text : plan->order) {
    const uint64_t id = std::stoull(id_text);
    auto it = updates_.find(id);
    if (it == updates_.end()) continue;  // failed meanwhile
    UpdateRecord& record = it->second;
    auto transfer = direct.find(id_text);
    if (transfer == direct.end()) {
      // Aggregated transfers need the aggregating data plane (issue 4).
      CompleteLocked(id, v1::OUTCOME_FAILED,
                     "plan routes the update through an aggregator, which this data plane "
                     "does not support yet",
                     0);
      continue;
    }
    record.state = UpdateState::kInFlight;
    record.sequence = server.next_sequence++;
    ++server.in_flight;

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
    EnqueueLocked(server.host, std::move(expect_command));

    v1::DaemonCommand send_command;
    v1::SendTransfer* send = send_command.mutable_send();
    send->set_transfer_id(id);
    send->set_job_id(job->id);
    send->set_dst_host(server.host);
    send->set_dst_address(server_host->second.data_address);
    send->set_start_s(transfer->second->start_s);
    send->set_bytes(record.bytes);
    for (const core::RateSegment& segment : transfer->second->segments) {
      v1::RateSegment* out = send->add_segments();
      out->set_from_s(segment.from_s);
      out->set_to_s(segment.to_s);
      out->set_rate_bps(segment.rate_bps);
    }
    EnqueueLocked(record.src_host, std::move(send_command));
    ++stats_.planned;
  }
}

}  // namespace mlfabric
