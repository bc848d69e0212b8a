// Daemon: mlfabricd (docs/architecture.md §2, §3, §5): the wiring of the daemon's
// parts. Each part owns its state; the Daemon builds them, starts and
// stops them in order, and hands each scheduler command to the part it is
// for.
//
// - Control plane (daemon.cc, daemon_control.cc): registers the host with
//   the scheduler (estimating the clock offset, and telling a restarted
//   scheduler what this host knows of the pushes in flight), keeps one
//   StreamSchedules call open and dispatches its commands. All scheduler
//   calls go through daemon::SchedulerClient (control/), failures through
//   the CompletionReporter's own thread; no RPC is made holding a lock.
// - Local applications: daemon::AppSessions (apps/) owns the Unix-domain
//   socket and one session per application; daemon::AppRequests
//   (app_requests.h) carries out what they ask. A push is recorded in the
//   PushTable under its local id before its SubmitUpdate, so commands never
//   wait for a submission.
// - Send side: daemon::SendScheduler (engine/, its own lock and loop,
//   writing through transport::PeerConnections) releases scheduled
//   transfers at their start, paces them and sends get replies.
// - Receive side (engine/): daemon::DataReceiver runs the data sessions;
//   IncomingTransfers, RoundService (Mercury-PS rounds), NetworkAggregation
//   (§5.2), Deliveries (commit order) and ServerEndpoints (the server
//   applications, and the ServerApps of daemon::ModelServer, which answers
//   gets in batches that share one snapshot) share one ReceiveLock.
//   daemon::ModelFetcher asks other daemons for models and forwards its
//   copies as a distributor (§10.3).
// - Malformed data-plane input closes just that TCP session (logged,
//   counted); transfers it carried are reported failed, nothing else is
//   touched.
//
//   Daemon daemon(config);
//   RETURN_IF_ERROR(daemon.Start());   // registered and serving
//   ...
//   daemon.Stop();
//
// Thread safety: the parts have their own locks or share the receive lock
// (engine/receive_lock.h); the leaf locks of the engine's tables are
// taken under it, never the other way round. It is held for bookkeeping
// only, never across an RPC or a blocking socket write. The clock is
// injected (a FakeClock in tests; RealClock by default), and so may be the
// scheduler client (a fake in daemon_test).
#ifndef MLFABRIC_DAEMON_DAEMON_H_
#define MLFABRIC_DAEMON_DAEMON_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>

#include "absl/status/status.h"
#include "ipc/local_ipc.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "daemon/app_requests.h"
#include "daemon/apps/app_sessions.h"
#include "daemon/apps/push_table.h"
#include "daemon/control/completion_reporter.h"
#include "daemon/control/scheduler_client.h"
#include "daemon/control/server_resolver.h"
#include "daemon/daemon_config.h"
#include "daemon/engine/aggregation_table.h"
#include "ipc/buffer_pool.h"
#include "daemon/engine/model_fetcher.h"
#include "daemon/engine/model_server.h"
#include "daemon/engine/send_scheduler.h"
#include "daemon/engine/data_receiver.h"
#include "daemon/engine/deliveries.h"
#include "daemon/engine/incoming_transfers.h"
#include "daemon/engine/network_aggregation.h"
#include "daemon/engine/receive_lock.h"
#include "daemon/engine/replica_snapshots.h"
#include "daemon/engine/round_service.h"
#include "daemon/engine/server_endpoints.h"
#include "daemon/transport/get_client.h"
#include "daemon/transport/peer_connections.h"
#include "daemon/transport/send_watchdog.h"
#include "daemon/nicprio/nic_classes.h"
#include "monitor/bandwidth_monitor.h"
#include "proto/scheduler.pb.h"

namespace mlfabric {

class Daemon {
 public:
  // `clock` (if not null) must outlive the daemon; the real clock otherwise.
  // `scheduler` (if not null) replaces the gRPC client to config.scheduler
  // (a daemon::FakeSchedulerClient in unit tests).
  explicit Daemon(DaemonConfig config, const Clock* clock = nullptr,
                  std::unique_ptr<daemon::SchedulerClient> scheduler = nullptr);
  ~Daemon();

  absl::Status Start();
  void Stop();
  // Blocks until Stop() or a fatal error; returns why it ended.
  absl::Status Wait();

