// SchedulerService: the gRPC face of mlfabric-scheduler (DESIGN.md §3).
//
// Daemons register their hosts and open a StreamSchedules call; applications
// (through their daemons) register as workers or servers of a job and submit
// update-transfer requests. Every `batch_interval` the batching loop plans
// each server's pending requests with the configured core::Planner, then
// dispatches the plan: SendTransfer to each source daemon, ExpectDelivery
// (with the commit sequence) to the server's daemon, PushOutcome DROPPED for
// drops. Completion reports turn into PushOutcome APPLIED/FAILED at the
// source. A daemon whose stream ends is marked down: its pending and
// in-flight pushes fail, and servers waiting on them are told to skip them,
// so nothing waits forever.
//
//   SchedulerService service(config, clock, std::move(planner));
//   builder.RegisterService(&service);
//   service.Start();  // batching loop
//   ...
//   service.Stop();
//
// Thread safety: all RPC handlers may run concurrently; state is guarded by
// one mutex, and planning runs outside it.
#ifndef MLFABRIC_SCHEDULER_SERVICE_SCHEDULER_SERVICE_H_
#define MLFABRIC_SCHEDULER_SERVICE_SCHEDULER_SERVICE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/core/planner.h"
#include "scheduler/service/scheduler_config.h"

namespace mlfabric {

class SchedulerService final : public v1::Scheduler::Service {
 public:
  SchedulerService(SchedulerConfig config, const Clock* clock,
                   std::unique_ptr<core::Planner> planner);
  ~SchedulerService() override;

  void Start();
  void Stop();

  // Counters for logs and tests.
  struct Stats {
    int64_t batches = 0;
    int64_t planned = 0;
    int64_t applied = 0;
    int64_t dropped = 0;
    int64_t failed = 0;
    int64_t rejected = 0;
  };
  Stats GetStats() const;

  grpc::Status RegisterHost(grpc::ServerContext* context, const v1::RegisterHostRequest* request,
                            v1::RegisterHostReply* reply) override;
  grpc::Status RegisterEntity(grpc::ServerContext* context,
                              const v1::RegisterEntityRequest* request,
                              v1::RegisterEntityReply* reply) override;
  grpc::Status SubmitUpdate(grpc::ServerContext* context, const v1::SubmitUpdateRequest* request,
                            v1::SubmitUpdateReply* reply) override;
  grpc::Status StreamSchedules(grpc::ServerContext* context,
                               const v1::StreamSchedulesRequest* request,
                               grpc::ServerWriter<v1::DaemonCommand>* writer) override;
  grpc::Status ReportCompletion(grpc::ServerContext* context, const v1::CompletionReport* request,
                                v1::CompletionAck* reply) override;
  grpc::Status ReportBandwidth(grpc::ServerContext* context, const v1::BandwidthReport* request,
                               v1::BandwidthAck* reply) override;
  grpc::Status ResolveServer(grpc::ServerContext* context, const v1::ResolveServerRequest* request,
                             v1::ResolveServerReply* reply) override;

 private:
  struct HostState {
    std::string data_address;
    double uplink_bps = 0;
    double downlink_bps = 0;
    uint64_t incarnation = 0;
    bool alive = false;
    bool streaming = false;
    std::deque<v1::DaemonCommand> commands;
  };

  enum class UpdateState { kPending, kInFlight };

  struct UpdateRecord {
    uint64_t transfer_id = 0;
    std::string job;
    std::string server;
    std::string src_host;
    std::string worker;
    uint64_t local_id = 0;
    int64_t bytes = 0;
    int64_t version = 0;
    double norm = 0;
    UpdateState state = UpdateState::kPending;
    uint64_t sequence = 0;  // set once planned
  };

  struct ServerState {
    std::string host;
    int64_t model_version = 0;
    uint64_t next_sequence = 1;
    std::vector<uint64_t> pending;  // transfer ids in arrival order
    int64_t in_flight = 0;
  };

  struct JobState {
    uint32_t id = 0;
    JobConfig config;
    std::map<std::string, ServerState> servers;
  };

  // One server's batch, cut under the lock and planned outside it.
  struct BatchWork {
    std::string job;
    std::string server;
    core::Batch batch;
  };

  void BatchLoop();
  void PlanPendingBatches();
  void ApplyPlan(const BatchWork& work, const absl::StatusOr<core::Plan>& plan);

  // All below require mu_.
  void EnqueueLocked(const std::string& host, v1::DaemonCommand command);
  void CompleteLocked(uint64_t transfer_id, v1::Outcome outcome, const std::string& reason,
                      int64_t applied_version);
  void MarkHostDownLocked(const std::string& host, const std::string& reason);
  JobState* FindJobLocked(const std::string& job);

  const SchedulerConfig config_;
  const Clock* clock_;
  std::unique_ptr<core::Planner> planner_;

  mutable std::mutex mu_;
  std::condition_variable commands_cv_;
  std::map<std::string, HostState> hosts_;
  std::map<std::string, JobState> jobs_;
  std::map<uint64_t, UpdateRecord> updates_;
  uint64_t next_transfer_id_ = 1;
  uint64_t next_incarnation_ = 1;
  Stats stats_;
  bool stopping_ = false;
  std::condition_variable stop_cv_;
  std::thread batch_thread_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_SCHEDULER_SERVICE_H_
