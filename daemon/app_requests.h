// AppRequests: what this host's local applications ask of the daemon (the
// daemon::AppHandler of its AppSessions, docs/architecture.md §3): registration with
// the scheduler, pushes, gets, servers' acknowledgements and model replies,
// and an application leaving.
//
// - A push's bytes stay in the application's memfd until they go on the
//   wire. The push is recorded in the PushTable under a local id before
//   its SubmitUpdate, and no lock is held across the RPC: a command that
//   names the push before the reply finds it (PushTable::Adopt), and the
//   command stream never waits for a submission. The SubmitUpdate is
//   asynchronous (SchedulerClient::SubmitUpdateAsync): the application's
//   handler thread checksums the packets while the scheduler plans and then
//   takes its next message (its get) without waiting for the reply. An
//   application's pushes reach the scheduler in the order it made them:
//   one submission of it is in flight at a time, the others wait in the
//   daemon. A push the scheduler refuses is answered failed when the reply
//   comes; one still waiting when the daemon stops fails.
// - While the daemon registers again after losing the scheduler
//   (RegistrationStarted .. RegistrationEnded), pushes wait here instead
//   of being submitted, and so does one the scheduler refused because it
//   was away (UNAVAILABLE) or did not know this daemon yet
//   (UNAUTHENTICATED); once the daemon is registered they are submitted in
//   order, else they fail with the registration's error. Failing them at
//   once instead lost synchronous rounds: a rank whose round-v push fell
//   in the gap moved on to v + 1, while a rank that pushed v after the
//   restart waited for it in a round the new scheduler held open.
// - A get runs on a reused thread (BlockingWork; it waits for its model
//   from the ModelFetcher), after the SSP clock allows it in a
//   stale-synchronous job; WaitGets() returns once none is left. So does
//   an outcome query.
// - An application whose daemon died with pushes in flight connects
//   again and asks how they ended (LocalOutcomeQuery): the scheduler is
//   asked by the pushes' uids (QueryOutcomes, waiting while any is in
//   flight, up to kOutcomeQueryGiveUpS in all), and each push is answered
//   with its outcome, or failed as unknown when the scheduler has no record
//   of it (never submitted, or ended under a scheduler that restarted).
// - A server's acknowledgement ends its delivery (ServerEndpoints) or its
//   synchronous round (RoundService) and is reported to the scheduler.
// - A server or replica application that leaves is forgotten through the
//   daemon's `forget` (which fails what it expected) and reported to the
//   scheduler, so that its replica takes over at once.
//
//   AppRequests requests(options, &lock, clock, &stopping, parts, forget);
//   AppSessions apps({path, group}, &requests);
//
// Every request ends with an answer to the application: a push with its
// outcome (here, if the scheduler refuses it; later, from the command
// stream), a get with the model or an error.
//
// Thread safety: the handler methods run on AppSessions' handler
// threads (one message of an application at a time), submissions end on
// the scheduler client's threads; they take
// the receive lock (engine/receive_lock.h) for bookkeeping only, never
// across an RPC.
#ifndef MLFABRIC_DAEMON_APP_REQUESTS_H_
#define MLFABRIC_DAEMON_APP_REQUESTS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include <boost/asio/thread_pool.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/blocking_work.h"
#include "common/clock.h"
#include "daemon/apps/app_sessions.h"
#include "daemon/apps/push_table.h"
#include "ipc/buffer_pool.h"
#include "daemon/control/completion_reporter.h"
#include "daemon/control/scheduler_client.h"
#include "daemon/engine/deliveries.h"
#include "daemon/engine/model_fetcher.h"
#include "daemon/engine/model_server.h"
#include "daemon/engine/receive_lock.h"
#include "daemon/engine/replica_snapshots.h"
#include "daemon/engine/round_service.h"
#include "daemon/engine/server_endpoints.h"
#include "daemon/transport/data_auth.h"
#include "proto/local.pb.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

// The scheduler registration of an application's LocalRegister, with the
// application's user (uid from SO_PEERCRED, -1 = unknown) for jobs that
// admit one user only.
// How long a LocalOutcomeQuery asks the scheduler about pushes still in
// flight before it answers them failed as unknown.
inline constexpr double kOutcomeQueryGiveUpS = 600;

v1::RegisterEntityRequest EntityRequest(const std::string& host, int64_t uid,
                                        const v1::LocalRegister& request);

