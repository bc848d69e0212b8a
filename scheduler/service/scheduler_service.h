// SchedulerService: mlfabric-scheduler's state and logic (docs/architecture.md §3),
// with no gRPC in it: the handlers take the protocol's messages and return
// absl::Status; SchedulerGrpcService (grpc_service.h) is the face that
// converts to grpc::Status and runs the StreamSchedules streams.
//
// It wires the parts, each in its own file:
//   ClusterState    hosts, jobs, pushes and the outcome state machine
//   CommandOutbox   per-host DaemonCommand queues the streams drain
//   BuildBatch      pending updates + network view -> core::Batch (pure)
//   PlanInParallel  the planning pool
//   PlanDispatcher  plan -> commands, aggregates, replica copies
//   AdmitToRound / ReplicaSpecFor   synchronous rounds, the hot standby
//   AdminHistory    what the admin endpoint shows
//   BatchLoop       the batching thread
//
//   SchedulerService service(config, clock, std::move(planner));
//   SchedulerGrpcService face(&service);
//   builder.RegisterService(&face);
//   service.Start();  // batching loop
//   ...
//   service.Stop();
//   ClusterSnapshot snap = service.Snapshot();  // for the admin endpoint
//
// Thread safety: every public method may run concurrently; state is guarded
// by one mutex, which is never held while planning or while a stream waits
// for commands, and never across an RPC.
#ifndef MLFABRIC_SCHEDULER_SERVICE_SCHEDULER_SERVICE_H_
#define MLFABRIC_SCHEDULER_SERVICE_SCHEDULER_SERVICE_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "proto/scheduler.pb.h"
#include "scheduler/core/distribution.h"
#include "scheduler/core/planner.h"
#include "scheduler/service/admin_history.h"
#include "scheduler/service/batch_builder.h"
#include "scheduler/service/batch_loop.h"
#include "scheduler/service/batch_work.h"
#include "scheduler/service/cluster_state.h"
#include "scheduler/service/command_outbox.h"
#include "scheduler/service/control_auth.h"
#include "scheduler/service/plan_dispatcher.h"
#include "scheduler/service/plan_lead.h"
#include "scheduler/service/scheduler_config.h"
#include "scheduler/service/snapshot.h"

namespace mlfabric {

// The PendingUpdate::element_type of an update of `dtype` (batch_builder.h):
// float32 and float64 can be summed in the network, nothing else.
int AggregatableElementType(v1::DType dtype);

class SchedulerService {
 public:
  SchedulerService(SchedulerConfig config, const Clock* clock,
                   std::unique_ptr<core::Planner> planner);
  ~SchedulerService();

  void Start();
  void Stop();

  // Counters for logs and tests.
  using Stats = SchedulerStats;
  Stats GetStats() const;

  // A consistent copy of everything observers may show (see snapshot.h).
  ClusterSnapshot Snapshot() const;
  // Only now_s, batch_interval_ms and recent_cycles (GET /api/v1/cycles):
  // a full Snapshot holds the service's lock for ~70 ms with 1,000 hosts
  // and a busy ledger, long enough to show in the cycles it reports.
  ClusterSnapshot CyclesSnapshot() const;

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

