#include "scheduler/service/grpc_service.h"

#include <chrono>
#include <string>

namespace mlfabric {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

grpc::Status SchedulerGrpcService::RegisterHost(grpc::ServerContext*,
                                                const v1::RegisterHostRequest* request,
                                                v1::RegisterHostReply* reply) {
  return ToGrpcStatus(service_->RegisterHost(*request, reply));
}

grpc::Status SchedulerGrpcService::RegisterEntity(grpc::ServerContext*,
                                                  const v1::RegisterEntityRequest* request,
                                                  v1::RegisterEntityReply* reply) {
  return ToGrpcStatus(service_->RegisterEntity(*request, reply));
}

grpc::Status SchedulerGrpcService::SubmitUpdate(grpc::ServerContext*,
                                                const v1::SubmitUpdateRequest* request,
                                                v1::SubmitUpdateReply* reply) {
  return ToGrpcStatus(service_->SubmitUpdate(*request, reply));
}

grpc::Status SchedulerGrpcService::StreamSchedules(
    grpc::ServerContext* context, const v1::StreamSchedulesRequest* request,
    grpc::ServerWriter<v1::DaemonCommand>* writer) {
  const std::string& host = request->host();
  const uint64_t incarnation = request->incarnation();
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

grpc::Status SchedulerGrpcService::ReportCompletion(grpc::ServerContext*,
                                                    const v1::CompletionReport* request,
                                                    v1::CompletionAck*) {
  return ToGrpcStatus(service_->ReportCompletion(*request));
}

grpc::Status SchedulerGrpcService::ReportBandwidth(grpc::ServerContext*,
                                                   const v1::BandwidthReport* request,
                                                   v1::BandwidthAck*) {
  return ToGrpcStatus(service_->ReportBandwidth(*request));
}

grpc::Status SchedulerGrpcService::PlanDistribution(grpc::ServerContext*,
                                                    const v1::PlanDistributionRequest* request,
                                                    v1::PlanDistributionReply* reply) {
  return ToGrpcStatus(service_->PlanDistribution(*request, reply));
}

grpc::Status SchedulerGrpcService::ResolveServer(grpc::ServerContext*,
                                                 const v1::ResolveServerRequest* request,
                                                 v1::ResolveServerReply* reply) {
  return ToGrpcStatus(service_->ResolveServer(*request, reply));
}

grpc::Status SchedulerGrpcService::AwaitClock(grpc::ServerContext*,
                                              const v1::AwaitClockRequest* request,
                                              v1::AwaitClockReply* reply) {
  return ToGrpcStatus(service_->AwaitClock(*request, reply));
}

grpc::Status SchedulerGrpcService::SyncClock(grpc::ServerContext*, const v1::SyncClockRequest*,
                                             v1::SyncClockReply* reply) {
  reply->set_scheduler_time_s(service_->NowSeconds());
  return grpc::Status::OK;
}

}  // namespace mlfabric
