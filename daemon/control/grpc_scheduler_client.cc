// GrpcSchedulerClient: SchedulerClient over a gRPC channel.
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/mutex.h"
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
  // Each client its own connection, as each daemon has: without this, clients
  // of one process with equal arguments share one (the load generator,
  // testing/loadgen, runs a thousand emulated daemons in one process).
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return arguments;
}

// WaitForConnection checks for CancelWaits at least this often.
constexpr int64_t kConnectionWaitSliceMs = 100;

// The metadata keys of scheduler/service/control_auth.h.
constexpr char kClusterSecretMetadata[] = "x-mlfabric-cluster-secret";
constexpr char kHostMetadata[] = "x-mlfabric-host";
constexpr char kSessionMetadata[] = "x-mlfabric-session";
constexpr char kJobTokenMetadata[] = "x-mlfabric-job-token";

std::shared_ptr<grpc::ChannelCredentials> Credentials(const ClientSecurity& security) {
  if (security.ca_pem.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = security.ca_pem;
  tls.pem_cert_chain = security.cert_pem;
  tls.pem_private_key = security.key_pem;
  return grpc::SslCredentials(tls);
}

grpc::ChannelArguments SecureChannelArguments(const std::string& address, double keepalive_s,
                                              const ClientSecurity& security) {
  grpc::ChannelArguments arguments = ChannelArguments(keepalive_s);
  if (!security.ca_pem.empty()) {
    // The scheduler's certificate names it; by default as the address does.
    std::string name = security.tls_name;
    if (name.empty()) name = address.substr(0, address.rfind(':'));
    arguments.SetSslTargetNameOverride(name);
  }
  return arguments;
}

class GrpcScheduleStream final : public ScheduleStream {
 public:
  GrpcScheduleStream(v1::Scheduler::Stub* stub, const v1::StreamSchedulesRequest& request,
                     const std::function<void(grpc::ClientContext*)>& sign)
      : reader_((sign(&context_), stub->StreamSchedules(&context_, request))) {}
  bool Read(v1::DaemonCommand* command) override { return reader_->Read(command); }
  absl::Status Finish() override { return FromGrpc(reader_->Finish()); }
  void Cancel() override { context_.TryCancel(); }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::DaemonCommand>> reader_;
};

class GrpcSchedulerClient final : public SchedulerClient {
 public:
  GrpcSchedulerClient(const std::string& address, double keepalive_s, ClientSecurity security)
      : security_(std::move(security)),
        channel_(grpc::CreateCustomChannel(
            address, Credentials(security_),
            SecureChannelArguments(address, keepalive_s, security_))),
        stub_(v1::Scheduler::NewStub(channel_)) {}

  absl::Status RegisterHost(const v1::RegisterHostRequest& request,
                            v1::RegisterHostReply* reply) override {
    auto context = RpcContext(2);
    if (!security_.cluster_secret.empty()) {
      context->AddMetadata(kClusterSecretMetadata, security_.cluster_secret);
    }
    const absl::Status status = FromGrpc(stub_->RegisterHost(context.get(), request, reply));
    if (status.ok()) {
      MutexLock lock(&mu_);
      host_ = request.host();
      session_ = reply->session_token();
    }
    return status;
  }
  absl::Status RegisterEntity(const v1::RegisterEntityRequest& request,
                              v1::RegisterEntityReply* reply) override {
    auto context = Signed(10, "");
    const absl::Status status = FromGrpc(stub_->RegisterEntity(context.get(), request, reply));
    if (status.ok()) {
      MutexLock lock(&mu_);
      job_tokens_[request.job()] = request.job_token();
    }
    return status;
  }
  absl::Status SubmitUpdate(const v1::SubmitUpdateRequest& request,
                            v1::SubmitUpdateReply* reply) override {
    return FromGrpc(stub_->SubmitUpdate(Signed(10, request.job()).get(), request, reply));
  }
  void SubmitUpdateAsync(v1::SubmitUpdateRequest request, SubmitDone done) override {
    // What the call refers to until its callback ran.
    struct Call {
      std::unique_ptr<grpc::ClientContext> context;
      v1::SubmitUpdateRequest request;
      v1::SubmitUpdateReply reply;
      SubmitDone done;
    };
    auto call = std::make_shared<Call>();
    call->context = Signed(10, request.job());
    call->request = std::move(request);
    call->done = std::move(done);
    Call* raw = call.get();
    stub_->async()->SubmitUpdate(raw->context.get(), &raw->request, &raw->reply,
                                 [call = std::move(call)](grpc::Status status) {
                                   call->done(FromGrpc(status), std::move(call->reply));
                                 });
  }
  absl::Status ReportCompletion(const v1::CompletionReport& report) override {
    v1::CompletionAck ack;
    return FromGrpc(stub_->ReportCompletion(Signed(10, "").get(), report, &ack));
  }
  std::vector<absl::Status> ReportCompletions(
      const std::vector<v1::CompletionReport>& reports) override {
    std::vector<absl::Status> results;
    results.reserve(reports.size());
    // The scheduler takes at most 4096 a call (proto/scheduler.proto).
    constexpr size_t chunk = 4096;
    for (size_t begin = 0; begin < reports.size(); begin += chunk) {
      const size_t end = std::min(reports.size(), begin + chunk);
      v1::CompletionReports request;
      request.set_host(reports[begin].host());
      for (size_t i = begin; i < end; ++i) *request.add_reports() = reports[i];
      v1::CompletionAcks acks;
      const absl::Status call =
          FromGrpc(stub_->ReportCompletions(Signed(10, "").get(), request, &acks));
      for (size_t i = begin; i < end; ++i) {
        const int k = static_cast<int>(i - begin);
        if (!call.ok() || k >= acks.results_size()) {
          results.push_back(call.ok() ? absl::InternalError("the scheduler answered fewer "
                                                            "reports than were sent")
                                      : call);
          continue;
        }
        const v1::CompletionResult& result = acks.results(k);
        results.push_back(absl::Status(static_cast<absl::StatusCode>(result.code()),
                                       result.message()));
      }
    }
    return results;
  }
  absl::Status ReportBandwidth(const v1::BandwidthReport& report) override {
    v1::BandwidthAck ack;
    return FromGrpc(stub_->ReportBandwidth(Signed(2, "").get(), report, &ack));
  }
  absl::Status ReportEntityGone(const v1::EntityGoneReport& report) override {
    v1::EntityGoneAck ack;
    return FromGrpc(stub_->ReportEntityGone(Signed(2, report.job()).get(), report, &ack));
  }
  absl::Status SyncClock(const v1::SyncClockRequest& request,
                         v1::SyncClockReply* reply) override {
    return FromGrpc(stub_->SyncClock(Signed(1, "").get(), request, reply));
  }
  absl::Status ResolveServer(const v1::ResolveServerRequest& request,
                             v1::ResolveServerReply* reply) override {
    return FromGrpc(stub_->ResolveServer(Signed(10, request.job()).get(), request, reply));
  }
  absl::Status PlanDistribution(const v1::PlanDistributionRequest& request,
                                v1::PlanDistributionReply* reply) override {
    return FromGrpc(stub_->PlanDistribution(Signed(2, request.job()).get(), request, reply));
  }
  absl::Status AwaitClock(const v1::AwaitClockRequest& request,
                          v1::AwaitClockReply* reply) override {
    return Waiting(3610, request.job(), [&](grpc::ClientContext* context) {
      return stub_->AwaitClock(context, request, reply);
    });
  }
  absl::Status QueryOutcomes(const v1::QueryOutcomesRequest& request,
                             v1::QueryOutcomesReply* reply) override {
    return Waiting(70, request.job(), [&](grpc::ClientContext* context) {
      return stub_->QueryOutcomes(context, request, reply);
    });
  }
  absl::Status QueryMembership(const v1::QueryMembershipRequest& request,
                               v1::QueryMembershipReply* reply) override {
    return FromGrpc(stub_->QueryMembership(Signed(10, request.job()).get(), request, reply));
  }
  // A call that may wait long: CancelWaits ends it.
  template <typename Call>
  absl::Status Waiting(double deadline_s, const std::string& job, Call call) {
    std::unique_ptr<grpc::ClientContext> context = Signed(deadline_s, job);
    {
      MutexLock lock(&waits_mu_);
      if (waits_cancelled_) return absl::CancelledError("the daemon is stopping");
      waits_.insert(context.get());
    }
    const grpc::Status status = call(context.get());
    {
      MutexLock lock(&waits_mu_);
      waits_.erase(context.get());
    }
    return FromGrpc(status);
  }
  void CancelWaits() override {
    MutexLock lock(&waits_mu_);
    waits_cancelled_ = true;
    for (grpc::ClientContext* context : waits_) context->TryCancel();
  }
  bool WaitForConnection(double timeout_s) override {
    // gRPC makes progress on a connection attempt only while some thread
    // polls the channel: a blocking call in progress, or else its backup
    // poller, every 5 s. A call on a channel in TRANSIENT_FAILURE (the
    // scheduler refused the last attempt) fails at once without polling,
    // so a daemon retrying such calls would learn that a reconnection had
    // succeeded up to 5 s late. Waiting for a state change polls. The wait
    // is sliced so that CancelWaits ends it promptly.
    const auto deadline = std::chrono::system_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    while (true) {
      const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
      if (state == GRPC_CHANNEL_READY) return true;
      {
        MutexLock lock(&waits_mu_);
        if (waits_cancelled_) return false;
      }
      const auto now = std::chrono::system_clock::now();
      if (now >= deadline) return false;
      (void)channel_->WaitForStateChange(
          state, std::min(deadline, now + std::chrono::milliseconds(kConnectionWaitSliceMs)));
    }
  }
  std::unique_ptr<ScheduleStream> StreamSchedules(
      const v1::StreamSchedulesRequest& request) override {
    return std::make_unique<GrpcScheduleStream>(
        stub_.get(), request, [this](grpc::ClientContext* context) { Sign(context, ""); });
  }

 private:
  // The host's session and, for a job-scoped call, the job's token.
  void Sign(grpc::ClientContext* context, const std::string& job) {
    MutexLock lock(&mu_);
    if (!host_.empty()) context->AddMetadata(kHostMetadata, host_);
    if (!session_.empty()) context->AddMetadata(kSessionMetadata, session_);
    if (!job.empty()) {
      if (auto token = job_tokens_.find(job); token != job_tokens_.end()) {
        context->AddMetadata(kJobTokenMetadata, token->second);
      }
    }
  }
  std::unique_ptr<grpc::ClientContext> Signed(double timeout_s, const std::string& job) {
    std::unique_ptr<grpc::ClientContext> context = RpcContext(timeout_s);
    Sign(context.get(), job);
    return context;
  }

  const ClientSecurity security_;
  const std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  Mutex mu_;  // a leaf
  std::string host_ ABSL_GUARDED_BY(mu_);
  std::string session_ ABSL_GUARDED_BY(mu_);
  // From RegisterEntity calls that succeeded.
  std::map<std::string, std::string> job_tokens_ ABSL_GUARDED_BY(mu_);
  Mutex waits_mu_;
  std::set<grpc::ClientContext*> waits_ ABSL_GUARDED_BY(waits_mu_);  // AwaitClock calls in progress
  bool waits_cancelled_ ABSL_GUARDED_BY(waits_mu_) = false;
};

}  // namespace

std::unique_ptr<SchedulerClient> MakeGrpcSchedulerClient(const std::string& address,
                                                         double keepalive_s,
                                                         ClientSecurity security) {
  return std::make_unique<GrpcSchedulerClient>(address, keepalive_s, std::move(security));
}

std::string RpcErrorText(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

}  // namespace mlfabric::daemon