  // The control-plane calls (proto/scheduler.proto). Errors name what was
  // wrong: InvalidArgument (a field), FailedPrecondition (not registered),
  // PermissionDenied (token, another job's server), Unavailable (down or
  // drained), NotFound.
  absl::Status RegisterHost(const v1::RegisterHostRequest& request, v1::RegisterHostReply* reply);
  absl::Status RegisterEntity(const v1::RegisterEntityRequest& request,
                              v1::RegisterEntityReply* reply);
  absl::Status SubmitUpdate(const v1::SubmitUpdateRequest& request, v1::SubmitUpdateReply* reply);
  // SSP (proto AwaitClockRequest): blocks while the worker is more than K
  // pushes ahead of its job's slowest live worker, up to ssp_max_wait_s.
  // Returns at once for jobs that are not ssp. NotFound for an unknown job.
  absl::Status AwaitClock(const v1::AwaitClockRequest& request, v1::AwaitClockReply* reply);
  // How a worker's pushes ended, by their application's ids
  // (outcome_queries.h): waits up to wait_s (at most 60) while any is in
  // flight. NotFound for an unknown job; InvalidArgument for too many uids
  // or a negative wait.
  absl::Status QueryOutcomes(const v1::QueryOutcomesRequest& request,
                             v1::QueryOutcomesReply* reply);
  // The job's membership (job_membership.h): its generation and its live
  // workers' names, sorted. NotFound for an unknown job; InvalidArgument
  // for an empty worker name; FailedPrecondition for a worker that never
  // registered with the job (one that left is answered: it learns it is
  // no member).
  absl::Status QueryMembership(const v1::QueryMembershipRequest& request,
                               v1::QueryMembershipReply* reply);
  absl::Status ReportCompletion(const v1::CompletionReport& request);
  // Each report in order, as ReportCompletion, with a result per report in
  // *reply; a report naming another host than the call's is refused
  // (InvalidArgument) and the others still handled. InvalidArgument for
  // the whole call beyond kMaxCompletionReports reports.
  static constexpr int kMaxCompletionReports = 4096;
  absl::Status ReportCompletions(const v1::CompletionReports& request,
                                 v1::CompletionAcks* reply);
  absl::Status ReportBandwidth(const v1::BandwidthReport& request);
  // An application left its daemon. A server's replica is promoted
  // (failover.h); a replica stops receiving copies. Only the host the
  // entity is registered on may report it.
  absl::Status ReportEntityGone(const v1::EntityGoneReport& request);
  absl::Status ResolveServer(const v1::ResolveServerRequest& request,
                             v1::ResolveServerReply* reply);
  // §10.3: the distribution tree for one batch of gets, planned by the core
  // (scheduler/core/distribution.h) on the current link rates minus the
  // scheduled transfers' reservations. Only the server's own host may ask.
  // Requesters that are down are refused (the server's daemon then answers
  // them itself); with get_trees off every route is direct.
  absl::Status PlanDistribution(const v1::PlanDistributionRequest& request,
                                v1::PlanDistributionReply* reply);
  double NowSeconds() const { return clock_->NowSeconds(); }

  // StreamSchedules: BeginStream checks the host's registration; the face
  // then drains outbox() for (host, incarnation) and calls EndStream with
  // why the stream ended ("" when it was superseded or the scheduler stops),
  // which marks the host down.
  absl::Status BeginStream(const std::string& host, uint64_t incarnation);
  void EndStream(const std::string& host, uint64_t incarnation, const std::string& reason);
  CommandOutbox& outbox() { return outbox_; }

  // Authentication (control_auth.h), for the gRPC face. OK when hosts are
  // not authenticated at all; Unauthenticated naming the host otherwise
  // unless `session` is the token of its current registration.
  absl::Status CheckHostSession(const std::string& host, const std::string& session) const;
  // PermissionDenied naming the job unless `token` is its token. OK for a
  // job that does not exist (the call itself then says so).
  absl::Status CheckJobToken(const std::string& job, const std::string& token) const;
  const ControlAuth& auth() const { return auth_; }

