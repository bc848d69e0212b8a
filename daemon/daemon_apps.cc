// Daemon: what local applications ask, as the AppHandler of its
// daemon::AppSessions: registration, push (recorded before its
// SubmitUpdate, no lock held across it), get, update acks, model replies.
#include "daemon/daemon.h"

#include <netinet/in.h>
#include <pwd.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <cerrno>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <deque>
#include <functional>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "aggregator/reduce.h"
#include "common/crc32c.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "daemon/transport/framing.h"

#include "daemon/daemon_internal.h"

namespace mlfabric {

// ------------------------------------------------------------ local apps

void Daemon::HandleRegister(const std::shared_ptr<AppSession>& app,
                            const v1::LocalRegister& request) {
  v1::LocalMessage reply;
  v1::LocalRegistered* body = reply.mutable_registered();
  if (app->registered) {
    body->set_error("this connection is already registered");
    (void)app->channel->Send(reply);
    return;
  }
  const v1::RegisterEntityRequest entity = internal::EntityRequest(config_.host, app->uid, request);
  v1::RegisterEntityReply entity_reply;
  absl::Status status = scheduler_->RegisterEntity(entity, &entity_reply);
  if (!status.ok()) {
    body->set_error(
        absl::StrCat("scheduler refused the registration: ", daemon::RpcErrorText(status)));
    (void)app->channel->Send(reply);
    return;
  }
  if (!entity_reply.job_data_key().empty()) {
    data_keys_.SetJobKey(entity_reply.job_id(), entity_reply.job_data_key());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    app->job = request.job();
    app->job_token = request.job_token();
    app->name = request.name();
    app->role = request.role();
    app->job_id = entity_reply.job_id();
    app->registered = true;
    app->ssp = entity_reply.ssp() && request.role() == v1::ROLE_WORKER;
    app->registration = request;
  }
  // The reply goes out before the endpoint is published: once it is, a
  // get waiting for this server sends the application a model request, and
  // that must not reach it before its registration reply (it did: the
  // application's Connect failed with "daemon sent no registration reply").
  // Both happen under mu_, so nothing finds the endpoint missing in
  // between either: a delivery the scheduler announces right after the
  // registration (the application may push or be pushed to at once) waits
  // for mu_ and finds it (it was failed as "not connected" before).
  body->set_model_version(entity_reply.model_version());
  body->set_host(config_.host);
  {
    std::lock_guard<std::mutex> lock(mu_);
    (void)app->channel->Send(reply);  // one small message on a new connection
    if (request.role() == v1::ROLE_SERVER) {
      ServerEndpoint& endpoint = servers_[ServerKey(app->job_id, app->name)];
      endpoint.app = app;
    }
    // A hot-standby replica (§5.3) takes deliveries for "replica:<server>".
    if (request.role() == v1::ROLE_REPLICA) {
      ServerEndpoint& endpoint = servers_[ServerKey(app->job_id, "replica:" + app->name)];
      endpoint.app = app;
    }
  }
  cv_.notify_all();  // gets waiting for this server (ServeGetRequest)
}

void Daemon::HandlePush(const std::shared_ptr<AppSession>& app, const v1::LocalPush& push,
                        int fd) {
  auto fail = [&](const std::string& reason) {
    v1::LocalMessage done;
    done.mutable_push_done()->set_request_id(push.request_id());
    done.mutable_push_done()->set_outcome(v1::OUTCOME_FAILED);
    done.mutable_push_done()->set_reason(reason);
    (void)app->channel->Send(done);
  };
  if (fd < 0) {
    fail("push carries no shared-memory buffer");
    return;
  }
  auto buffer = SharedBuffer::Map(fd, static_cast<size_t>(std::max<int64_t>(push.bytes(), 0)));
  if (!buffer.ok()) {
    fail(std::string(buffer.status().message()));
    return;
  }
  if (!app->registered || app->role != v1::ROLE_WORKER) {
    fail("register as a worker before pushing");
    return;
  }
  v1::SubmitUpdateRequest request;
  request.set_job(app->job);
  request.set_src_host(config_.host);
  request.set_worker(app->name);
  request.set_server(push.server());
  request.set_bytes(push.bytes());
  request.set_version(push.version());
  request.set_norm(push.norm());
  *request.mutable_tensors() = push.tensors();
  request.set_dtype(push.dtype());
  // The push is recorded under its local id before the RPC, and no lock is
  // held across it: a command naming the push that arrives before the
  // reply finds it by local id (PushTable::Adopt), and the command stream
  // never waits for a submission.
  daemon::PushTable::Push pending;
  pending.app = app;
  pending.server = push.server();
  pending.request_id = push.request_id();
  pending.buffer = std::make_shared<SharedBuffer>(std::move(*buffer));
  pending.tensors.assign(push.tensors().begin(), push.tensors().end());
  pending.version = push.version();
  pending.norm = push.norm();
  pending.dtype = push.dtype();
  // Checksum the packets while the scheduler plans (see PacketChecksums);
  // not when sessions are sealed, whose tags replace the CRC.
  if (!data_keys_.encryption()) {
    pending.checksums = daemon::PacketChecksums::ForPush(pending.tensors, pending.buffer->size(),
                                                         config_.payload_bytes);
  }
  const std::shared_ptr<daemon::PacketChecksums> checksums = pending.checksums;
  const std::shared_ptr<SharedBuffer> bytes = pending.buffer;
  {
    // Names the round a later get streams back, if the server runs rounds.
    std::lock_guard<std::mutex> lock(mu_);
    app->last_round_push[push.server()] = push.version();
  }
  const uint64_t local_id = pushes_.Record(std::move(pending));
  request.set_local_id(local_id);
  MLF_LOG(DEBUG) << "submitting push (local id " << local_id << ") of '" << app->name
                 << "' to server '" << push.server() << "'";
  v1::SubmitUpdateReply reply;
  absl::Status status = scheduler_->SubmitUpdate(request, &reply);
  if (!status.ok()) {
    pushes_.SubmitFailed(local_id);
  } else {
    // A command may have adopted it already; either way it is known now.
    pushes_.Submitted(local_id, reply.transfer_id());
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.pushes;
  }
  if (!status.ok()) {
    fail(absl::StrCat("scheduler refused the push: ", daemon::RpcErrorText(status)));
    return;
  }
  if (checksums == nullptr) return;
  const double start_s = clock_->NowSeconds();
  checksums->SumAll(bytes->data());
  MLF_LOG(DEBUG) << "checksummed push " << reply.transfer_id() << ": " << checksums->Ready()
                 << " of " << checksums->packets() << " packets ahead of the sender ("
                 << checksums->parts() << " threads) in "
                 << absl::StrFormat("%.3f", clock_->NowSeconds() - start_s) << " s, done at "
                 << absl::StrFormat("%.6f", clock_->NowSeconds());
}

void Daemon::HandleGet(const std::shared_ptr<AppSession>& app, const v1::LocalGet& get) {
  if (!app->registered) {
    v1::LocalMessage done;
    done.mutable_get_done()->set_request_id(get.request_id());
    done.mutable_get_done()->set_error("register before calling get");
    (void)app->channel->Send(done);
    return;
  }
  const std::string job = app->job;
  std::lock_guard<std::mutex> lock(mu_);
  auto pushed = app->last_round_push.find(get.server());
  const int64_t round = pushed == app->last_round_push.end() ? -1 : pushed->second;
  // Get threads are detached: a finished thread is reclaimed at once (kept
  // joinable, one per get, they piled up until thread creation failed).
  // Stop() shuts their connections down and waits until none is left.
  ++get_threads_;
  std::thread([this, app, get, job, round] {
    // However it ends, Stop() learns that this get is over.
    struct Done {
      Daemon* daemon;
      ~Done() {
        std::lock_guard<std::mutex> lock(daemon->mu_);
        --daemon->get_threads_;
        daemon->cv_.notify_all();
      }
    } done_guard{this};
    v1::LocalMessage done;
    v1::LocalGetDone* body = done.mutable_get_done();
    body->set_request_id(get.request_id());
    if (app->ssp) {
      // Stale-synchronous: wait (at the scheduler, bounded) until the
      // job's slowest worker is within K pushes of this one. If the
      // scheduler cannot answer, the get goes ahead: the delay bound
      // still holds every push.
      v1::AwaitClockRequest await;
      await.set_job(job);
      await.set_worker(app->name);
      v1::AwaitClockReply waited;
      if (absl::Status s = scheduler_->AwaitClock(await, &waited); !s.ok()) {
        MLF_LOG(WARNING) << "ssp: cannot ask the scheduler whether " << app->name
                         << " may get: " << daemon::RpcErrorText(s) << "; the get goes ahead";
      }
    }
    int64_t version = 0;
    std::shared_ptr<SharedBuffer> model;
    absl::Status status = fetcher_->Fetch(job, get.server(), round,
                                          static_cast<uint32_t>(std::max(0, get.priority())),
                                          &version, &model);
    if (!status.ok()) {
      body->set_error(std::string(status.message()));
      (void)app->channel->Send(done);
      return;
    }
    body->set_model_version(version);
    body->set_bytes(static_cast<int64_t>(model->size()));
    (void)app->channel->Send(done, model->fd());
  }).detach();
}

void Daemon::HandleUpdateAck(const v1::LocalUpdateAck& ack) {
  std::vector<v1::CompletionReport> round_reports;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rounds_.IsDelivery(ack.transfer_id())) {
      const auto round = rounds_.Acknowledge(ack.transfer_id());
      if (!round.has_value()) return;  // failed meanwhile; already reported
      // A round advances the model by one version, whatever the callback
      // returned: it is the version the workers' gets already saw.
      applied_log_.Acked(ack.transfer_id(), /*applied=*/false, 0);  // logged per member:
      if (ack.error().empty()) {
        for (uint64_t member : round->members) applied_log_.Applied(member, round->round + 1);
        int64_t& version = server_versions_[round->key];
        version = std::max(version, round->round + 1);
      }
      for (uint64_t member : round->members) {
        v1::CompletionReport report;
        report.set_host(config_.host);
        report.set_transfer_id(member);
        report.set_applied(ack.error().empty());
        report.set_model_version(round->round + 1);
        if (!ack.error().empty()) {
          report.set_error(absl::StrCat("server refused round ", round->round, ": ", ack.error()));
        }
        round_reports.push_back(std::move(report));
      }
    }
  }
  if (!round_reports.empty()) {
    for (const v1::CompletionReport& report : round_reports) reporter_->ReportNow(report);
    return;
  }
  std::vector<uint64_t> pushes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto done = awaiting_ack_.find(ack.transfer_id()); done != awaiting_ack_.end()) {
      if (ack.error().empty() && done->second.first != nullptr) {
        const std::shared_ptr<AppSession>& app = done->second.first;
        int64_t& version = server_versions_[ServerKey(app->job_id, app->name)];
        version = std::max(version, ack.model_version());
      }
      buffer_pool_.Recycle(std::move(done->second.second));
      awaiting_ack_.erase(done);
    }
    pushes = applied_log_.Acked(ack.transfer_id(), ack.error().empty(), ack.model_version());
    (void)replica_log_.Acked(ack.transfer_id(), ack.error().empty(), ack.model_version());
  }
  v1::CompletionReport report;
  report.set_host(config_.host);
  report.set_transfer_id(ack.transfer_id());
  report.set_applied(ack.error().empty());
  report.set_model_version(ack.model_version());
  report.set_error(ack.error().empty() ? ""
                                       : absl::StrCat("server refused the update: ", ack.error()));
  // A scheduler that restarted meanwhile knows the pushes, not the delivery.
  for (uint64_t push : pushes) report.add_pushes(push);
  reporter_->ReportNow(report);
}

