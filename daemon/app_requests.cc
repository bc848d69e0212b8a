#include "daemon/app_requests.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "daemon/transport/packet_checksums.h"
#include "ipc/local_ipc.h"

namespace mlfabric::daemon {

AppRequests::AppRequests(Options options, ReceiveLock* lock, const Clock* clock,
                         const std::atomic<bool>* stopping, Parts parts, ForgetLocked forget)
    : options_(std::move(options)),
      lock_(lock),
      clock_(clock),
      stopping_(stopping),
      parts_(parts),
      forget_(std::move(forget)) {}

namespace {

// The scheduler's SubmitUpdate for an application's push from `host`.
v1::SubmitUpdateRequest SubmitRequestFor(const std::string& host, const AppSession& app,
                                         const v1::LocalPush& push) {
  v1::SubmitUpdateRequest request;
  request.set_job(app.job);
  request.set_src_host(host);
  request.set_worker(app.name);
  request.set_server(push.server());
  request.set_bytes(push.bytes());
  request.set_version(push.version());
  request.set_norm(push.norm());
  *request.mutable_tensors() = push.tensors();
  request.set_dtype(push.dtype());
  request.set_push_uid(push.uid());
  if (push.has_shape()) *request.mutable_shape() = push.shape();
  return request;
}

}  // namespace

AppRequests::ThreadDone::~ThreadDone() {
  ReceiveLock::Hold lock(requests_->lock_);
  --requests_->get_threads_;
  requests_->lock_->NotifyAll();
}

void AppRequests::WaitGets() {
  ReceiveLock::Hold lock(lock_);
  while (get_threads_ != 0) lock_->Wait();
}

void AppRequests::HandleRegister(const std::shared_ptr<AppSession>& app,
                            const v1::LocalRegister& request) {
  v1::LocalMessage reply;
  v1::LocalRegistered* body = reply.mutable_registered();
  if (app->registered) {
    body->set_error("this connection is already registered");
    (void)app->channel->Send(reply);
    return;
  }
  // A server's (or replica's) endpoint name: once the scheduler has the
  // registration it may announce deliveries for it, which wait here for
  // the endpoint until this registration ends (Deliveries).
  std::optional<std::string> endpoint;
  if (request.role() == v1::ROLE_SERVER) endpoint = request.name();
  if (request.role() == v1::ROLE_REPLICA) endpoint = "replica:" + request.name();
  if (endpoint.has_value()) {
    ReceiveLock::Hold lock(lock_);
    parts_.servers->BeginRegistrationLocked(*endpoint);
  }
  auto end_registration = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side) {
    if (!endpoint.has_value()) return;
    parts_.servers->EndRegistrationLocked(*endpoint);
    if (parts_.deliveries != nullptr) parts_.deliveries->RegistrationEndedLocked(*endpoint);
  };
  const v1::RegisterEntityRequest entity = EntityRequest(options_.host, app->uid, request);
  v1::RegisterEntityReply entity_reply;
  absl::Status status = parts_.scheduler->RegisterEntity(entity, &entity_reply);
  if (!status.ok()) {
    body->set_error(
        absl::StrCat("scheduler refused the registration: ", RpcErrorText(status)));
    ReceiveLock::Hold lock(lock_);
    end_registration();
    (void)app->channel->Send(reply);
    return;
  }
  if (!entity_reply.job_data_key().empty()) {
    parts_.keys->SetJobKey(entity_reply.job_id(), entity_reply.job_data_key());
  }
  {
    ReceiveLock::Hold lock(lock_);
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
  // Both happen under the receive lock, so nothing finds the endpoint missing in
  // between either: a delivery the scheduler announces right after the
  // registration (the application may push or be pushed to at once) waits
  // for the lock and finds it (it was failed as "not connected" before).
  body->set_model_version(entity_reply.model_version());
  body->set_host(options_.host);
  ReceiveLock::Hold lock(lock_);
  (void)app->channel->Send(reply);  // one small message on a new connection
  // A hot-standby replica (§5.3) takes deliveries for "replica:<server>".
  if (endpoint.has_value()) parts_.servers->PublishLocked(ServerKey(app->job_id, *endpoint), app);
  end_registration();
}

PushTable::Push AppRequests::PendingPush(const std::shared_ptr<AppSession>& app,
                                        const v1::LocalPush& push, SharedBuffer buffer,
                                        bool server_here) const {
  PushTable::Push pending;
  pending.app = app;
  pending.server = push.server();
  pending.request_id = push.request_id();
  pending.buffer = std::make_shared<SharedBuffer>(std::move(buffer));
  pending.tensors.assign(push.tensors().begin(), push.tensors().end());
  pending.version = push.version();
  pending.norm = push.norm();
  pending.dtype = push.dtype();
  pending.uid = push.uid();
  // Checksum the packets while the scheduler plans (see PacketChecksums);
  // not when sessions are sealed, whose tags replace the CRC, nor for a
  // server on this host, whose push is taken in without a socket (a plan
  // that sends it elsewhere after all gets its CRCs as its packets leave).
  if (!parts_.keys->encryption() && !server_here) {
    pending.checksums = transport::PacketChecksums::ForPush(pending.tensors, pending.buffer->size(),
                                                         options_.payload_bytes);
  }
  return pending;
}

void AppRequests::HandlePush(const std::shared_ptr<AppSession>& app, const v1::LocalPush& push,
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
  // The application's push buffers come back once released: a buffer
  // mapped before is reused (no new mmap with MAP_POPULATE, no munmap).
  // The cache's share of the mapping is not a SharedBuffer, so the push's
  // shared_ptr below is still the only holder once senders and checksums
  // are done: LocalPushDone.buffer_released (daemon_control.cc) keeps
  // meaning "the daemon no longer touches these bytes", and nothing reads
  // the kept mapping until the application pushes the buffer again.
  bool reused = false;
  auto buffer = app->push_mappings.Map(
      fd, static_cast<size_t>(std::max<int64_t>(push.bytes(), 0)), &reused);
  if (buffer.ok()) (reused ? push_buffers_reused_ : push_buffers_mapped_).fetch_add(1);
  if (!buffer.ok()) {
    fail(std::string(buffer.status().message()));
    return;
  }
  if (!app->registered || app->role != v1::ROLE_WORKER) {
    fail("register as a worker before pushing");
    return;
  }
  v1::SubmitUpdateRequest request = SubmitRequestFor(options_.host, *app, push);
  // The push is recorded under its local id before the RPC, and no lock is
  // held across it: a command naming the push that arrives before the
  // reply finds it by local id (PushTable::Adopt), and the command stream
  // never waits for a submission.
  bool server_here = false;
  {
    // Names the round a later get streams back, if the server runs rounds.
    ReceiveLock::Hold lock(lock_);
    app->last_round_push[push.server()] = push.version();
    server_here = parts_.servers->AppLocked(ServerKey(app->job_id, push.server())) != nullptr;
  }
  // A push its round's grant covers leaves now, on its last plan
  // (scheduler/service/round_grants.h): no checksums ahead of the sender.
  std::optional<v1::RoundGrant> grant = TakeGrant(*app, push);
  PushTable::Push pending =
      PendingPush(app, push, std::move(*buffer), server_here || grant.has_value());
  const std::shared_ptr<transport::PacketChecksums> checksums = pending.checksums;
  const std::shared_ptr<SharedBuffer> bytes = pending.buffer;
  const uint64_t local_id = parts_.pushes->Record(std::move(pending));
  request.set_local_id(local_id);
  MLF_LOG(DEBUG) << "submitting push (local id " << local_id << ") of '" << app->name
                 << "' to server '" << push.server() << "' at "
                 << absl::StrFormat("%.6f", clock_->NowSeconds())
                 << (grant ? absl::StrCat(", sent on grant ", grant->transfer_id()) : "");
  if (grant.has_value()) {
    request.set_granted_transfer_id(grant->transfer_id());
    v1::SendTransfer send;
    send.set_transfer_id(grant->transfer_id());
    send.set_job_id(app->job_id);
    send.set_dst_host(grant->dst_host());
    send.set_dst_address(grant->dst_address());
    send.set_bytes(push.bytes());
    send.set_local_id(local_id);
    v1::RateSegment* segment = send.add_segments();
    segment->set_from_s(0);
    segment->set_to_s(8.0 * static_cast<double>(push.bytes()) / grant->rate_bps());
    segment->set_rate_bps(grant->rate_bps());
    granted_pushes_.fetch_add(1);
    parts_.send_granted(std::move(send));
  }
  {
    ReceiveLock::Hold lock(lock_);
    ++get_threads_;  // WaitGets waits for the submission to end
  }
  Submit(Submission{app, std::move(request), local_id, push.request_id(), clock_->NowSeconds(),
                    push.server()});
  // The handler thread goes on at once: the packets are checksummed while
  // the scheduler plans, and the application's next message (its get)
  // does not wait for the reply.
  if (checksums == nullptr) return;
  const double start_s = clock_->NowSeconds();
  checksums->SumAll(bytes->data(), parts_.compute);
  MLF_LOG(DEBUG) << "checksummed push (local id " << local_id << "): " << checksums->Ready()
                 << " of " << checksums->packets() << " packets ahead of the sender ("
                 << checksums->parts() << " threads) in "
                 << absl::StrFormat("%.3f", clock_->NowSeconds() - start_s) << " s, done at "
                 << absl::StrFormat("%.6f", clock_->NowSeconds());
}

void AppRequests::Submit(Submission submission) {
  {
    absl::MutexLock lock(&submit_mu_);
    auto [queue, first] = submission_queues_.try_emplace(submission.app.get());
    if (!first) {
      // Behind the application's submission in flight: pushes reach the
      // scheduler in the order the application made them.
      queue->second.push_back(std::move(submission));
      return;
    }
    if (holding_) {
      // The daemon registers again: submitted once it has (its queue's
      // entry stays, so the application's later pushes wait behind it).
      held_.push_back(std::move(submission));
      return;
    }
  }
  Issue(std::move(submission));
}

void AppRequests::Issue(Submission submission) {
  v1::SubmitUpdateRequest request = submission.request;
  parts_.scheduler->SubmitUpdateAsync(
      std::move(request),
      [this, submission = std::move(submission)](absl::Status status,
                                                 v1::SubmitUpdateReply reply) mutable {
        // Still counted as running: RegistrationEnded issues or fails it.
        if (HoldRefused(&submission, status)) return;
        // Ends last: once WaitGets returned, nothing here touches `this`.
        const ThreadDone done_guard(this);
        Submitted(submission, std::move(status), reply);
        Next(submission.app.get());
      });
}

bool AppRequests::HoldRefused(Submission* submission, const absl::Status& status) {
  // Not the scheduler's word on the push; and a push sent on a grant went
  // on the lost scheduler's plan.
  if (!absl::IsUnavailable(status) && !absl::IsUnauthenticated(status)) return false;
  if (submission->request.granted_transfer_id() != 0) return false;
  // A command named it: the scheduler that planned it tells its outcome
  // (it is in doubt), so it is not submitted twice.
  if (!parts_.pushes->Submitting(submission->local_id)) return false;
  absl::MutexLock lock(&submit_mu_);
  if (!holding_ || stopping_->load()) return false;
  MLF_LOG(DEBUG) << "push (local id " << submission->local_id
                 << ") refused while registering again (" << RpcErrorText(status)
                 << "): submitted again once registered";
  held_.push_back(std::move(*submission));
  return true;
}

void AppRequests::RegistrationStarted() {
  absl::MutexLock lock(&submit_mu_);
  holding_ = true;
}

void AppRequests::RegistrationEnded(const absl::Status& status) {
  std::vector<Submission> held;
  {
    absl::MutexLock lock(&submit_mu_);
    holding_ = false;
    held.swap(held_);
  }
  if (!held.empty()) {
    MLF_LOG(INFO) << (status.ok() ? "submitting " : "failing ") << held.size()
                  << " push(es) held while registering again";
  }
  for (Submission& submission : held) {
    if (status.ok() && !stopping_->load()) {
      Issue(std::move(submission));
      continue;
    }
    const ThreadDone done_guard(this);
    Submitted(submission,
              status.ok() ? absl::CancelledError("the daemon stopped before submitting it")
                          : status,
              {});
    Next(submission.app.get());
  }
}

void AppRequests::Next(const AppSession* app) {
  while (true) {
    Submission next;
    {
      absl::MutexLock lock(&submit_mu_);
      auto queue = submission_queues_.find(app);
      if (queue == submission_queues_.end()) return;
      if (queue->second.empty()) {
        submission_queues_.erase(queue);
        return;
      }
      next = std::move(queue->second.front());
      queue->second.pop_front();
    }
    if (!stopping_->load()) {
      Issue(std::move(next));
      return;
    }
    const ThreadDone done_guard(this);
    Submitted(next, absl::CancelledError("the daemon stopped before submitting it"), {});
  }
}

void AppRequests::Submitted(const Submission& submission, absl::Status status,
                            const v1::SubmitUpdateReply& reply) {
  const uint64_t local_id = submission.local_id;
  std::string refused;
  if (absl::IsUnauthenticated(status) && parts_.registering != nullptr &&
      parts_.registering->load()) {
    // A restarted scheduler that does not know this daemon's session yet.
    // The push fails at once, as while the scheduler was down (a
    // synchronous round's members fail alike, none submitted again).
    refused = "the scheduler restarted and does not know this daemon yet (it is registering "
              "again, within seconds): push again";
  }
  if (!status.ok()) {
    parts_.pushes->SubmitFailed(local_id);
    v1::LocalMessage done;
    done.mutable_push_done()->set_request_id(submission.request_id);
    done.mutable_push_done()->set_outcome(v1::OUTCOME_FAILED);
    done.mutable_push_done()->set_reason(absl::StrCat(
        "scheduler refused the push: ", refused.empty() ? RpcErrorText(status) : refused));
    (void)submission.app->channel->Send(done);
    return;
  }
  // A command may have adopted it already; either way it is known now.
  parts_.pushes->Submitted(local_id, reply.transfer_id());
  if (reply.has_next_round()) AddGrant(*submission.app, submission.server, reply.next_round());
  pushes_submitted_.fetch_add(1);
  MLF_LOG(DEBUG) << "submitted push (local id " << local_id << ") as " << reply.transfer_id()
                 << " in "
                 << absl::StrFormat("%.3f", (clock_->NowSeconds() - submission.submit_s) * 1e3)
                 << " ms";
}

void AppRequests::AddGrant(const AppSession& app, const std::string& server,
                           const v1::RoundGrant& grant) {
  if (!parts_.send_granted || !(grant.rate_bps() > 0) || grant.transfer_id() == 0) return;
  absl::MutexLock lock(&grants_mu_);
  v1::RoundGrant& held = grants_[{app.job_id, app.name, server}];
  // A later round's grant may have come first (a plan's command and a
  // granted push's reply travel apart): the older one is of no use.
  if (held.transfer_id() == 0 || held.round() <= grant.round()) held = grant;
}

void AppRequests::ClearGrants() {
  absl::MutexLock lock(&grants_mu_);
  grants_.clear();
}

std::optional<v1::RoundGrant> AppRequests::TakeGrant(const AppSession& app,
                                                     const v1::LocalPush& push) {
  absl::MutexLock lock(&grants_mu_);
  auto it = grants_.find({app.job_id, app.name, push.server()});
  if (it == grants_.end()) return std::nullopt;
  v1::RoundGrant grant = std::move(it->second);
  grants_.erase(it);
  if (grant.round() != push.version() || grant.bytes() != push.bytes()) return std::nullopt;
  return grant;
}

void AppRequests::HandleGet(const std::shared_ptr<AppSession>& app, const v1::LocalGet& get) {
  if (!app->registered) {
    v1::LocalMessage done;
    done.mutable_get_done()->set_request_id(get.request_id());
    done.mutable_get_done()->set_error("register before calling get");
    (void)app->channel->Send(done);
    return;
  }
  const std::string job = app->job;
  ReceiveLock::Hold lock(lock_);
  auto pushed = app->last_round_push.find(get.server());
  const int64_t round = pushed == app->last_round_push.end() ? -1 : pushed->second;
  // On a reused thread (a get waits for its model for an unknown time);
  // WaitGets() waits until none is left.
  ++get_threads_;
  blocking_.Run([this, app, get, job, round] {
    const ThreadDone done_guard(this);  // however it ends, Stop() learns it did
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
      if (absl::Status s = parts_.scheduler->AwaitClock(await, &waited); !s.ok()) {
        MLF_LOG(WARNING) << "ssp: cannot ask the scheduler whether " << app->name
                         << " may get: " << RpcErrorText(s) << "; the get goes ahead";
      }
    }
    int64_t version = 0;
    std::shared_ptr<SharedBuffer> model;
    uint32_t contributions = 0;
    absl::Status status = parts_.fetcher->Fetch(job, get.server(), round,
                                          static_cast<uint32_t>(std::max(0, get.priority())),
                                          &version, &model, -1, &contributions);
    if (!status.ok()) {
      body->set_error(std::string(status.message()));
      (void)app->channel->Send(done);
      return;
    }
    body->set_model_version(version);
    body->set_bytes(static_cast<int64_t>(model->size()));
    body->set_contributions(static_cast<int32_t>(contributions));
    if (parts_.pool != nullptr && model->size() > 0) {
      // Lent: the application says when it has unmapped it (HandleRelease),
      // and the buffer serves a later get of the same size.
      const uint64_t id = next_buffer_id_.fetch_add(1);
      body->set_buffer_id(id);
      ReceiveLock::Hold lock(lock_);
      app->lent_buffers[id] = model;
      buffers_lent_.fetch_add(1);
    }
    (void)app->channel->Send(done, model->fd());
  });
}

