#include "scheduler/service/grpc_service.h"

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace mlfabric {
namespace {

std::string Metadata(const grpc::ServerContext* context, const char* key) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(key);
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

grpc::Status SchedulerGrpcService::Authorize(const grpc::ServerContext* context, const char* rpc,
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

grpc::Status SchedulerGrpcService::StreamSchedules(
    grpc::ServerContext* context, const v1::StreamSchedulesRequest* request,
    grpc::ServerWriter<v1::DaemonCommand>* writer) {
  const std::string& host = request->host();
  const uint64_t incarnation = request->incarnation();
  if (grpc::Status denied = Authorize(context, "StreamSchedules", host, ""); !denied.ok()) {
    return denied;
  }
  if (absl::Status status = service_->BeginStream(host, incarnation); !status.ok()) {
    return ToGrpcStatus(status);
  }
  std::string end_reason;
  while (end_reason.empty()) {
    if (context->IsCancelled()) {
      end_reason = "daemon disconnected";
      break;
    }
    v1::DaemonCommand command;
    // Wake up periodically to notice a cancelled stream.
    switch (service_->outbox().Pop(host, incarnation, std::chrono::milliseconds(100), &command)) {
      case CommandOutbox::PopResult::kCommand:
        if (!writer->Write(command)) end_reason = "schedule stream broken";
        if (command.has_send()) {
          MLF_LOG(DEBUG) << "wrote send command for transfer " << command.send().transfer_id()
                         << " to " << host << " at "
                         << absl::StrFormat("%.6f", service_->NowSeconds());
        }
        break;
      case CommandOutbox::PopResult::kTimeout:
        break;
      case CommandOutbox::PopResult::kSuperseded:  // a newer registration: nothing to fail
      case CommandOutbox::PopResult::kStopped:
        return grpc::Status::OK;
    }
  }
  service_->EndStream(host, incarnation, end_reason);
  return grpc::Status::OK;
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