void Daemon::HandleModelReply(const v1::LocalModelReply& reply, int fd) {
  std::shared_ptr<SharedBuffer> buffer;
  std::string error = reply.error();
  if (error.empty()) {
    if (fd < 0) {
      error = "model reply carries no buffer";
    } else {
      auto mapped = SharedBuffer::Map(fd, static_cast<size_t>(std::max<int64_t>(reply.bytes(), 0)));
      fd = -1;
      if (mapped.ok()) {
        buffer = std::make_shared<SharedBuffer>(std::move(*mapped));
      } else {
        error = std::string(mapped.status().message());
      }
    }
  }
  if (fd >= 0) ::close(fd);
  // Ignored if the batch's gets gave up meanwhile.
  model_server_->Answer(reply.request_id(), daemon::GetBatcher::Snapshot{
                                                reply.model_version(), std::move(buffer), error});
}

void Daemon::AppGone(const std::shared_ptr<AppSession>& app) {
  std::optional<v1::EntityGoneReport> report;
  {
    std::lock_guard<std::mutex> lock(mu_);
    report = ForgetAppLocked(app);
  }
  // A server's replica takes over at once, not when the daemon goes too.
  if (!report.has_value() || stopping_.load()) return;
  if (absl::Status told = scheduler_->ReportEntityGone(*report); !told.ok()) {
    MLF_LOG(WARNING) << "could not tell the scheduler that " << v1::Role_Name(report->role())
                     << " '" << report->name() << "' left: " << daemon::RpcErrorText(told);
  }
}

