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
//   ClusterSnapshot snap = service.Snapshot();  // for the admin endpoint
//
// Thread safety: all RPC handlers and public methods may run concurrently;
// state is guarded by one mutex, and planning runs outside it.
#ifndef MLFABRIC_SCHEDULER_SERVICE_SCHEDULER_SERVICE_H_
#define MLFABRIC_SCHEDULER_SERVICE_SCHEDULER_SERVICE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/core/planner.h"
#include "scheduler/service/scheduler_config.h"
#include "scheduler/service/snapshot.h"

namespace mlfabric {

class SchedulerService final : public v1::Scheduler::Service {
 public:
  SchedulerService(SchedulerConfig config, const Clock* clock,
                   std::unique_ptr<core::Planner> planner);
  ~SchedulerService() override;

  void Start();
  void Stop();

  // Counters for logs and tests.
  using Stats = SchedulerStats;
  Stats GetStats() const;

  // A consistent copy of everything observers may show (see snapshot.h).
  ClusterSnapshot Snapshot() const;

  // Admin actions. NotFound for an unknown job or host, InvalidArgument
  // (naming the field) for an out-of-range value.
  absl::Status UpdateJobParams(const std::string& job, const JobParamsUpdate& update);
  // A draining host takes no new pushes (as source or server); pushes
  // already accepted finish normally. `drain = false` undoes it.
  absl::Status DrainHost(const std::string& host, bool drain);

  // One batching-loop step at the clock's current time: fail overdue
  // in-flight transfers, sample link use, plan and dispatch every server's
  // pending updates. The loop started by Start() calls it every
  // batch_interval_ms; tests with a FakeClock call it directly.
  void RunBatchCycle();

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
  grpc::Status SyncClock(grpc::ServerContext* context, const v1::SyncClockRequest* request,
                         v1::SyncClockReply* reply) override;

 private:
  struct HostState {
    std::string data_address;
    double capacity_up_bps = 0;
    double capacity_down_bps = 0;
    double uplink_bps = 0;    // latest report, else the capacity
    double downlink_bps = 0;
    double last_report_s = -1;
    int64_t reports = 0;
    bool draining = false;
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
    v1::DType dtype = v1::DTYPE_FLOAT32;
    uint64_t aggregate_id = 0;  // set when routed through an aggregator
    bool round_member = false;  // accepted into a synchronous round
    bool replica_punted = false;  // its replica copy waits for a later batch (§5.3)
    double submitted_s = 0;
    TransferView planned;   // set once planned (dst, segments, deadline)
  };

  // An in-network aggregate (§5.2): its constituents go to `host`, which
  // sums them and sends one transfer to the server, delivered at one
  // sequence number and applied as constituents.size() updates.
  struct AggregateRecord {
    uint64_t id = 0;
    std::string job;
    std::string server;
    std::string host;                   // the aggregator
    std::vector<uint64_t> constituents; // in commit order
    uint64_t sequence = 0;
    TransferView planned;               // aggregator -> server
  };

  // One synchronous round of a Mercury-PS server: the pushes computed from
  // model version `version`, summed at the server's daemon.
  struct RoundState {
    std::set<std::string> workers;  // who has a push in it
    int64_t bytes = -1;             // every member's size and type
    v1::DType dtype = v1::DTYPE_FLOAT32;
    std::string failed;             // why the round failed, if it did
  };

  // A hot-standby replica's view of one server (§5.3).
  struct PendingReplica {
    uint64_t id = 0;  // the push, applied at the server, not yet copied
    std::string src_host;
    std::string worker;
    int64_t bytes = 0;
    int64_t version = 0;
    double norm = 0;
  };
  struct ReplicaTrack {
    std::vector<PendingReplica> pending;   // copies punted to a later batch
    std::map<uint64_t, double> in_flight;  // copy transfer id -> update norm
    uint64_t next_sequence = 1;            // the replica's own commit order
    int64_t applied = 0;
  };

  struct ServerState {
    std::string host;
    ReplicaTrack replica;
    int64_t model_version = 0;
    uint64_t next_sequence = 1;
    std::vector<uint64_t> pending;  // transfer ids in arrival order
    int64_t in_flight = 0;
    int32_t round_size = 0;         // as registered; see RoundSizeLocked
    std::map<int64_t, RoundState> rounds;  // by the members' version
  };

  struct WorkerInfo {
    std::string host;
    int64_t delay_bound = -1;       // -1 = the job's
    double divergence_bound = -1;
  };