class AppRequests : public AppHandler {
 public:
  struct Options {
    std::string host;
    int64_t payload_bytes = 32 * 1024;  // the packets a push's checksums cover

  };
  // What the requests are carried out with; all must outlive this.
  struct Parts {
    SchedulerClient* scheduler = nullptr;
    CompletionReporter* reporter = nullptr;
    PushTable* pushes = nullptr;
    transport::DataKeys* keys = nullptr;
    ServerEndpoints* servers = nullptr;
    RoundService* rounds = nullptr;
    ModelServer* model_server = nullptr;
    ModelFetcher* fetcher = nullptr;
    ReplicaSnapshots* snapshots = nullptr;  // may be null
    // True while the daemon registers again after a lost schedule stream
    // (its host, then its applications); may be null.
    const std::atomic<bool>* registering = nullptr;
    // Where get buffers the applications released go, for later gets; may
    // be null (released buffers are freed then).
    BufferPool* pool = nullptr;
    // Threads that help sum a large push's checksums; may be null (the
    // handler thread sums them alone).
    boost::asio::thread_pool* compute = nullptr;
    // Starts a push's transfer on its round grant (SendTransfer with its
    // segments from 0, in seconds after now; the daemon puts them on the
    // scheduler's clock). Null: grants are never used.
    std::function<void(v1::SendTransfer)> send_granted;
    // Told when a server's or replica's registration here ends, so that
    // what the scheduler announced for it meanwhile is delivered (or
    // failed, if it was refused); may be null.
    Deliveries* deliveries = nullptr;
  };
  // Called under the receive lock when an application leaves: forgets it
  // and, if it was a server's or replica's endpoint, returns the report
  // for the scheduler.
  using ForgetLocked =
      std::function<std::optional<v1::EntityGoneReport>(const std::shared_ptr<AppSession>&)>;

  AppRequests(Options options, ReceiveLock* lock, const Clock* clock,
              const std::atomic<bool>* stopping, Parts parts, ForgetLocked forget);
  AppRequests(const AppRequests&) = delete;
  AppRequests& operator=(const AppRequests&) = delete;

  // Blocks until no get, outcome query or submission is running (call once
  // nothing starts new ones).
  void WaitGets();
  // The daemon lost the scheduler and registers again: pushes wait (see
  // the file comment).
  void RegistrationStarted() ABSL_LOCKS_EXCLUDED(submit_mu_);
  // It registered again (`status` ok: the waiting pushes are submitted, in
  // order) or gave up or stopped (they fail with `status`).
  void RegistrationEnded(const absl::Status& status) ABSL_LOCKS_EXCLUDED(submit_mu_);
  // Pushes the scheduler accepted.
  int64_t pushes_submitted() const { return pushes_submitted_.load(); }
  // Get buffers lent to applications and given back for reuse.
  int64_t buffers_lent() const { return buffers_lent_.load(); }
  int64_t buffers_returned() const { return buffers_returned_.load(); }
  // Push buffers mapped, and those whose earlier mapping was reused
  // (AppSession::push_mappings).
  int64_t push_buffers_mapped() const { return push_buffers_mapped_.load(); }
  int64_t push_buffers_reused() const { return push_buffers_reused_.load(); }

  // Rounds on the previous round's plan (scheduler/service/round_grants.h):
  // `app`'s grant for its next push to `server`, from the scheduler (with
  // its round member's SendTransfer, or the SubmitUpdate reply of a push
  // sent on a grant). It replaces the one held; a push of that round and
  // size leaves at once on it, any other push drops it.
  void AddGrant(const AppSession& app, const std::string& server, const v1::RoundGrant& grant)
      ABSL_LOCKS_EXCLUDED(grants_mu_);
  // Forgets every grant (the scheduler that gave them is gone).
  void ClearGrants() ABSL_LOCKS_EXCLUDED(grants_mu_);
  // Pushes sent on a grant, without waiting for a plan.
  int64_t granted_pushes() const { return granted_pushes_.load(); }

  // daemon::AppHandler.
  void HandleRegister(const std::shared_ptr<AppSession>& app,
                      const v1::LocalRegister& request) override;
  void HandlePush(const std::shared_ptr<AppSession>& app, const v1::LocalPush& push,
                  int fd) override;
  void HandleGet(const std::shared_ptr<AppSession>& app, const v1::LocalGet& get) override;
  void HandleUpdateAck(const v1::LocalUpdateAck& ack) override;
  void HandleModelReply(const v1::LocalModelReply& reply, int fd) override;
  void HandleOutcomeQuery(const std::shared_ptr<AppSession>& app,
                          const v1::LocalOutcomeQuery& query) override;
  // Asks the scheduler (QueryMembership, on a thread of blocking_) for the
  // app's job's membership; an app not registered as a worker is answered
  // with an error at once.
  void HandleMembershipQuery(const std::shared_ptr<AppSession>& app,
                             const v1::LocalMembershipQuery& query) override;
  void HandleRelease(const std::shared_ptr<AppSession>& app,
                     const v1::LocalRelease& release) override;
  void AppGone(const std::shared_ptr<AppSession>& app) override;