void AppRequests::HandleRelease(const std::shared_ptr<AppSession>& app,
                                const v1::LocalRelease& release) {
  std::vector<std::shared_ptr<SharedBuffer>> returned;
  {
    ReceiveLock::Hold lock(lock_);
    for (uint64_t id : release.buffer_ids()) {
      auto it = app->lent_buffers.find(id);
      if (it == app->lent_buffers.end()) continue;  // not lent, or twice: ignored
      returned.push_back(std::move(it->second));
      app->lent_buffers.erase(it);
    }
  }
  // Kept only if nobody else here holds it (a relay still forwarding it).
  for (std::shared_ptr<SharedBuffer>& buffer : returned) {
    if (parts_.pool != nullptr) parts_.pool->Recycle(std::move(buffer));
    buffers_returned_.fetch_add(1);
  }
}

void AppRequests::HandleUpdateAck(const v1::LocalUpdateAck& ack) {
  std::optional<std::vector<v1::CompletionReport>> round_reports;
  std::vector<uint64_t> pushes;
  {
    ReceiveLock::Hold lock(lock_);
    round_reports = parts_.rounds->AcknowledgedLocked(ack);
    if (!round_reports.has_value()) pushes = parts_.servers->AcknowledgedLocked(ack);
  }
  if (round_reports.has_value()) {
    for (const v1::CompletionReport& report : *round_reports) parts_.reporter->ReportNow(report);
    return;
  }
  v1::CompletionReport report;
  report.set_host(options_.host);
  report.set_transfer_id(ack.transfer_id());
  report.set_applied(ack.error().empty());
  report.set_model_version(ack.model_version());
  report.set_error(ack.error().empty() ? ""
                                       : absl::StrCat("server refused the update: ", ack.error()));
  // A scheduler that restarted meanwhile knows the pushes, not the delivery.
  for (uint64_t push : pushes) report.add_pushes(push);
  // Queued: this application's next acknowledgement does not wait for the
  // scheduler's answer to this one, and those that come meanwhile go
  // together (a shard of a busy server group applies hundreds a second).
  parts_.reporter->Report(std::move(report));
}

