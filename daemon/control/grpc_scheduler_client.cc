// GrpcSchedulerClient: SchedulerClient over a gRPC channel.
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "daemon/control/scheduler_client.h"
#include "proto/scheduler.grpc.pb.h"

namespace mlfabric::daemon {
namespace {

std::unique_ptr<grpc::ClientContext> RpcContext(double timeout_s) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  return context;
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

grpc::ChannelArguments ChannelArguments(double keepalive_s) {
  const int keepalive_ms = static_cast<int>(keepalive_s * 1000);
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive_ms);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  arguments.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // idle streams too
  return arguments;
}

class GrpcScheduleStream final : public ScheduleStream {
 public:
  GrpcScheduleStream(v1::Scheduler::Stub* stub, const v1::StreamSchedulesRequest& request)
      : reader_(stub->StreamSchedules(&context_, request)) {}
  bool Read(v1::DaemonCommand* command) override { return reader_->Read(command); }
  absl::Status Finish() override { return FromGrpc(reader_->Finish()); }
  void Cancel() override { context_.TryCancel(); }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::DaemonCommand>> reader_;
};

class GrpcSchedulerClient final : public SchedulerClient {
 public:
  GrpcSchedulerClient(const std::string& address, double keepalive_s)
      : stub_(v1::Scheduler::NewStub(grpc::CreateCustomChannel(
            address, grpc::InsecureChannelCredentials(), ChannelArguments(keepalive_s)))) {}

  absl::Status RegisterHost(const v1::RegisterHostRequest& request,
                            v1::RegisterHostReply* reply) override {
    return FromGrpc(stub_->RegisterHost(RpcContext(2).get(), request, reply));
  }
  absl::Status RegisterEntity(const v1::RegisterEntityRequest& request,
                              v1::RegisterEntityReply* reply) override {
    return FromGrpc(stub_->RegisterEntity(RpcContext(10).get(), request, reply));
  }
  absl::Status SubmitUpdate(const v1::SubmitUpdateRequest& request,
                            v1::SubmitUpdateReply* reply) override {
    return FromGrpc(stub_->SubmitUpdate(RpcContext(10).get(), request, reply));
  }
  absl::Status ReportCompletion(const v1::CompletionReport& report) override {
    v1::CompletionAck ack;
    return FromGrpc(stub_->ReportCompletion(RpcContext(10).get(), report, &ack));
  }
  absl::Status ReportBandwidth(const v1::BandwidthReport& report) override {
    v1::BandwidthAck ack;
    return FromGrpc(stub_->ReportBandwidth(RpcContext(2).get(), report, &ack));
  }
  absl::Status SyncClock(const v1::SyncClockRequest& request,
                         v1::SyncClockReply* reply) override {
    return FromGrpc(stub_->SyncClock(RpcContext(1).get(), request, reply));
  }
  absl::Status ResolveServer(const v1::ResolveServerRequest& request,
                             v1::ResolveServerReply* reply) override {
    return FromGrpc(stub_->ResolveServer(RpcContext(10).get(), request, reply));
  }
  absl::Status PlanDistribution(const v1::PlanDistributionRequest& request,
                                v1::PlanDistributionReply* reply) override {
    return FromGrpc(stub_->PlanDistribution(RpcContext(2).get(), request, reply));
  }
  absl::Status AwaitClock(const v1::AwaitClockRequest& request,
                          v1::AwaitClockReply* reply) override {
    std::unique_ptr<grpc::ClientContext> context = RpcContext(3610);
    {
      std::lock_guard<std::mutex> lock(waits_mu_);
      if (waits_cancelled_) return absl::CancelledError("the daemon is stopping");
      waits_.insert(context.get());
    }
    const grpc::Status status = stub_->AwaitClock(context.get(), request, reply);
    {
      std::lock_guard<std::mutex> lock(waits_mu_);
      waits_.erase(context.get());
    }
    return FromGrpc(status);
  }
  void CancelWaits() override {
    std::lock_guard<std::mutex> lock(waits_mu_);
    waits_cancelled_ = true;
    for (grpc::ClientContext* context : waits_) context->TryCancel();
  }
  std::unique_ptr<ScheduleStream> StreamSchedules(
      const v1::StreamSchedulesRequest& request) override {
    return std::make_unique<GrpcScheduleStream>(stub_.get(), request);
  }

 private:
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  std::mutex waits_mu_;
  std::set<grpc::ClientContext*> waits_;  // AwaitClock calls in progress
  bool waits_cancelled_ = false;
};

}  // namespace

std::unique_ptr<SchedulerClient> MakeGrpcSchedulerClient(const std::string& address,
                                                         double keepalive_s) {
  return std::make_unique<GrpcSchedulerClient>(address, keepalive_s);
}

std::string RpcErrorText(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

}  // namespace mlfabric::daemon
