#include "scheduler/service/grpc_service.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "scheduler/service/stream_waker.h"

namespace mlfabric {
namespace {

std::string Metadata(const grpc::ServerContextBase* context, const char* key) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(key);
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

// A stream refused before it began: ends with `status`.
class RefusedStream final : public grpc::ServerWriteReactor<v1::DaemonCommand> {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// A host's command stream: writes its outbox's commands one at a time (a
// write is started when the last one is done, or when the outbox wakes the
// stream with a command queued) until the host registers again or the
// scheduler stops (it ends quietly) or the daemon's side goes (cancelled,
// or a write failed: the host is marked down, SchedulerService::EndStream).
//
// Lifetime: gRPC owns the reactor until OnDone, which deletes it. The
// outbox's wake-up holds `shared_`, whose `stream` OnDone clears under its
// lock, so a wake-up that comes late finds nothing to do. No gRPC call
// (StartWrite, Finish) is made under that lock: a reaction may run inline.
class CommandStream final : public grpc::ServerWriteReactor<v1::DaemonCommand> {
 public:
  static CommandStream* Start(SchedulerService* service, StreamWaker* waker,
                              const std::string& host, uint64_t incarnation) {
    auto* stream = new CommandStream(service, host, incarnation);
    std::weak_ptr<Shared> weak = stream->shared_;
    // The outbox's wake-up is posted to `waker` (one post until it has run:
    // a burst of commands for the host is one Pump, which writes them in turn).
    stream->watch_ = service->outbox().Watch(host, [weak, waker] {
      std::shared_ptr<Shared> shared = weak.lock();
      if (shared == nullptr || shared->wake_posted.exchange(true)) return;
      waker->Post([weak] {
        if (std::shared_ptr<Shared> shared = weak.lock()) {
          shared->wake_posted.store(false);  // a command queued from here on posts again
          Pump(shared);
        }
      });
    });
    Pump(stream->shared_);  // what was queued before the stream began
    return stream;
  }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->writing = false;
      if (!ok && shared_->end_reason.empty() && !shared_->finishing) {
        shared_->end_reason = "schedule stream broken";
      }
      if (!ok) shared_->finishing = true;
    }
    Pump(shared_);
  }

  void OnCancel() override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (!shared_->finishing) shared_->end_reason = "daemon disconnected";
      shared_->finishing = true;
    }
    Pump(shared_);
  }

  void OnDone() override {
    service_->outbox().Unwatch(host_, watch_);
    std::string end_reason;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->stream = nullptr;
      end_reason = shared_->end_reason;
    }
    if (!end_reason.empty()) service_->EndStream(host_, incarnation_, end_reason);
    delete this;
  }

 private:
  struct Shared {
    std::mutex mu;
    CommandStream* stream = nullptr;  // null once done
    bool writing = false;             // a write is out (`command` is its)
    bool finishing = false;           // no more writes; Finish once none is out
    bool finished = false;            // Finish was called
    std::string end_reason;           // why the daemon's side ended ("" : quietly)
    v1::DaemonCommand command;
    std::atomic<bool> wake_posted{false};  // a wake-up waits in the StreamWaker
  };

  CommandStream(SchedulerService* service, std::string host, uint64_t incarnation)
      : service_(service), host_(std::move(host)), incarnation_(incarnation),
        shared_(std::make_shared<Shared>()) {
    shared_->stream = this;
  }

  // Starts the next write, or Finish, as the state allows; from any thread.
  static void Pump(const std::shared_ptr<Shared>& shared) {
    CommandStream* stream = nullptr;
    bool write = false, finish = false;
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      stream = shared->stream;
      if (stream == nullptr || shared->writing || shared->finished) return;
      if (!shared->finishing) {
        switch (stream->service_->outbox().TryPop(stream->host_, stream->incarnation_,
                                                  &shared->command)) {
          case CommandOutbox::PopResult::kCommand:
            shared->writing = write = true;
            break;
          case CommandOutbox::PopResult::kTimeout:  // the outbox wakes the stream again
            return;
          case CommandOutbox::PopResult::kSuperseded:  // a newer registration: nothing to fail
          case CommandOutbox::PopResult::kStopped:
            shared->finishing = true;
            break;
        }
      }
      if (!write) shared->finished = finish = true;
    }
    if (write) {
      if (shared->command.has_send()) {
        MLF_LOG(DEBUG) << "writing send command for transfer "
                       << shared->command.send().transfer_id() << " to " << stream->host_
                       << " at " << absl::StrFormat("%.6f", stream->service_->NowSeconds());
      }
      stream->StartWrite(&shared->command);
    } else if (finish) {
      stream->Finish(grpc::Status::OK);
    }
  }

  SchedulerService* const service_;
  const std::string host_;
  const uint64_t incarnation_;
  const std::shared_ptr<Shared> shared_;
  uint64_t watch_ = 0;
};

}  // namespace

