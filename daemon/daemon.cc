// Daemon: construction of the parts, start-up (listening sockets, host
// registration, threads), shutdown, clock synchronisation, the bandwidth
// monitor and an application's leaving. The schedule stream and its
// commands are in daemon_control.cc.
#include "daemon/daemon.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "daemon/daemon_internal.h"
#include "daemon/nicprio/tc_runner.h"

namespace mlfabric {

namespace {

daemon::JobPriorityPolicy MakeJobPriorityPolicy(const DaemonConfig& config) {
  daemon::JobPriorityOptions options;
  options.mode = daemon::ParseJobPriorityMode(config.job_priority).value_or(
      daemon::JobPriorityMode::kFifo);  // the config loader accepts only valid names
  options.rotation_period_s = config.job_priority_period_s;
  return daemon::JobPriorityPolicy(options);
}

// Completion reports for the pushes that a registration named handed to a
// server application and unacknowledged, and that the application
// acknowledged while the registration was in flight. Their own reports
// went out signed with the session the registration replaced, and a
// restarted scheduler refused them; it would wait for those
// acknowledgements forever, and the pushes' sources with it (in doubt).
// A push neither applied nor still handed over was refused.
std::vector<v1::CompletionReport> AcknowledgedDuringRegistration(
    const daemon::AppliedLog& log, std::set<uint64_t> unacknowledged, const std::string& host) {
  std::vector<v1::CompletionReport> reports;
  if (unacknowledged.empty()) return reports;
  auto report = [&](uint64_t push) -> v1::CompletionReport& {
    v1::CompletionReport& r = reports.emplace_back();
    r.set_host(host);
    r.set_transfer_id(push);
    r.add_pushes(push);  // the scheduler knows the push, not its delivery
    return r;
  };
  for (const daemon::AppliedLog::Entry& entry : log.Report()) {
    if (unacknowledged.erase(entry.push) == 0 || !entry.acknowledged) continue;
    v1::CompletionReport& applied = report(entry.push);
    applied.set_applied(true);
    applied.set_model_version(entry.model_version);
  }
  for (uint64_t push : unacknowledged) {
    v1::CompletionReport& refused = report(push);
    refused.set_applied(false);
    refused.set_error("server refused the update");
  }
  return reports;
}

// A push as a restarted scheduler needs it (InDoubtPush, HeldSource: the
// same fields), should its replica need a copy.
template <typename Message>
void DescribePush(uint64_t transfer_id, const daemon::PushTable::Push& push, Message* out) {
  out->set_transfer_id(transfer_id);
  out->set_job(push.app ? push.app->job : "");
  out->set_server(push.server);
  out->set_worker(push.app ? push.app->name : "");
  out->set_bytes(push.buffer ? static_cast<int64_t>(push.buffer->size()) : 0);
  out->set_version(push.version);
  out->set_norm(push.norm);
  out->set_dtype(push.dtype);
}

void DescribeApplied(const daemon::AppliedLog::Entry& entry, v1::AppliedPush* out) {
  out->set_transfer_id(entry.push);
  out->set_model_version(entry.model_version);
  out->set_acknowledged(entry.acknowledged);
}

}  // namespace

Daemon::Daemon(DaemonConfig config, const Clock* clock,
               std::unique_ptr<daemon::SchedulerClient> scheduler)
    : config_(std::move(config)),
      send_watchdog_(std::make_unique<transport::SendWatchdog>(config_.send_timeout_s)),
      clock_(clock != nullptr ? clock : &real_clock_),
      scheduler_(std::move(scheduler)),
      aggregation_table_(static_cast<uint32_t>(config_.payload_bytes)) {
  if (scheduler_ == nullptr) {  // connects when first used
    scheduler_ = daemon::MakeGrpcSchedulerClient(
        config_.scheduler, config_.keepalive_s,
        daemon::ClientSecurity{config_.cluster_secret, config_.scheduler_ca_pem,
                               config_.tls_cert_pem, config_.tls_key_pem,
                               config_.scheduler_tls_name});
  }
  resolver_ = std::make_unique<daemon::ServerResolver>(scheduler_.get(), clock_,
                                                       config_.resolve_ttl_s);
  reporter_ = std::make_unique<daemon::CompletionReporter>(scheduler_.get(), config_.host);
  // Data sessions authenticate with the keys the scheduler hands out
  // (transport/data_auth.h); until it does (or when it turns data-plane
  // authentication off) there is no handshake.
  get_client_ = std::make_unique<transport::GetClient>(
      io_, *send_watchdog_, kMaxIdleGetConnections, static_cast<uint64_t>(kMaxTransferBytes),
      &data_keys_, config_.host, config_.keepalive_s);
  peers_ = std::make_unique<transport::PeerConnections>(
      io_, *send_watchdog_, static_cast<uint32_t>(config_.payload_bytes), &data_keys_,
      config_.host);
  daemon::SendScheduler::Options send;
  send.payload_bytes = static_cast<uint32_t>(config_.payload_bytes);
  send.unscheduled_bps = config_.unscheduled_bps;
  send.pacing_quantum_s = config_.pacing_quantum_us * 1e-6;
  send.coalesce_bytes = static_cast<uint64_t>(config_.coalesce_bytes);
  send.job_priority = MakeJobPriorityPolicy(config_);
  send_ = std::make_unique<daemon::SendScheduler>(
      std::move(send), clock_, peers_.get(), &aggregation_table_,
      [this](uint64_t transfer, const std::string& reason) {
        reporter_->ReportFailure(transfer, reason);
      });

  // The receive side: its parts share lock_.
  incoming_ = std::make_unique<daemon::IncomingTransfers>(&buffer_pool_);
  servers_ = std::make_unique<daemon::ServerEndpoints>(&lock_, &buffer_pool_, &stopping_);
  snapshots_ = std::make_unique<daemon::ReplicaSnapshots>(send_.get(), reporter_.get());
  deliveries_ = std::make_unique<daemon::Deliveries>(config_.host, incoming_.get(),
                                                     servers_.get(), reporter_.get(),
                                                     snapshots_.get());
  aggregation_ = std::make_unique<daemon::NetworkAggregation>(
      static_cast<uint32_t>(config_.payload_bytes), &aggregation_table_, incoming_.get(),
      send_.get(), reporter_.get());
  daemon::RoundService::Options rounds;
  rounds.host = config_.host;
  rounds.rounds_kept = config_.rounds_kept;
  rounds.round_wait_s = config_.round_wait_s;
  rounds.get_tree_min_bytes = config_.get_tree_min_bytes;
  rounds.round_tree_fanout = static_cast<int>(config_.round_tree_fanout);
  rounds.payload_bytes = static_cast<uint32_t>(config_.payload_bytes);
  rounds.chunk_bytes = internal::kRoundChunkBytes;
  rounds_ = std::make_unique<daemon::RoundService>(
      std::move(rounds), &lock_, &stopping_, incoming_.get(), servers_.get(), send_.get(),
      reporter_.get(), send_watchdog_.get(), &buffer_pool_);
  receiver_ = std::make_unique<daemon::DataReceiver>(
      &lock_, clock_, &stopping_, &data_keys_, static_cast<uint64_t>(kMaxTransferBytes),
      daemon::DataReceiver::Parts{incoming_.get(), rounds_.get(), aggregation_.get(),
                                  deliveries_.get(), reporter_.get(), &buffer_pool_},
      static_cast<int>(config_.io_threads));
}

Daemon::~Daemon() { Stop(); }

Daemon::Stats Daemon::GetStats() const {
  Stats stats;
  stats.pushes = app_requests_ ? app_requests_->pushes_submitted() : 0;
  stats.bytes_sent = send_->bytes_sent();
  stats.bytes_received = receiver_->bytes_received();
  stats.malformed_sessions = receiver_->malformed_sessions();
  stats.deliveries = deliveries_->delivered() + rounds_->rounds_delivered();
  stats.rounds = rounds_->rounds_delivered();
  stats.aggregates = aggregation_->completed();
  stats.gets_routed = rounds_->gets_routed();
  stats.local_round_gets = rounds_->local_gets();
  stats.local_round_get_bytes = rounds_->local_get_bytes();
  stats.local_transfers = receiver_->local_transfers();
  stats.local_transfer_bytes = receiver_->local_bytes();
  if (app_requests_) {
    stats.get_buffers_lent = app_requests_->buffers_lent();
    stats.get_buffers_returned = app_requests_->buffers_returned();
    stats.push_buffers_mapped = app_requests_->push_buffers_mapped();
    stats.push_buffers_reused = app_requests_->push_buffers_reused();
    stats.granted_pushes = app_requests_->granted_pushes();
  }
  daemon::ReceiveLock::Hold lock(&lock_);
  if (fetcher_) stats.copies_forwarded = fetcher_->copies_forwarded();
  if (model_server_) {
    const daemon::ModelServer::Stats gets = model_server_->stats();
    stats.gets_served = gets.gets;
    stats.model_snapshots = gets.snapshots;
    stats.model_copies_sent = gets.copies_sent;
    stats.gets_routed += gets.routed;  // and rounds'
  }
  return stats;
}

absl::Status Daemon::Start() {
  // Data plane first: its port is part of the registration.
  RETURN_IF_ERROR(receiver_->Listen(config_.listen_address, static_cast<int>(config_.data_port)));

  daemon::ModelServer::Options serving;
  serving.host = config_.host;
  serving.payload_bytes = static_cast<uint32_t>(config_.payload_bytes);
  serving.server_connect_wait_s = internal::kServerConnectWaitS;
  serving.get_batch_wait_s = config_.get_batch_wait_s;
  serving.get_timeout_s = config_.get_timeout_s;
  serving.get_tree_min_bytes = config_.get_tree_min_bytes;
  serving.get_late_joins = config_.get_late_joins;
  serving.get_late_join_min_share = config_.get_late_join_min_share;
  serving.snapshot_history = static_cast<size_t>(config_.group_snapshot_history);
  serving.uplink_bps = [this] { return UplinkBps(); };
  model_server_ = std::make_unique<daemon::ModelServer>(
      std::move(serving), servers_.get(), scheduler_.get(), send_.get(), send_watchdog_.get());
  servers_->SetModelServer(model_server_.get());
  fetcher_ = std::make_unique<daemon::ModelFetcher>(
      daemon::ModelFetcher::Options{config_.host, receiver_->address(), config_.get_timeout_s,
                                    config_.failover_wait_s},
      resolver_.get(), get_client_.get(), send_.get(), send_watchdog_.get());
  fetcher_->SetLocalRoundSums(rounds_.get());
  fetcher_->SetBufferPool(&buffer_pool_);

  // Local applications.
  compute_ = std::make_unique<boost::asio::thread_pool>(
      std::clamp<unsigned>(std::thread::hardware_concurrency(), 2, 8) - 1);
  app_requests_ = std::make_unique<daemon::AppRequests>(
      daemon::AppRequests::Options{config_.host, config_.payload_bytes}, &lock_, clock_,
      &stopping_,
      daemon::AppRequests::Parts{scheduler_.get(), reporter_.get(), &pushes_, &data_keys_,
                                 servers_.get(), rounds_.get(), model_server_.get(),
                                 fetcher_.get(), snapshots_.get(), &registering_, &buffer_pool_,
                                 compute_.get(),
                                 [this](v1::SendTransfer send) { SendGranted(std::move(send)); },
                                 deliveries_.get()},
      // AppRequests calls it under the receive lock (ForgetLocked).
      [this](const std::shared_ptr<AppSession>& app)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(daemon::receive_side) { return ForgetAppLocked(app); });
  apps_ = std::make_unique<daemon::AppSessions>(
      daemon::AppSessions::Options{config_.local_socket, config_.local_socket_group},
      app_requests_.get());
  if (auto status = apps_->Listen(); !status.ok()) return status;
  // Before registering: the job classes come with the command stream.
  if (auto status = StartNicPriorities(); !status.ok()) return status;
  if (auto status = RegisterHost(); !status.ok()) return status;

  if (auto status = StartMonitor(); !status.ok()) return status;
  threads_.emplace_back([this] { ScheduleStreamLoop(); });
  if (auto status = send_->Start(); !status.ok()) return status;
  threads_.emplace_back([this] { ClockSyncLoop(); });
  receiver_->Start(model_server_.get(), fetcher_.get());
  apps_->Start();
  MLF_LOG(INFO) << "host " << config_.host << " serving: data " << receiver_->address()
                << ", local " << config_.local_socket << ", scheduler " << config_.scheduler;
  return absl::OkStatus();
}

absl::Status Daemon::RegisterHost() {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(config_.register_timeout_s);
  std::string last_error;
  while (!stopping_.load()) {
    // Connected first, so that the registration goes out as soon as the
    // scheduler accepts a connection (a restarted one, after a lost
    // stream), and the round trip below, which sets the clock offset, is
    // the call's alone.
    const std::chrono::duration<double> left = deadline - std::chrono::steady_clock::now();
    (void)scheduler_->WaitForConnection(
        std::clamp(left.count(), 0.0, internal::kRegisterConnectWaitS));
    v1::RegisterHostRequest request;
    request.set_protocol_version(1);
    request.set_host(config_.host);
    request.set_data_address(receiver_->address());
    request.set_uplink_bps(config_.uplink_bps);
    request.set_downlink_bps(config_.downlink_bps);
    const double sent_s = clock_->NowSeconds();
    request.set_daemon_time_s(sent_s);
    std::set<uint64_t> unacknowledged;  // by a server application, as the request says
    {
      daemon::ReceiveLock::Hold lock(&lock_);
      DescribeForRegistrationLocked(&request, &unacknowledged);
    }
    v1::RegisterHostReply reply;
    absl::Status status = scheduler_->RegisterHost(request, &reply);
    const double received_s = clock_->NowSeconds();
    if (status.ok()) {
      AdoptRegistration(reply, sent_s, received_s, std::move(unacknowledged));
      return absl::OkStatus();
    }
    last_error = daemon::RpcErrorText(status);
    if (status.code() == absl::StatusCode::kInvalidArgument) break;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return absl::UnavailableError(absl::StrCat("cannot register with the scheduler at ",
                                             config_.scheduler, ": ", last_error));
}

void Daemon::DescribeForRegistrationLocked(v1::RegisterHostRequest* request,
                                           std::set<uint64_t>* unacknowledged) {
  for (const auto& [transfer_id, push] : pushes_.Unresolved()) {
    v1::InDoubtPush* doubt = request->add_in_doubt();
    DescribePush(transfer_id, push, doubt);
    doubt->set_local_id(push.local_id);
    doubt->set_push_uid(push.uid);
  }
  for (const auto& [transfer_id, push] : pushes_.Held()) {
    DescribePush(transfer_id, push, request->add_held_sources());
  }
  for (const daemon::AppliedLog::Entry& entry : servers_->replica_log().Report()) {
    DescribeApplied(entry, request->add_replica_applied());
  }
  for (const daemon::AppliedLog::Entry& entry : servers_->applied_log().Report()) {
    DescribeApplied(entry, request->add_applied());
    if (!entry.acknowledged) unacknowledged->insert(entry.push);
  }
  deliveries_->DescribeHeldCopiesLocked(request);
}

void Daemon::AdoptRegistration(const v1::RegisterHostReply& reply, double sent_s,
                               double received_s, std::set<uint64_t> unacknowledged) {
  daemon::ReceiveLock::Hold lock(&lock_);
  incarnation_ = reply.incarnation();
  deliveries_->ToldLocked();
  if (scheduler_epoch_ != 0 && reply.scheduler_epoch() != scheduler_epoch_) {
    // A restarted scheduler numbers every server's commit positions from
    // 1 again: the old positions would hold its deliveries back as old.
    // Those still waiting were cancelled when the stream broke; their
    // pushes are in doubt at their sources, and this registration's
    // applied log tells the new scheduler they were not applied.
    const size_t pending = deliveries_->ResetLocked();
    // It may number jobs differently: where servers live is asked anew.
    resolver_->Clear();
    MLF_LOG(WARNING) << "the scheduler restarted (epoch " << scheduler_epoch_ << " -> "
                     << reply.scheduler_epoch() << "): forgot its commit positions and "
                     << pending << " update(s) still expected";
  }
  scheduler_epoch_ = reply.scheduler_epoch();
  data_keys_.SetClusterKey(reply.data_key());
  data_keys_.SetEncryption(reply.data_encryption());
  // NTP-style: the reply was stamped halfway through the round trip.
  clock_offset_s_ = reply.scheduler_time_s() - (sent_s + received_s) / 2;
  send_->SetClockOffset(clock_offset_s_);
  MLF_LOG(INFO) << "registered with the scheduler (incarnation " << incarnation_
                << ", clock offset " << clock_offset_s_ * 1e3 << " ms, rtt "
                << (received_s - sent_s) * 1e3 << " ms)";
  // The client signs with the new session from here on: acknowledgements
  // that came after the request was built are told again.
  const std::vector<v1::CompletionReport> late_acks = AcknowledgedDuringRegistration(
      servers_->applied_log(), std::move(unacknowledged), config_.host);
  lock.Unlock();  // no RPC under the lock
  for (const v1::CompletionReport& report : late_acks) reporter_->ReportNow(report);
}

void Daemon::ClockSyncLoop() {
  while (true) {
    {
      MutexLock lock(&ended_mu_);
      const auto deadline =
          std::chrono::steady_clock::now() +
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::duration<double>(config_.clock_sync_period_s));
      while (!ended_ && std::chrono::steady_clock::now() < deadline) {
        ended_cv_.WaitWithDeadline(&ended_mu_, deadline);
      }
      if (ended_) return;
    }
    double best_rtt_s = 1e9, best_offset_s = 0;
    for (int sample = 0; sample < 3; ++sample) {
      v1::SyncClockRequest request;
      request.set_host(config_.host);
      v1::SyncClockReply reply;
      const double sent_s = clock_->NowSeconds();
      absl::Status status = scheduler_->SyncClock(request, &reply);
      const double received_s = clock_->NowSeconds();
      if (!status.ok()) break;
      if (received_s - sent_s < best_rtt_s) {
        best_rtt_s = received_s - sent_s;
        best_offset_s = reply.scheduler_time_s() - (sent_s + received_s) / 2;
      }
    }
    if (best_rtt_s == 1e9) continue;  // scheduler unreachable: the stream loop handles it
    daemon::ReceiveLock::Hold lock(&lock_);
    if (std::abs(best_offset_s - clock_offset_s_) > 1e-3) {
      MLF_LOG(INFO) << "clock offset " << clock_offset_s_ * 1e3 << " -> " << best_offset_s * 1e3
                    << " ms (rtt " << best_rtt_s * 1e3 << " ms)";
    }
    clock_offset_s_ = best_offset_s;
    send_->SetClockOffset(best_offset_s);
  }
}

absl::Status Daemon::StartMonitor() {
  if (config_.monitor_interface.empty() && config_.monitor_trace.empty()) return absl::OkStatus();
  monitor::MonitorConfig mc;
  mc.interface = config_.monitor_interface;
  mc.trace = config_.monitor_trace;
  mc.tc_class = config_.monitor_tc_class;
  mc.capacity_up_bps = config_.uplink_bps > 0 ? config_.uplink_bps : 10e9;
  mc.capacity_down_bps = config_.downlink_bps > 0 ? config_.downlink_bps : 10e9;
  mc.period_s = config_.monitor_period_s;
  mc.ewma_tau_s = config_.monitor_ewma_tau_s;
  mc.report_lag_s = config_.report_lag_s;
  mc.report_threshold = config_.report_threshold;
  mc.report_max_interval_s = config_.report_max_interval_s;
  auto report = [this](double up_bps, double down_bps) {
    v1::BandwidthReport request;
    request.set_host(config_.host);
    request.set_uplink_bps(up_bps);
    request.set_downlink_bps(down_bps);
    absl::Status status = scheduler_->ReportBandwidth(request);
    if (!status.ok()) {
      MLF_LOG(WARNING) << "cannot report bandwidth: " << daemon::RpcErrorText(status);
    }
  };
  // MLfabric's own data-plane bytes are not background load (docs/architecture.md §6).
  auto own = [this] {
    return monitor::OwnBytes{static_cast<uint64_t>(receiver_->bytes_received()),
                             static_cast<uint64_t>(send_->bytes_sent())};
  };
  auto created = monitor::BandwidthMonitor::Create(mc, clock_, report, own);
  if (!created.ok()) return created.status();
  monitor_ = std::move(*created);
  monitor_->Start();
  MLF_LOG(INFO) << "bandwidth monitor on "
                << (mc.trace.empty() ? "interface " + mc.interface : "trace " + mc.trace);
  return absl::OkStatus();
}

absl::Status Daemon::StartNicPriorities() {
  if (config_.nic_priority_interface.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(nicprio::CheckNetAdmin(config_.nic_priority_interface));
  nicprio::NicClasses::Options options;
  options.nic.interface = config_.nic_priority_interface;
  options.nic.link_rate_bps = config_.nic_priority_link_bps > 0 ? config_.nic_priority_link_bps
                              : config_.uplink_bps > 0          ? config_.uplink_bps
                                                                : 10e9;
  // The config loader checked both.
  options.jobs = nicprio::ParseNicJobs(config_.nic_priority_jobs).value();
  options.priority.mode = daemon::ParseJobPriorityMode(config_.job_priority).value();
  options.priority.rotation_period_s = config_.job_priority_period_s;
  auto started = nicprio::NicClasses::Start(std::move(options), clock_, nicprio::RunTcAll);
  if (!started.ok()) {
    return absl::Status(started.status().code(),
                        absl::StrCat("--nic_priority_interface=", config_.nic_priority_interface,
                                     ": ", started.status().message()));
  }
  nic_classes_ = *std::move(started);
  return absl::OkStatus();
}

void Daemon::Stop() {
  if (stopping_.exchange(true)) return;
  End();  // Wait() returns, the clock-sync loop ends
  if (monitor_) monitor_->Stop();
  if (nic_classes_) nic_classes_->Stop();  // the NIC as it was before the daemon
  {
    daemon::ReceiveLock::Hold lock(&lock_);
    if (stream_) stream_->Cancel();
  }
  if (apps_) apps_->Stop();  // no get starts after this
  if (fetcher_) fetcher_->Stop();
  // A get blocked on a quiet daemon, or waiting at the SSP clock, returns.
  get_client_->Shutdown();
  scheduler_->CancelWaits();
  if (model_server_) model_server_->Stop();
  lock_.NotifyAll();
  // Failures not yet reported are dropped: the scheduler marks this host down anyway.
  reporter_->Stop();
  receiver_->StopAccepting();
  // A write blocked on a dead peer returns, then the sender loop ends.
  peers_->CloseAll();
  send_->Stop();
  for (auto& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  // The data sessions (no new one starts now), then the gets.
  receiver_->StopSessions();
  if (app_requests_) {
    // Pushes held while registering again, if it never ended.
    app_requests_->RegistrationEnded(absl::CancelledError("the daemon stopped before submitting it"));
    app_requests_->WaitGets();
  }
  if (compute_) compute_->join();  // apps_->Stop() ended every push's summing
}

absl::Status Daemon::Wait() {
  {
    MutexLock lock(&ended_mu_);
    ended_cv_.Await(&ended_mu_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ended_mu_) {
      return ended_;
    });
  }
  daemon::ReceiveLock::Hold lock(&lock_);
  return fatal_;
}

void Daemon::End() {
  {
    MutexLock lock(&ended_mu_);
    ended_ = true;
  }
  ended_cv_.SignalAll();
}

std::optional<v1::EntityGoneReport> Daemon::ForgetAppLocked(
    const std::shared_ptr<AppSession>& app) {
  if (app->role == v1::ROLE_WORKER) {
    // The scheduler removes it from its job's members (elastic rounds,
    // scheduler/service/round_tracker.h); its pushes end on their own.
    if (!app->registered) return std::nullopt;
    // The worker is still connected through another application session
    // of this daemon (a process may hold several, e.g. an elastic rank
    // rebuilding its AllReducer): it has not left its job.
    for (const std::shared_ptr<AppSession>& other : apps_->Sessions()) {
      if (other != app && other->registered && other->role == v1::ROLE_WORKER &&
          other->job == app->job && other->name == app->name) {
        return std::nullopt;
      }
    }
    v1::EntityGoneReport report;
    report.set_host(config_.host);
    report.set_job(app->job);
    report.set_role(app->role);
    report.set_name(app->name);
    report.set_reason("its connection to the daemon closed");
    return report;
  }
  const std::optional<std::string> endpoint = servers_->ForgetLocked(app);
  if (!endpoint.has_value()) return std::nullopt;
  const std::string why = absl::StrCat("server '", app->name, "' disconnected before applying it");
  const std::vector<uint64_t> cancelled = deliveries_->CancelAllLocked(*endpoint, why);
  MLF_LOG(WARNING) << "server '" << app->name << "' disconnected; failing " << cancelled.size()
                   << " expected update(s)";
  for (uint64_t transfer : cancelled) reporter_->ReportFailure(transfer, why);
  deliveries_->TryDeliverLocked(app->job_id, app->role == v1::ROLE_REPLICA
                                                 ? "replica:" + app->name
                                                 : app->name);
  const std::string key = daemon::ServerKey(app->job_id, app->name);
  const std::string gone = absl::StrCat("server '", app->name, "' disconnected");
  rounds_->FailServerLocked(key, gone);
  if (app->role == v1::ROLE_SERVER) snapshots_->FailServerLocked(key, gone);
  if (model_server_) model_server_->FailServer(key, gone);
  lock_.NotifyAll();
  v1::EntityGoneReport report;
  report.set_host(config_.host);
  report.set_job(app->job);
  report.set_role(app->role);
  report.set_name(app->name);
  report.set_reason("its connection to the daemon closed");
  return report;
}

double Daemon::UplinkBps() const {
  if (monitor_) {
    if (std::optional<monitor::Report> report = monitor_->LastReport()) {
      if (report->up_bps > 0) return report->up_bps;
    }
  }
  return config_.uplink_bps;
}

}  // namespace mlfabric