std::optional<v1::EntityGoneReport> Daemon::ForgetAppLocked(
    const std::shared_ptr<AppSession>& app) {
  for (auto it = awaiting_ack_.begin(); it != awaiting_ack_.end();) {
    it = it->second.first == app ? awaiting_ack_.erase(it) : std::next(it);
  }
  if (app->role != v1::ROLE_SERVER && app->role != v1::ROLE_REPLICA) return std::nullopt;
  const std::string endpoint_name =
      app->role == v1::ROLE_REPLICA ? "replica:" + app->name : app->name;
  const std::string endpoint_key = ServerKey(app->job_id, endpoint_name);
  auto it = servers_.find(endpoint_key);
  if (it == servers_.end() || it->second.app != app) return std::nullopt;
  it->second.app = nullptr;
  const std::string why = absl::StrCat("server '", app->name, "' disconnected before applying it");
  const std::vector<uint64_t> cancelled = delivery_.CancelAll(endpoint_key, why);
  snapshot_waiters_.erase(endpoint_key);
  MLF_LOG(WARNING) << "server '" << app->name << "' disconnected; failing " << cancelled.size()
                   << " expected update(s)";
  for (uint64_t transfer : cancelled) reporter_->ReportFailure(transfer, why);
  TryDeliverLocked(app->job_id, endpoint_name);
  const std::string key = ServerKey(app->job_id, app->name);
  {
    daemon::RoundTable::Effects fx;
    rounds_.FailServer(key, absl::StrCat("server '", app->name, "' disconnected"), &fx);
    ApplyRoundEffectsLocked(fx);
  }
  if (model_server_) model_server_->FailServer(key, absl::StrCat("server '", app->name, "' disconnected"));
  cv_.notify_all();
  v1::EntityGoneReport report;
  report.set_host(config_.host);
  report.set_job(app->job);
  report.set_role(app->role);
  report.set_name(app->name);
  report.set_reason("its connection to the daemon closed");
  return report;
}