void AppRequests::HandleModelReply(const v1::LocalModelReply& reply, int fd) {
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
  // A snapshot for a new replica (engine/replica_snapshots.h)?
  if (parts_.snapshots != nullptr &&
      parts_.snapshots->Answer(reply.request_id(), reply.model_version(), buffer, error)) {
    return;
  }
  // Ignored if the batch's gets gave up meanwhile.
  parts_.model_server->Answer(reply.request_id(), GetBatcher::Snapshot{
                                                reply.model_version(), std::move(buffer), error});
}

void AppRequests::HandleOutcomeQuery(const std::shared_ptr<AppSession>& app,
                                     const v1::LocalOutcomeQuery& query) {
  auto answer = [app](uint64_t request_id, v1::Outcome outcome, const std::string& reason,
                      int64_t applied_version, int64_t delay) {
    v1::LocalMessage done;
    v1::LocalPushDone* body = done.mutable_push_done();
    body->set_request_id(request_id);
    body->set_outcome(outcome);
    body->set_reason(reason);
    body->set_applied_version(applied_version);
    body->set_delay(delay);
    return app->channel->Send(done);
  };
  if (!app->registered || app->role != v1::ROLE_WORKER) {
    for (const auto& entry : query.pushes()) {
      (void)answer(entry.request_id(), v1::OUTCOME_FAILED,
                   "register as a worker before asking how pushes ended", 0, 0);
    }
    return;
  }
  ReceiveLock::Hold lock(lock_);
  ++get_threads_;  // Stop() waits for it as for a get
  blocking_.Run([this, app, query, answer] {
    const ThreadDone done_guard(this);
    AnswerOutcomeQuery(app, query, answer);
  });
}