 private:
  // get_reservations: the plan's streams, reserved on their links until
  // they end (ClusterState::ReserveDistribution). Takes the lock.
  void ReserveDistribution(double now_s, const core::DistributionPlan& plan);
  // Cuts one server's batch; false when it has nothing to plan.
  bool CutBatchLocked(const std::string& job_name, JobState& job, const std::string& server_name,
                      ServerState& server, double now_s, bool use_reservations,
                      const std::map<std::string, std::vector<core::RateSegment>>& up,
                      const std::map<std::string, std::vector<core::RateSegment>>& down,
                      BatchWork* item);
  // CutBatchLocked's steps. A synchronous round's pending pushes that may
  // join it (the others end at once); false when none may.
  bool AdmitRoundPushesLocked(ServerState* server, int32_t round_size);
  // The first `admitted` pending pushes as the batch's updates.
  void AddBatchUpdatesLocked(JobState& job, const ServerState& server, size_t admitted,
                             BatchInputs* in);
  // The live, undrained hosts that may sum this batch's pushes.
  std::vector<std::string> AggregatorCandidatesLocked(const JobState& job,
                                                      const ServerState& server, size_t admitted,
                                                      int32_t round_size);
  // The admin endpoint's link sample, from the links' reservations.
  void SampleLinksLocked(double now_s,
                         const std::map<std::string, std::vector<core::RateSegment>>& up,
                         const std::map<std::string, std::vector<core::RateSegment>>& down);
  // Once a second: logs each worker whose straggler flag turned on or off.
  void LogStragglersLocked(double now_s);
  // RegisterEntity, per role, once the job, token, host and user check out.
  // Requires mu_.
  absl::Status RegisterServerLocked(JobState* job, const v1::RegisterEntityRequest& request,
                                    v1::RegisterEntityReply* reply);
  absl::Status RegisterWorkerLocked(JobState* job, const v1::RegisterEntityRequest& request);
  void RegisterReplicaLocked(JobState* job, const v1::RegisterEntityRequest& request);
  // SubmitUpdate: the push's server, waiting up to server_wait_s for it to
  // register (releasing `*lock` meanwhile). Requires mu_, held by `*lock`.
  absl::StatusOr<ServerState*> WaitForPushServerLocked(std::unique_lock<std::mutex>* lock,
                                                       JobState* job,
                                                       const v1::SubmitUpdateRequest& request);
  // SubmitUpdate: the server (and its group, waited for as above) can take
  // the push. Requires mu_, held by `*lock`.
  absl::Status CheckPushServerLocked(std::unique_lock<std::mutex>* lock, JobState* job,
                                     const v1::SubmitUpdateRequest& request,
                                     ServerState* server);
  // SubmitUpdate: records the accepted push as pending at `server`.
  // Requires mu_.
  void AcceptPushLocked(JobState* job, ServerState* server, const v1::SubmitUpdateRequest& request,
                        v1::SubmitUpdateReply* reply);
  // A push whose bytes left on a grant, as transfer `sent_as`
  // (round_grants.h): admitted and announced without a plan when `grant`
  // (taken) is its own, else failed with `refused`; either way its bytes
  // are discarded at the root if they are of no use. Requires mu_.
  void AcceptGrantedPushLocked(JobState* job, ServerState* server, UpdateRecord record,
                               uint64_t sent_as, const IssuedGrant* grant,
                               const std::string& refused, v1::SubmitUpdateReply* reply);
  // A refused SubmitUpdate that names a grant: its bytes are discarded at
  // its server's host (when the scheduler knows it). Requires mu_.
  void DiscardRefusedGrantLocked(const v1::SubmitUpdateRequest& request, const std::string& why);
  // PlanDistribution: the core's request (current residual link rates) and
  // the requesters' data addresses. Requires mu_.
  absl::Status DistributionRequestLocked(const v1::PlanDistributionRequest& request,
                                         core::DistributionRequest* plan_in,
                                         std::map<std::string, std::string>* addresses);
  // PlanDistribution: runs the configured planner on `plan_in` (no lock).
  absl::StatusOr<core::DistributionPlan> PlanDistributionTree(
      const core::DistributionRequest& plan_in) const;
  // ReportCompletion for a push's own transfer, or for one planned before a
  // restart (in_doubt.h). Requires mu_.
  absl::Status CompletePushLocked(const v1::CompletionReport& request);
  // True when every push of synchronous round `round` of `server` is in
  // (admitted earlier or pending now). Requires mu_.
  bool RoundComplete(const JobState& job, const ServerState& server, int64_t round) const;

  const SchedulerConfig config_;
  const Clock* clock_;
  std::unique_ptr<core::Planner> planner_;
  const int planner_threads_;
  const double started_s_;

  ControlAuth auth_;
  CommandOutbox outbox_;
  mutable std::mutex mu_;
  std::condition_variable servers_cv_;  // a server registered
  std::condition_variable clocks_cv_;   // an ssp worker's clock moved, or a host went down
  std::condition_variable outcomes_cv_;  // the service stops (outcome queries poll)
  bool stopping_ = false;
  AdminHistory history_;
  ClusterState state_;
  std::set<std::pair<std::string, std::string>> stragglers_;  // (job, worker), as last logged
  // ssp gets waiting, by (job, worker), and counts per job since start.
  std::map<std::pair<std::string, std::string>, JobView::SspWait> ssp_waiting_;
  std::map<std::string, std::pair<int64_t, int64_t>> ssp_wait_counts_;  // job -> (waits, timeouts)
  // The job's slowest live member (job_membership.h) on a live host:
  // (name, clock); ("", -1) if none.
  std::pair<std::string, int64_t> SlowestWorkerLocked(const std::string& job_name,
                                                      const JobState& job) const;
  double stragglers_logged_s_ = -1;
  int64_t distributions_planned_ = 0;  // seeds the distributors' pre-assignment
  PlanDispatcher dispatcher_;
  // How far after its cut each batch is planned for (plan_lead.h); by mu_.
  PlanLead plan_lead_;
  BatchLoop loop_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_SCHEDULER_SERVICE_H_