void Daemon::PromoteReplicaLocked(const v1::PromoteReplica& promote) {
  const std::string from = ServerKey(promote.job_id(), "replica:" + promote.server());
  const std::string to = ServerKey(promote.job_id(), promote.server());
  std::shared_ptr<AppSession> app;
  if (auto it = servers_.find(from); it != servers_.end()) {
    app = it->second.app;
    servers_.erase(it);
  }
  // The replica's commit positions carry on under the server's name. What
  // an old server endpoint here still expected was failed by the scheduler.
  const std::vector<uint64_t> dropped = delivery_.Rename(from, to, promote.server());
  servers_[to].app = app;
  MLF_LOG(WARNING) << "this host's replica of server '" << promote.server()
                   << "' is the server now (" << promote.reason() << "); "
                   << (app ? "serving it" : "but its application is not connected")
                   << (dropped.empty() ? ""
                                       : absl::StrCat("; dropped ", dropped.size(),
                                                      " deliveries of the old server here"));
  if (app == nullptr) {
    const std::string why =
        absl::StrCat("server '", promote.server(), "' is not connected to ", config_.host, "'s daemon");
    for (uint64_t transfer : delivery_.CancelAll(to, why)) reporter_->ReportFailure(transfer, why);
    return;
  }
  // From now on it is the server: it leaves as one, and registers as one
  // with a restarted scheduler.
  app->role = v1::ROLE_SERVER;
  app->registration.set_role(v1::ROLE_SERVER);
  v1::LocalMessage note;
  v1::LocalPromoted* body = note.mutable_promoted();
  body->set_server(promote.server());
  body->set_old_host(promote.old_host());
  body->set_reason(promote.reason());
  body->set_model_version(promote.model_version());
  (void)app->channel->Send(note);
  TryDeliverLocked(promote.job_id(), promote.server());
  cv_.notify_all();  // gets waiting for the server (AwaitServer)
}

namespace internal {

v1::RegisterEntityRequest EntityRequest(const std::string& host, int64_t uid,
                                        const v1::LocalRegister& request) {
  v1::RegisterEntityRequest entity;
  entity.set_job(request.job());
  entity.set_job_token(request.job_token());
  entity.set_role(request.role());
  entity.set_name(request.name());
  entity.set_host(host);
  entity.set_round_size(request.round_size());
  entity.set_backup_workers(request.backup_workers());
  entity.set_delay_bound(request.delay_bound());
  entity.set_divergence_bound(request.divergence_bound());
  if (request.has_shard()) *entity.mutable_shard() = request.shard();
  entity.set_app_uid(uid);
  if (uid >= 0) {
    char buffer[4096];
    struct passwd entry {};
    struct passwd* user = nullptr;
    const bool named =
        ::getpwuid_r(static_cast<uid_t>(uid), &entry, buffer, sizeof(buffer), &user) == 0 &&
        user != nullptr;
    entity.set_app_user(named ? std::string(user->pw_name) : absl::StrCat("uid ", uid));
  }
  return entity;
}

}  // namespace internal

}  // namespace mlfabric