void AppRequests::HandleMembershipQuery(const std::shared_ptr<AppSession>& app,
                                        const v1::LocalMembershipQuery& query) {
  if (!app->registered || app->role != v1::ROLE_WORKER) {
    v1::LocalMessage answer;
    answer.mutable_membership()->set_request_id(query.request_id());
    answer.mutable_membership()->set_error(
        "register as a worker before asking for the job's membership");
    (void)app->channel->Send(answer);
    return;
  }
  v1::QueryMembershipRequest request;
  request.set_job(app->job);
  request.set_worker(app->name);
  ReceiveLock::Hold lock(lock_);
  ++get_threads_;  // Stop() waits for it as for a get
  blocking_.Run([this, app, request, id = query.request_id()] {
    const ThreadDone done_guard(this);
    v1::QueryMembershipReply reply;
    v1::LocalMessage answer;
    v1::LocalMembership* body = answer.mutable_membership();
    body->set_request_id(id);
    if (absl::Status asked = parts_.scheduler->QueryMembership(request, &reply); !asked.ok()) {
      body->set_error(absl::StrCat("the scheduler did not answer the membership query: ",
                                   RpcErrorText(asked)));
    } else {
      body->set_generation(reply.generation());
      body->mutable_members()->Swap(reply.mutable_members());
    }
    (void)app->channel->Send(answer);  // fails only if the application left
  });
}