  struct Stats {
    int64_t pushes = 0;
    int64_t bytes_sent = 0;
    int64_t bytes_received = 0;
    int64_t deliveries = 0;
    int64_t malformed_sessions = 0;
    int64_t aggregates = 0;
    int64_t rounds = 0;  // synchronous rounds delivered (Mercury PS)
    int64_t gets_served = 0;      // model gets answered for local servers
    int64_t model_snapshots = 0;  // snapshots those gets took (one per batch)
    int64_t model_copies_sent = 0;  // of those gets, copies this daemon sent itself
    int64_t gets_routed = 0;        // of those gets, sent to a distributor instead (§10.3)
    int64_t copies_forwarded = 0;   // copies this daemon forwarded as a distributor
    // Round sums read by applications on this host without a socket.
    int64_t local_round_gets = 0;
    int64_t local_round_get_bytes = 0;
    // Transfers between parts of this host, taken in without a socket.
    int64_t local_transfers = 0;
    int64_t local_transfer_bytes = 0;
    // Get buffers lent to applications, and those they gave back.
    int64_t get_buffers_lent = 0;
    int64_t get_buffers_returned = 0;
    // Push buffers mapped, and those that reused an earlier mapping.
    int64_t push_buffers_mapped = 0;
    int64_t push_buffers_reused = 0;
    // Pushes sent on a round grant (scheduler/service/round_grants.h).
    int64_t granted_pushes = 0;
  };
  Stats GetStats() const;

 private:
  using AppSession = daemon::AppSession;