SchedulerGrpcService::SchedulerGrpcService(SchedulerService* service)
    : service_(service), waker_(std::make_unique<StreamWaker>()) {}

SchedulerGrpcService::~SchedulerGrpcService() = default;

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

grpc::Status SchedulerGrpcService::Authorize(const grpc::ServerContextBase* context,
                                             const char* rpc,
                                             const std::string& host, const std::string& job) {
  absl::Status status = absl::OkStatus();
  if (!host.empty() || service_->auth().hosts_authenticated()) {
    // The call acts for `host` (the request names it) or, for calls that
    // name no host, for the host its metadata names.
    const std::string caller = Metadata(context, kHostMetadata);
    if (host.empty() && caller.empty()) {
      status = absl::UnauthenticatedError(absl::StrCat(
          "the call names no host (", kHostMetadata, "): a daemon registers its host first"));
    } else if (!host.empty() && !caller.empty() && caller != host) {
      status = absl::PermissionDeniedError(absl::StrCat(
          "host '", caller, "' may not act for host '", host, "'"));
    } else {
      status = service_->CheckHostSession(host.empty() ? caller : host,
                                          Metadata(context, kSessionMetadata));
    }
  }
  if (status.ok() && !job.empty()) {
    status = service_->CheckJobToken(job, Metadata(context, kJobTokenMetadata));
  }
  if (!status.ok()) {
    MLF_LOG(WARNING) << "refused " << rpc << " from " << context->peer() << ": "
                     << status.message();
  }
  return ToGrpcStatus(status);
}

grpc::Status SchedulerGrpcService::RegisterHost(grpc::ServerContext* context,
                                                const v1::RegisterHostRequest* request,
                                                v1::RegisterHostReply* reply) {
  std::vector<std::string> cert_names;
  if (const auto auth = context->auth_context(); auth != nullptr) {
    for (const grpc::string_ref& name : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
      cert_names.emplace_back(name.data(), name.size());
    }
  }
  if (absl::Status ok = service_->auth().CheckRegistration(
          request->host(), Metadata(context, kClusterSecretMetadata), cert_names);
      !ok.ok()) {
    MLF_LOG(WARNING) << "refused RegisterHost from " << context->peer() << ": " << ok.message();
    return ToGrpcStatus(ok);
  }
  return ToGrpcStatus(service_->RegisterHost(*request, reply));
}