void AppRequests::AnswerOutcomeQuery(const std::shared_ptr<AppSession>& app,
                                     const v1::LocalOutcomeQuery& query,
                                     const OutcomeAnswer& answer) {
  std::map<uint64_t, uint64_t> waiting;  // uid -> request id
  for (const auto& entry : query.pushes()) {
    if (entry.uid() == 0) {
      (void)answer(entry.request_id(), v1::OUTCOME_FAILED,
                   "its outcome is unknown: the push carries no uid to ask the scheduler by",
                   0, 0);
    } else {
      waiting[entry.uid()] = entry.request_id();
    }
  }
  MLF_LOG(INFO) << "worker '" << app->name << "' lost its daemon with " << waiting.size()
                << " push(es) in flight; asking the scheduler how they ended";
  const auto give_up = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(kOutcomeQueryGiveUpS));
  std::string why_not;
  while (!waiting.empty()) {
    if (stopping_->load()) {
      why_not = "the daemon stopped before the scheduler said how it ended";
      break;
    }
    if (std::chrono::steady_clock::now() >= give_up) {
      why_not = absl::StrCat("still in flight at the scheduler after ", kOutcomeQueryGiveUpS,
                             " s of asking");
      break;
    }
    v1::QueryOutcomesRequest request;
    request.set_job(app->job);
    request.set_worker(app->name);
    for (const auto& [uid, request_id] : waiting) request.add_push_uids(uid);
    request.set_wait_s(20);
    v1::QueryOutcomesReply reply;
    if (absl::Status asked = parts_.scheduler->QueryOutcomes(request, &reply); !asked.ok()) {
      MLF_LOG(WARNING) << "cannot ask the scheduler how worker '" << app->name
                       << "''s pushes ended: " << RpcErrorText(asked) << "; asking again";
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    for (const v1::PushState& push : reply.pushes()) {
      auto it = waiting.find(push.push_uid());
      if (it == waiting.end()) continue;
      absl::Status sent = absl::OkStatus();
      if (push.state() == v1::PushState::STATE_ENDED) {
        sent = answer(it->second, push.outcome(), push.reason(), push.applied_version(),
                      push.delay());
      } else if (push.state() == v1::PushState::STATE_UNKNOWN) {
        // The application tells "never reached the scheduler" from
        // "unknown" by the scheduler's uptime (LocalPushDone.no_record).
        v1::LocalMessage done;
        v1::LocalPushDone* body = done.mutable_push_done();
        body->set_request_id(it->second);
        body->set_outcome(v1::OUTCOME_FAILED);
        body->set_reason(
            "its outcome is unknown: the scheduler has no record of it (its submission died "
            "with the daemon, or it ended under a scheduler that restarted since)");
        body->set_no_record(true);
        body->set_scheduler_uptime_s(reply.uptime_s());
        sent = app->channel->Send(done);
      } else {
        continue;  // in flight: asked again
      }
      waiting.erase(it);
      if (!sent.ok()) return;  // the application left
    }
  }
  for (const auto& [uid, request_id] : waiting) {
    if (!answer(request_id, v1::OUTCOME_FAILED,
                absl::StrCat("its outcome is unknown: ", why_not), 0, 0)
             .ok()) {
      return;
    }
  }
}

void AppRequests::AppGone(const std::shared_ptr<AppSession>& app) {
  // Pushes still in flight keep their own share of their mappings.
  app->push_mappings.Clear();
  std::optional<v1::EntityGoneReport> report;
  {
    ReceiveLock::Hold lock(lock_);
    report = forget_(app);
  }
  // A server's replica takes over at once, not when the daemon goes too.
  if (!report.has_value() || stopping_->load()) return;
  if (absl::Status told = parts_.scheduler->ReportEntityGone(*report); !told.ok()) {
    MLF_LOG(WARNING) << "could not tell the scheduler that " << v1::Role_Name(report->role())
                     << " '" << report->name() << "' left: " << RpcErrorText(told);
  }
}

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
  entity.set_installs_snapshots(request.installs_snapshots());
  entity.set_plan_on_arrival(request.plan_on_arrival());
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

}  // namespace mlfabric::daemon