  struct JobState {
    uint32_t id = 0;
    JobConfig config;
    std::map<std::string, ServerState> servers;
    std::map<std::string, WorkerInfo> workers;
    std::map<std::string, std::string> replica_hosts;  // server -> its replica's host
    int64_t applied = 0;
    int64_t dropped = 0;
    int64_t failed = 0;
  };

  // One server's batch, cut under the lock and planned outside it.
  struct BatchWork {
    uint64_t batch_id = 0;
    std::string job;
    std::string server;
    int64_t priority_class = 0;
    int32_t round_size = 0;  // > 0: a synchronous-round server's batch
    core::Batch batch;
    // Filled by the planning thread.
    absl::StatusOr<core::Plan> plan = absl::UnknownError("not planned");
    double compute_ms = 0;
    int worker_thread = 0;
  };

  void BatchLoop();
  void PlanAll(std::vector<BatchWork>* work) const;
  void ApplyPlan(const BatchWork& work);
  // §5.3: sends the plan's replica copies and marks the punted ones.
  void DispatchReplicaLocked(const BatchWork& work, const core::Plan& plan, JobState* job,
                             ServerState* server);

  // All below require mu_.
  void EnqueueLocked(const std::string& host, v1::DaemonCommand command);
  void CompleteLocked(uint64_t transfer_id, v1::Outcome outcome, const std::string& reason,
                      int64_t applied_version);
  void MarkHostDownLocked(const std::string& host, const std::string& reason);
  // Fails an aggregate and every constituent still in flight, and tells the
  // aggregator and the server's daemon to forget it.
  void FailAggregateLocked(uint64_t aggregate_id, const std::string& reason);
  JobState* FindJobLocked(const std::string& job);
  // Synchronous rounds (Mercury PS): the round size in force for a server
  // (registered, else the number of workers of a sync-mode job, else 0),
  // the admission of a pending push into its round (false: it was dropped
  // or failed), and failing a whole round.
  int32_t RoundSizeLocked(const JobState& job, const ServerState& server) const;
  bool AdmitToRoundLocked(JobState* job, ServerState* server, int32_t round_size,
                          UpdateRecord* record);
  void FailRoundLocked(const std::string& job, const std::string& server, int64_t round,
                       const std::string& reason);
  // The tightest delay bound among the job's workers and its config.
  int64_t DelayBoundLocked(const JobState& job) const;
  // The tightest divergence bound (§5.3); 0 = none.
  double DivergenceBoundLocked(const JobState& job) const;
  // Forgets a server's punted replica copies and frees their held bytes.
  void DropReplicaPendingLocked(ServerState* server, const std::string& reason);
  void ExpireOverdueLocked(double now_s);
  void SampleLinksLocked(double now_s);
  // In-flight reservations on each host's uplink/downlink, as segments.
  void ReservationsLocked(std::map<std::string, std::vector<core::RateSegment>>* up,
                          std::map<std::string, std::vector<core::RateSegment>>* down) const;
  void RecordDropLocked(const UpdateRecord& record, v1::Outcome outcome,
                        const std::string& category, const std::string& reason);

  const SchedulerConfig config_;
  const Clock* clock_;
  std::unique_ptr<core::Planner> planner_;

  mutable std::mutex mu_;
  std::condition_variable commands_cv_;
  std::condition_variable servers_cv_;  // a server registered
  std::map<std::string, HostState> hosts_;
  std::map<std::string, JobState> jobs_;
  std::map<uint64_t, UpdateRecord> updates_;
  std::map<uint64_t, AggregateRecord> aggregates_;
  struct ReplicaCopy {
    std::string job;
    std::string server;
    uint64_t source = 0;   // the push copied
    std::string src_host;
    std::string replica_host;
    uint64_t sequence = 0;  // at the replica's daemon
  };
  std::map<uint64_t, ReplicaCopy> replica_copies_;  // by copy transfer id
  // Tells the replica's daemon to skip a copy that will never arrive.
  void CancelReplicaCopyLocked(uint64_t copy_id, const ReplicaCopy& copy,
                               const std::string& reason);
  uint64_t next_transfer_id_ = 1;
  uint64_t next_incarnation_ = 1;
  uint64_t next_batch_id_ = 1;
  const int planner_threads_;
  const double started_s_;
  Stats stats_;
  std::deque<BatchView> recent_batches_;
  std::deque<DropView> recent_drops_;
  std::map<std::string, int64_t> drops_by_category_;
  std::deque<DelayView> recent_delays_;
  DelayHistogram delay_histogram_;
  std::deque<LinkSample> link_samples_;
  double last_link_sample_s_ = -1e300;
  bool stopping_ = false;
  std::condition_variable stop_cv_;
  std::thread batch_thread_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_SCHEDULER_SERVICE_H_