grpc::Status SchedulerGrpcService::RegisterEntity(grpc::ServerContext* context,
                                                  const v1::RegisterEntityRequest* request,
                                                  v1::RegisterEntityReply* reply) {
  if (grpc::Status denied = Authorize(context, "RegisterEntity", request->host(), ""); !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(service_->RegisterEntity(*request, reply));
}

grpc::Status SchedulerGrpcService::SubmitUpdate(grpc::ServerContext* context,
                                                const v1::SubmitUpdateRequest* request,
                                                v1::SubmitUpdateReply* reply) {
  if (grpc::Status denied = Authorize(context, "SubmitUpdate", request->src_host(), request->job()); !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(service_->SubmitUpdate(*request, reply));
}

grpc::ServerWriteReactor<v1::DaemonCommand>* SchedulerGrpcService::StreamSchedules(
    grpc::CallbackServerContext* context, const v1::StreamSchedulesRequest* request) {
  const std::string& host = request->host();
  const uint64_t incarnation = request->incarnation();
  if (grpc::Status denied = Authorize(context, "StreamSchedules", host, ""); !denied.ok()) {
    return new RefusedStream(denied);
  }
  if (absl::Status status = service_->BeginStream(host, incarnation); !status.ok()) {
    return new RefusedStream(ToGrpcStatus(status));
  }
  return CommandStream::Start(service_, waker_.get(), host, incarnation);
}

grpc::Status SchedulerGrpcService::ReportCompletion(grpc::ServerContext* context,
                                                    const v1::CompletionReport* request,
                                                    v1::CompletionAck*) {
  if (grpc::Status denied = Authorize(context, "ReportCompletion", request->host(), ""); !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(service_->ReportCompletion(*request));
}

grpc::Status SchedulerGrpcService::ReportCompletions(grpc::ServerContext* context,
                                                     const v1::CompletionReports* request,
                                                     v1::CompletionAcks* reply) {
  if (grpc::Status denied = Authorize(context, "ReportCompletions", request->host(), "");
      !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(service_->ReportCompletions(*request, reply));
}

grpc::Status SchedulerGrpcService::ReportEntityGone(grpc::ServerContext* context,
                                                    const v1::EntityGoneReport* request,
                                                    v1::EntityGoneAck*) {
  // The host's session and the job's token: only a daemon of the job, on
  // the host the entity lives on (the handler checks), can start a failover.
  if (grpc::Status denied =
          Authorize(context, "ReportEntityGone", request->host(), request->job());
      !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(service_->ReportEntityGone(*request));
}

grpc::Status SchedulerGrpcService::ReportBandwidth(grpc::ServerContext* context,
                                                   const v1::BandwidthReport* request,
                                                   v1::BandwidthAck*) {
  if (grpc::Status denied = Authorize(context, "ReportBandwidth", request->host(), ""); !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(service_->ReportBandwidth(*request));
}

grpc::Status SchedulerGrpcService::PlanDistribution(grpc::ServerContext* context,
                                                    const v1::PlanDistributionRequest* request,
                                                    v1::PlanDistributionReply* reply) {
  if (grpc::Status denied = Authorize(context, "PlanDistribution", request->host(), request->job()); !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(service_->PlanDistribution(*request, reply));
}

grpc::Status SchedulerGrpcService::ResolveServer(grpc::ServerContext* context,
                                                 const v1::ResolveServerRequest* request,
                                                 v1::ResolveServerReply* reply) {
  if (grpc::Status denied = Authorize(context, "ResolveServer", "", request->job()); !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(service_->ResolveServer(*request, reply));
}

grpc::Status SchedulerGrpcService::AwaitClock(grpc::ServerContext* context,
                                              const v1::AwaitClockRequest* request,
                                              v1::AwaitClockReply* reply) {
  if (grpc::Status denied = Authorize(context, "AwaitClock", "", request->job()); !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(service_->AwaitClock(*request, reply));
}

grpc::Status SchedulerGrpcService::QueryOutcomes(grpc::ServerContext* context,
                                                 const v1::QueryOutcomesRequest* request,
                                                 v1::QueryOutcomesReply* reply) {
  if (grpc::Status denied = Authorize(context, "QueryOutcomes", "", request->job());
      !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(service_->QueryOutcomes(*request, reply));
}

grpc::Status SchedulerGrpcService::QueryMembership(grpc::ServerContext* context,
                                                   const v1::QueryMembershipRequest* request,
                                                   v1::QueryMembershipReply* reply) {
  if (grpc::Status denied = Authorize(context, "QueryMembership", "", request->job());
      !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(service_->QueryMembership(*request, reply));
}

grpc::Status SchedulerGrpcService::SyncClock(grpc::ServerContext*, const v1::SyncClockRequest*,
                                             v1::SyncClockReply* reply) {
  reply->set_scheduler_time_s(service_->NowSeconds());
  return grpc::Status::OK;
}

}  // namespace mlfabric