  absl::Status RegisterHost();
  // Requires the receive lock. What a registration tells the scheduler:
  // the pushes in doubt, the held sources, what the servers and replicas
  // here applied, the held copies; `unacknowledged` gets the applied
  // pushes no server application has acknowledged yet.
  void DescribeForRegistrationLocked(v1::RegisterHostRequest* request,
                                     std::set<uint64_t>* unacknowledged)
                                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(daemon::receive_side);
  // Takes the receive lock. A registration went through: its incarnation,
  // scheduler epoch, data keys and clock offset (`sent_s` .. `received_s`
  // the round trip) hold from now on; acknowledgements of
  // `unacknowledged` that came meanwhile are reported again.
  void AdoptRegistration(const v1::RegisterHostReply& reply, double sent_s, double received_s,
                         std::set<uint64_t> unacknowledged);
  absl::Status StartMonitor();
  // TensorLights classes on the host NIC (--nic_priority_interface), or
  // nothing when none is configured.
  absl::Status StartNicPriorities();
  // Re-estimates clock_offset_s_ every clock_sync_period_s (best of three
  // round trips) and hands it to the pacers.
  void ClockSyncLoop();
  void ScheduleStreamLoop();
  // At a lost schedule stream: what the scheduler that is gone planned
  // ends here (daemon_control.cc).
  void ScheduleLost();
  void HandleCommand(const v1::DaemonCommand& command);
  // kSend: a push (or a replica copy, or a group push's part) of this host
  // scheduled (daemon_control.cc). Requires the receive lock.
  // A transfer between two parts of this host (DeliverLocal).
  struct LocalSend {
    v1::SendTransfer send;
    std::shared_ptr<SharedBuffer> buffer;
  };
  // Carries out one scheduler command; same-host transfers it yields are
  // left in `local`, to be taken in once the lock is free.
  void ApplyCommand(const v1::DaemonCommand& command, std::vector<LocalSend>* local);
  void DeliverLocal(const LocalSend& local);
  // A push's transfer on its round grant (AppRequests::Parts::send_granted):
  // `send`'s segments start now, on the scheduler's clock. To a round root
  // on this host it waits for the member's announcement instead (it moves
  // no bytes over a NIC, and an announced member is summed straight from
  // the push's buffer, with no copy into a receive buffer).
  void SendGranted(v1::SendTransfer send);
  void ScheduleSendLocked(const v1::SendTransfer& send, std::vector<LocalSend>* local)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(daemon::receive_side);
  // ApplyCommand's commands with more to them than a call, one each
  // (daemon_control.cc). Require the receive lock.
  // kSend: adopts the push the command names and schedules it; logs when
  // the plan came (`received_s`) against when it lets the bytes go.
  void ApplySendLocked(const v1::SendTransfer& send, double received_s,
                       std::vector<LocalSend>* local)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(daemon::receive_side);
  // kAggregate: an in-network aggregation starts here.
  void ApplyAggregateLocked(const v1::AggregateTask& aggregate)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(daemon::receive_side);
  // kSnapshot: a local server's snapshot for its new replica.
  void ApplySnapshotLocked(const v1::SnapshotToReplica& snapshot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(daemon::receive_side);
  // kOutcome: tells the pushing application its push's outcome.
  void ApplyOutcomeLocked(const v1::PushOutcome& outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(daemon::receive_side);
  // kCancel. Requires the receive lock.
  void CancelLocked(const v1::CancelDelivery& cancel)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(daemon::receive_side);
  // Requires the receive lock. The scheduler's PromoteReplica: this host's
  // replica of a server is the server now (scheduler/service/failover.h).
  void PromoteReplicaLocked(const v1::PromoteReplica& promote)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(daemon::receive_side);

  // Requires the receive lock. Forgets a server or replica application's
  // endpoint and fails what it expected; returns the scheduler's report
  // when the application was the endpoint's (AppRequests sends it
  // without the lock).
  std::optional<v1::EntityGoneReport> ForgetAppLocked(const std::shared_ptr<AppSession>& app)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(daemon::receive_side);

  // This host's uplink now: the monitor's last report, else the configured
  // capacity; 0 = not known.
  double UplinkBps() const;

  const DaemonConfig config_;
  // Bounds every data-socket write by --send_timeout_s; declared early so
  // it outlives everything that writes.
  std::unique_ptr<transport::SendWatchdog> send_watchdog_;
  // Time for pacing, timestamps and the monitor: the caller's, or real_clock_.
  RealClock real_clock_;
  const Clock* clock_;
  std::unique_ptr<daemon::SchedulerClient> scheduler_;
  // Where servers live, remembered for resolve_ttl_s (one ResolveServer per
  // get otherwise).
  std::unique_ptr<daemon::ServerResolver> resolver_;
  std::unique_ptr<daemon::CompletionReporter> reporter_;
  std::shared_ptr<daemon::ScheduleStream> stream_ ABSL_GUARDED_BY(daemon::receive_side);
  uint64_t incarnation_ ABSL_GUARDED_BY(daemon::receive_side) = 0;
  // Of the scheduler last registered with.
  uint64_t scheduler_epoch_ ABSL_GUARDED_BY(daemon::receive_side) = 0;
  double clock_offset_s_ = 0;  // scheduler time - local time

  boost::asio::io_context io_;
  // The asking side of model gets, with the connections kept for the next.
  std::unique_ptr<transport::GetClient> get_client_;
  // A fixed pool for compute the applications' requests need (a large
  // push's checksums): cores - 1 threads, at most 7, none per push.
  std::unique_ptr<boost::asio::thread_pool> compute_;
  // What the local applications ask, and their socket and sessions.
  std::unique_ptr<daemon::AppRequests> app_requests_;
  std::unique_ptr<daemon::AppSessions> apps_;

  // The receive side's lock (engine/receive_lock.h), also the daemon's
  // own bookkeeping's (registration state, get threads, fatal_).
  mutable daemon::ReceiveLock lock_;
  std::atomic<bool> stopping_{false};
  // From a lost schedule stream until the host and its applications have
  // registered again.
  std::atomic<bool> registering_{false};
  absl::Status fatal_ ABSL_GUARDED_BY(daemon::receive_side);
  // Set once Stop() began or fatal_ was set (End()): Wait() and the
  // clock-sync loop wait for it on a lock of their own, so that what the
  // receive lock's waiters are told (rounds beginning, ending, failing)
  // does not wake them too.
  void End();
  Mutex ended_mu_;
  CondVar ended_cv_;
  bool ended_ ABSL_GUARDED_BY(ended_mu_) = false;
  // This host's pushes until their outcome (own lock, a leaf).
  daemon::PushTable pushes_;
  // Granted pushes to a round root on this host, by transfer id, until the
  // scheduler announces them (SendGranted).
  std::map<uint64_t, v1::SendTransfer> granted_here_ ABSL_GUARDED_BY(daemon::receive_side);
  // One kept data connection per peer daemon.
  transport::DataKeys data_keys_;  // from the scheduler; its own lock
  std::unique_ptr<transport::PeerConnections> peers_;
  // In-network aggregations (§5.2); own lock, a leaf.
  daemon::AggregationTable aggregation_table_;
  // Scheduled transfers, aggregates and get replies, paced and sent by its
  // own loop; own lock, taken under the receive lock (never the other way).
  std::unique_ptr<daemon::SendScheduler> send_;
  // The receive side (engine/): its parts share the receive lock.
  BufferPool buffer_pool_;  // receive buffers, round sums, lent get buffers
  std::unique_ptr<daemon::IncomingTransfers> incoming_ ABSL_PT_GUARDED_BY(daemon::receive_side);
  std::unique_ptr<daemon::ServerEndpoints> servers_;
  // Snapshots of local servers for their new replicas; own lock for
  // answers, the rest under the receive lock.
  std::unique_ptr<daemon::ReplicaSnapshots> snapshots_;
  std::unique_ptr<daemon::Deliveries> deliveries_;
  std::unique_ptr<daemon::NetworkAggregation> aggregation_;
  std::unique_ptr<daemon::RoundService> rounds_;
  std::unique_ptr<daemon::DataReceiver> receiver_;
  // Gets of local servers' models, answered in batches of one snapshot
  // each (§10.3); own lock, taken under the receive lock or alone.
  std::unique_ptr<daemon::ModelServer> model_server_;
  // The asking side of gets, and the copies it forwards to requesters
  // routed here (§10.3); own lock.
  std::unique_ptr<daemon::ModelFetcher> fetcher_;
  std::unique_ptr<monitor::BandwidthMonitor> monitor_;
  // Set in Start() before the scheduler's commands can arrive; own lock.
  std::unique_ptr<nicprio::NicClasses> nic_classes_;

  std::vector<std::thread> threads_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_DAEMON_DAEMON_H_