 private:
  // Ends one of the things WaitGets waits for (a get, a query or a
  // submission).
  class ThreadDone {
   public:
    explicit ThreadDone(AppRequests* requests) : requests_(requests) {}
    ~ThreadDone();

   private:
    AppRequests* const requests_;
  };

  // A push's SubmitUpdate, from the handler thread to its reply.
  struct Submission {
    std::shared_ptr<AppSession> app;
    v1::SubmitUpdateRequest request;  // kept to submit again after a refusal (HoldRefused)
    uint64_t local_id = 0;
    uint64_t request_id = 0;  // the application's id for the push
    double submit_s = 0;      // when the daemon took it (clock_)
    std::string server;       // the push's
  };
  // The grant held for `app`'s push `push` (taken out), when it is for the
  // push's round and size; any grant held for another round is dropped.
  std::optional<v1::RoundGrant> TakeGrant(const AppSession& app, const v1::LocalPush& push)
      ABSL_LOCKS_EXCLUDED(grants_mu_);
  // Issues `submission`, or queues it behind its application's submission
  // in flight.
  void Submit(Submission submission) ABSL_LOCKS_EXCLUDED(submit_mu_);
  void Issue(Submission submission) ABSL_LOCKS_EXCLUDED(submit_mu_);
  // The submission of `app` in flight ended: issues its next one, if any.
  void Next(const AppSession* app) ABSL_LOCKS_EXCLUDED(submit_mu_);
  // Answers one of a worker's pushes (request id, outcome, reason, applied
  // version, delay) with a LocalPushDone.
  using OutcomeAnswer = std::function<absl::Status(uint64_t, v1::Outcome, const std::string&,
                                                   int64_t, int64_t)>;
  // Asks the scheduler how the pushes of `query` ended, for up to
  // kOutcomeQueryGiveUpS, and answers each (on a thread of blocking_).
  void AnswerOutcomeQuery(const std::shared_ptr<AppSession>& app,
                          const v1::LocalOutcomeQuery& query, const OutcomeAnswer& answer);
  // The PushTable's record of `push`, its bytes in `buffer` (and its
  // checksums to compute, unless sessions are sealed or its server is on
  // this host: `server_here`).
  PushTable::Push PendingPush(const std::shared_ptr<AppSession>& app, const v1::LocalPush& push,
                              SharedBuffer buffer, bool server_here) const;
  // Records the reply in the PushTable, or fails the push to the application.
  void Submitted(const Submission& submission, absl::Status status,
                 const v1::SubmitUpdateReply& reply);
  // Keeps a submission refused with `status` until the daemon has
  // registered again, when the refusal says the scheduler was away and
  // the daemon is registering; true if kept (it is still counted as
  // running, and its application's later pushes still wait behind it).
  bool HoldRefused(Submission* submission, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(submit_mu_);

  const Options options_;
  ReceiveLock* const lock_;
  const Clock* const clock_;
  const std::atomic<bool>* const stopping_;
  const Parts parts_;
  const ForgetLocked forget_;
  // Gets, outcome queries and submissions running; guarded by the lock.
  int get_threads_ ABSL_GUARDED_BY(receive_side) = 0;
  absl::Mutex submit_mu_;  // a leaf
  // An application's entry exists while one submission of it is in
  // flight; it holds those waiting behind that one, in order.
  std::map<const AppSession*, std::deque<Submission>> submission_queues_
      ABSL_GUARDED_BY(submit_mu_);
  // RegistrationStarted .. RegistrationEnded: the submissions held, in the
  // order they came (each its application's first).
  bool holding_ ABSL_GUARDED_BY(submit_mu_) = false;
  std::vector<Submission> held_ ABSL_GUARDED_BY(submit_mu_);
  std::atomic<int64_t> pushes_submitted_{0};
  std::atomic<int64_t> buffers_lent_{0};
  std::atomic<int64_t> buffers_returned_{0};
  std::atomic<int64_t> push_buffers_mapped_{0};
  std::atomic<int64_t> push_buffers_reused_{0};
  std::atomic<uint64_t> next_buffer_id_{1};
  // Round grants by (job id, application, server).
  absl::Mutex grants_mu_;  // a leaf
  std::map<std::tuple<uint32_t, std::string, std::string>, v1::RoundGrant> grants_
      ABSL_GUARDED_BY(grants_mu_);
  std::atomic<int64_t> granted_pushes_{0};
  // Gets and outcome queries. Last: destroyed first (WaitGets has waited
  // for what runs there).
  BlockingWork blocking_;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_APP_REQUESTS_H_
