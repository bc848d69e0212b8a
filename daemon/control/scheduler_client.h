// SchedulerClient: the daemon's side of the control plane
// (proto/scheduler.proto), as an interface so that the daemon's parts can
// be tested with FakeSchedulerClient (fake_scheduler_client.h) instead of a
// scheduler process. GrpcSchedulerClient is the one implementation that
// includes gRPC; it puts a deadline on every call.
//
//   std::unique_ptr<SchedulerClient> client = MakeGrpcSchedulerClient("127.0.0.1:50051");
//   v1::SubmitUpdateReply reply;
//   absl::Status status = client->SubmitUpdate(request, &reply);
//   if (!status.ok()) Log(RpcErrorText(status));   // "PERMISSION_DENIED: server 'ps' ..."
//   client->SubmitUpdateAsync(request, [](absl::Status status, v1::SubmitUpdateReply reply) {
//     ...                                          // later, on a gRPC thread
//   });
//
// Errors carry the scheduler's canonical code and message unchanged.
// Thread safety: every method may be called concurrently (gRPC stubs are).
#ifndef MLFABRIC_DAEMON_CONTROL_SCHEDULER_CLIENT_H_
#define MLFABRIC_DAEMON_CONTROL_SCHEDULER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

// The daemon's one StreamSchedules call: commands in order until the
// scheduler ends it, the connection breaks or Cancel() is called.
class ScheduleStream {
 public:
  virtual ~ScheduleStream() = default;
  // Blocks for the next command; false when the stream has ended.
  virtual bool Read(v1::DaemonCommand* command) = 0;
  // Why the stream ended (after Read returned false).
  virtual absl::Status Finish() = 0;
  // Ends a Read in progress from another thread.
  virtual void Cancel() = 0;
};

class SchedulerClient {
 public:
  virtual ~SchedulerClient() = default;
  virtual absl::Status RegisterHost(const v1::RegisterHostRequest& request,
                                    v1::RegisterHostReply* reply) = 0;
  virtual absl::Status RegisterEntity(const v1::RegisterEntityRequest& request,
                                      v1::RegisterEntityReply* reply) = 0;
  virtual absl::Status SubmitUpdate(const v1::SubmitUpdateRequest& request,
                                    v1::SubmitUpdateReply* reply) = 0;
  // SubmitUpdate without waiting for the reply: `done` is called once with
  // its outcome, on one of the client's own threads (gRPC's callback
  // threads, a fixed pool), or within this call by a client that has no
  // asynchronous calls (this default). `done` must not block: it runs
  // where other calls' replies are handled.
  using SubmitDone = std::function<void(absl::Status, v1::SubmitUpdateReply)>;
  virtual void SubmitUpdateAsync(v1::SubmitUpdateRequest request, SubmitDone done) {
    v1::SubmitUpdateReply reply;
    absl::Status status = SubmitUpdate(request, &reply);
    done(std::move(status), std::move(reply));
  }
  virtual absl::Status ReportCompletion(const v1::CompletionReport& report) = 0;
  // Several reports of this host (CompletionReports): a status per report,
  // in order; a failed call fails each of its reports. This default makes
  // one ReportCompletion each (for clients with no batched call).
  virtual std::vector<absl::Status> ReportCompletions(
      const std::vector<v1::CompletionReport>& reports) {
    std::vector<absl::Status> results;
    results.reserve(reports.size());
    for (const v1::CompletionReport& report : reports) results.push_back(ReportCompletion(report));
    return results;
  }
  virtual absl::Status ReportBandwidth(const v1::BandwidthReport& report) = 0;
  virtual absl::Status ReportEntityGone(const v1::EntityGoneReport& report) = 0;
  virtual absl::Status SyncClock(const v1::SyncClockRequest& request,
                                 v1::SyncClockReply* reply) = 0;
  virtual absl::Status ResolveServer(const v1::ResolveServerRequest& request,
                                     v1::ResolveServerReply* reply) = 0;
  virtual absl::Status PlanDistribution(const v1::PlanDistributionRequest& request,
                                        v1::PlanDistributionReply* reply) = 0;
  // Blocks up to the scheduler's ssp_max_wait_s (at most an hour).
  virtual absl::Status AwaitClock(const v1::AwaitClockRequest& request,
                                  v1::AwaitClockReply* reply) = 0;
  // Blocks up to request.wait_s (the scheduler bounds it to 60 s).
  virtual absl::Status QueryOutcomes(const v1::QueryOutcomesRequest& request,
                                     v1::QueryOutcomesReply* reply) = 0;
  // A job's membership (answers at once).
  virtual absl::Status QueryMembership(const v1::QueryMembershipRequest& request,
                                       v1::QueryMembershipReply* reply) = 0;
  virtual std::unique_ptr<ScheduleStream> StreamSchedules(
      const v1::StreamSchedulesRequest& request) = 0;
  // Ends the calls in progress that may wait long (AwaitClock,
  // QueryOutcomes) with
  // Cancelled, and makes later ones fail at once; ends WaitForConnection
  // too. For stopping.
  virtual void CancelWaits() {}
  // Waits up to `timeout_s` for a connection to the scheduler, making
  // (re)connection attempts meanwhile; true once connected. For a caller
  // about to retry after the scheduler was unreachable: a call made while
  // it is unreachable fails at once, and a call made after this returned
  // true goes out on a connection that is up.
  virtual bool WaitForConnection(double timeout_s) { return true; }
};

// How the client proves who it is (docs/architecture.md §3a; scheduler/service/
// control_auth.h). The cluster secret goes with RegisterHost; every later
// call carries the host's name and the session token RegisterHost
// returned; a job-scoped call (SubmitUpdate, ResolveServer, AwaitClock,
// QueryOutcomes, PlanDistribution, QueryMembership) carries the token of its job, which the client learns
// from the RegisterEntity calls that succeeded. With `ca_pem` the channel
// is TLS (the scheduler's certificate must carry `tls_name`, default the
// address's host part), with `cert_pem`/`key_pem` mutual TLS.
struct ClientSecurity {
  std::string cluster_secret;
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  std::string tls_name;
};

// A client of the scheduler at `address` (host:port).
// Deadlines: 2 s for RegisterHost and ReportBandwidth, 1 s for SyncClock,
// 3610 s for AwaitClock and 70 s for QueryOutcomes (the scheduler bounds
// the waits), 10 s for the
// rest; the stream has none.
// `keepalive_s`: the channel pings after that long without traffic and
// drops the connection when a ping is not answered within as long, so a
// silent partition ends the schedule stream (and fails calls) in bounded
// time; unary calls also have deadlines.
std::unique_ptr<SchedulerClient> MakeGrpcSchedulerClient(const std::string& address,
                                                         double keepalive_s = 2,
                                                         ClientSecurity security = {});

// "CODE: message", the form daemon logs and application errors use.
std::string RpcErrorText(const absl::Status& status);

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_CONTROL_SCHEDULER_CLIENT_H_
