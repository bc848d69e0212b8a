// SchedulerGrpcService: the gRPC face of mlfabric-scheduler — the only place
// grpc::Status appears. Each unary handler forwards the request to
// SchedulerService and converts its absl::Status (the codes are gRPC's
// canonical codes). StreamSchedules drains the host's CommandOutbox into the
// stream until the daemon goes away, the host registers again, or the
// scheduler stops; a stream that ends on the daemon's side marks the host
// down (its pushes fail with the reason, nothing waits for it). It is a
// gRPC callback stream: no thread waits for a host's commands (with a
// thread each, a thousand idle daemons' streams, waking every 100 ms to
// notice a cancelled call, took about 40 % of a core), the outbox wakes
// the stream when one is queued, and a cancelled call ends it at once.
// That wake-up starts the write on a thread of the face's own, never on the
// thread that queued the command: that thread mostly holds the service's
// lock, and a gRPC write sends on the socket before it returns.
//
//   SchedulerGrpcService face(&service);
//   grpc::ServerBuilder builder;
//   builder.RegisterService(&face);
//
// Authentication (control_auth.h): RegisterHost needs the cluster secret or
// this host's client certificate when the scheduler has either; every other
// call needs the session of the host it acts for (when hosts are
// authenticated), and a job-scoped call the job's token. A refused call is
// logged with its peer and answered Unauthenticated or PermissionDenied
// with a message that names what was missing; nothing else is touched.
//
// Thread safety: gRPC calls handlers concurrently; all state is in
// SchedulerService, which is thread-safe. Destroy the face after the server
// that calls it has shut down.
#ifndef MLFABRIC_SCHEDULER_SERVICE_GRPC_SERVICE_H_
#define MLFABRIC_SCHEDULER_SERVICE_GRPC_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/status/status.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/service/scheduler_service.h"

namespace mlfabric {

class StreamWaker;

// absl -> gRPC status (same canonical code, same message).
grpc::Status ToGrpcStatus(const absl::Status& status);

class SchedulerGrpcService final
    : public v1::Scheduler::WithCallbackMethod_StreamSchedules<v1::Scheduler::Service> {
 public:
  explicit SchedulerGrpcService(SchedulerService* service);
  // After the server that calls it has shut down (its streams are done).
  ~SchedulerGrpcService() override;

  grpc::Status RegisterHost(grpc::ServerContext* context, const v1::RegisterHostRequest* request,
                            v1::RegisterHostReply* reply) override;
  grpc::Status RegisterEntity(grpc::ServerContext* context,
                              const v1::RegisterEntityRequest* request,
                              v1::RegisterEntityReply* reply) override;
  grpc::Status SubmitUpdate(grpc::ServerContext* context, const v1::SubmitUpdateRequest* request,
                            v1::SubmitUpdateReply* reply) override;
  grpc::ServerWriteReactor<v1::DaemonCommand>* StreamSchedules(
      grpc::CallbackServerContext* context, const v1::StreamSchedulesRequest* request) override;
  grpc::Status ReportCompletion(grpc::ServerContext* context, const v1::CompletionReport* request,
                                v1::CompletionAck* reply) override;
  grpc::Status ReportCompletions(grpc::ServerContext* context,
                                 const v1::CompletionReports* request,
                                 v1::CompletionAcks* reply) override;
  grpc::Status ReportBandwidth(grpc::ServerContext* context, const v1::BandwidthReport* request,
                               v1::BandwidthAck* reply) override;
  grpc::Status ReportEntityGone(grpc::ServerContext* context, const v1::EntityGoneReport* request,
                                v1::EntityGoneAck* reply) override;
  grpc::Status ResolveServer(grpc::ServerContext* context, const v1::ResolveServerRequest* request,
                             v1::ResolveServerReply* reply) override;
  grpc::Status SyncClock(grpc::ServerContext* context, const v1::SyncClockRequest* request,
                         v1::SyncClockReply* reply) override;
  grpc::Status AwaitClock(grpc::ServerContext* context, const v1::AwaitClockRequest* request,
                          v1::AwaitClockReply* reply) override;
  grpc::Status QueryOutcomes(grpc::ServerContext* context, const v1::QueryOutcomesRequest* request,
                             v1::QueryOutcomesReply* reply) override;
  grpc::Status PlanDistribution(grpc::ServerContext* context,
                                const v1::PlanDistributionRequest* request,
                                v1::PlanDistributionReply* reply) override;
  grpc::Status QueryMembership(grpc::ServerContext* context,
                               const v1::QueryMembershipRequest* request,
                               v1::QueryMembershipReply* reply) override;

 private:
  // OK, or the refusal (logged). `host`: the host the request names ("" if
  // none: the metadata's); `job`: the job it is scoped to ("" if none).
  grpc::Status Authorize(const grpc::ServerContextBase* context, const char* rpc,
                         const std::string& host, const std::string& job);

  SchedulerService* service_;
  // Starts the streams' writes the outbox wakes, off the threads that
  // queue commands under the service's lock (stream_waker.h).
  std::unique_ptr<StreamWaker> waker_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_GRPC_SERVICE_H_
