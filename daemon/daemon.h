// Daemon: mlfabricd (DESIGN.md §2, §3, §5): the wiring of the daemon's
// parts, and what they hand up to it.
//
// - Control plane: registers the host with the scheduler (estimating the
//   clock offset), keeps one StreamSchedules call open and carries out every
//   command on it (daemon_control.cc). All scheduler calls go through
//   daemon::SchedulerClient (control/), failures through the
//   CompletionReporter's own thread; no RPC is made holding a lock.
// - Local applications: daemon::AppSessions (apps/) owns the Unix-domain
//   socket and one session per application and hands their messages up
//   (the AppHandler, daemon_apps.cc). Tensor bytes stay in the
//   application's memfd until they go on the wire. A push is recorded in
//   the PushTable under its local id before its SubmitUpdate, so commands
//   never wait for a submission.
// - Data plane: TCP to other daemons in Mercury packets (transport/). The
//   send side, daemon::SendScheduler (its own lock and loop, writing
//   through transport::PeerConnections), releases scheduled transfers at
//   their start, paces them and sends get replies; daemon_send.cc hands
//   it pushes and aggregates in the network (§5.2). Each incoming session
//   is a transport::DataSession (the protocol's checks); the daemon is its
//   handler (daemon_receive.cc): it reassembles, sums rounds and
//   aggregates packet by packet, and delivers updates to the server
//   application strictly in the scheduled commit order
//   (daemon_rounds.cc). daemon::ModelServer answers gets of local servers
//   in batches that share one snapshot (the daemon is its ServerApps,
//   daemon_server_apps.cc); daemon::ModelFetcher asks other daemons for
//   models and forwards its copies as a distributor (§10.3).
// - Malformed data-plane input closes just that TCP session (logged,
//   counted); transfers it carried are reported failed, nothing else is
//   touched.
//
//   Daemon daemon(config);
//   RETURN_IF_ERROR(daemon.Start());   // registered and serving
//   ...
//   daemon.Stop();
//
// Thread safety: the parts (SchedulerClient, CompletionReporter,
// ServerResolver, AppSessions, PushTable, BufferPool, PacketChecksums,
// SendWatchdog, AggregationTable, RoundTable, RoundRoutes, GetClient,
// PeerConnections, SendScheduler, ModelFetcher, ModelServer) have their own
// locks or none; their locks are taken under mu_, never the other way
// round. The receive, round and delivery bookkeeping shares one mutex
// (mu_), held only for bookkeeping, never across an RPC or a socket
// write. The clock is injected (a FakeClock in tests; RealClock by
// default), and so may be the scheduler client (a fake in daemon_test).
#ifndef MLFABRIC_DAEMON_DAEMON_H_
#define MLFABRIC_DAEMON_DAEMON_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>

#include "absl/status/status.h"
#include "ipc/local_ipc.h"
#include "common/clock.h"
#include "daemon/apps/app_sessions.h"
#include "daemon/apps/push_table.h"
#include "daemon/control/completion_reporter.h"
#include "daemon/control/scheduler_client.h"
#include "daemon/control/server_resolver.h"
#include "daemon/daemon_config.h"
#include "daemon/engine/aggregation_table.h"
#include "daemon/engine/buffer_pool.h"
#include "daemon/engine/applied_log.h"
#include "daemon/engine/delivery_sequencer.h"
#include "daemon/engine/get_batcher.h"
#include "daemon/engine/model_fetcher.h"
#include "daemon/engine/model_server.h"
#include "daemon/engine/relay_table.h"
#include "daemon/engine/round_routes.h"
#include "daemon/engine/packet_checksums.h"
#include "daemon/engine/round_table.h"
#include "daemon/engine/send_scheduler.h"
#include "daemon/pacing/pacer.h"
#include "daemon/queue/priority_packet_queue.h"
#include "daemon/transport/data_session.h"
#include "daemon/transport/framing.h"
#include "daemon/transport/get_client.h"
#include "daemon/transport/packet.h"
#include "daemon/transport/peer_connections.h"
#include "daemon/transport/send_watchdog.h"
#include "monitor/bandwidth_monitor.h"
#include "proto/scheduler.pb.h"

namespace mlfabric {

class Daemon : private transport::DataSessionHandler,
               private daemon::AppHandler,
               private daemon::ServerApps {
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
  };
  Stats GetStats() const;

 private:
  using AppSession = daemon::AppSession;

  struct Incoming {
    uint32_t job_id = 0;
    uint64_t total = 0;
    uint64_t received = 0;
    double first_packet_s = -1;  // monotonic time of the first data packet
    std::shared_ptr<SharedBuffer> buffer;
    // Packets received before the transfer was announced as a member of a
    // synchronous round: summed into the round when it is.
    std::vector<std::pair<uint64_t, uint32_t>> unfolded;
    std::vector<bool> seen;  // per packet slot, rejects duplicates
  };

  // A server (or replica, "replica:<server>") application on this host.
  // What it is handed, in which order, is the DeliverySequencer's.
  struct ServerEndpoint {
    std::shared_ptr<AppSession> app;
  };

  absl::Status RegisterHost();
  absl::Status StartMonitor();
  // Re-estimates clock_offset_s_ every clock_sync_period_s (best of three
  // round trips) and hands it to the pacers.
  void ClockSyncLoop();
  void ScheduleStreamLoop();
  void HandleCommand(const v1::DaemonCommand& command);
  // At a lost schedule stream: moves the held replica copies whose bytes
  // are in to orphan_copies_ (their pushes' outcomes are not known here).
  void KeepHeldCopiesLocked();

  // daemon::AppHandler: what the local applications ask (daemon_apps.cc).
  void HandleRegister(const std::shared_ptr<AppSession>& app,
                      const v1::LocalRegister& request) override;
  void HandlePush(const std::shared_ptr<AppSession>& app, const v1::LocalPush& push,
                  int fd) override;
  void HandleGet(const std::shared_ptr<AppSession>& app, const v1::LocalGet& get) override;
  void HandleUpdateAck(const v1::LocalUpdateAck& ack) override;
  void HandleModelReply(const v1::LocalModelReply& reply, int fd) override;
  void AppGone(const std::shared_ptr<AppSession>& app) override;
  // Requires mu_. Forgets a server or replica application's endpoint and
  // fails what it expected; returns the scheduler's report when the
  // application was the endpoint's (AppGone sends it without the lock).
  std::optional<v1::EntityGoneReport> ForgetAppLocked(const std::shared_ptr<AppSession>& app);
  // Requires mu_. The scheduler's PromoteReplica: this host's replica of a
  // server is the server now (scheduler/service/failover.h).
  void PromoteReplicaLocked(const v1::PromoteReplica& promote);

  void DataAcceptLoop();
  void DataSessionLoop(std::shared_ptr<boost::asio::ip::tcp::socket> socket);
  // transport::DataSessionHandler: what this daemon's data sessions hand
  // up (daemon_receive.cc).
  absl::Status Begin(const transport::PacketHeader& header) override;
  std::shared_ptr<SharedBuffer> BufferFor(const transport::PacketHeader& header) override;
  absl::Status Arrived(const transport::PacketHeader& header,
                       std::shared_ptr<SharedBuffer> buffer, bool* complete) override;
  void Authenticated(const std::string& peer, const transport::SessionAuth& auth) override;
  absl::Status GetRequest(int fd, const transport::PacketHeader& header,
                          const v1::DataGetRequest& body) override;
  void Aborted(const transport::PacketHeader& header, const std::string& reason) override;
  void Ended(const std::string& peer, const std::set<uint64_t>& unfinished,
             const std::string& close_reason) override;
  // A data packet whose CRC was checked: counts it, sums it into its round
  // or keeps it, and delivers or folds a completed transfer (*complete).
  // Requires mu_. An error closes the session.
  absl::Status AcceptDataLocked(const transport::PacketHeader& header, const uint8_t* dst,
                                bool* complete);
  // The job a transfer is expected for (a round member, an aggregate's
  // constituent or a delivery), if this host expects it yet. Requires mu_.
  std::optional<uint32_t> ExpectedJobLocked(uint64_t transfer) const;
  // Empty if `transfer` has not arrived or arrived as `job`'s data; else
  // why it is refused (logged). Requires mu_.
  std::string JobMismatchLocked(uint64_t transfer, uint32_t job) const;
  // daemon::ServerApps (daemon_server_apps.cc).
  bool AwaitServer(const std::string& key, double wait_s) override;
  absl::Status AskSnapshot(const std::string& key, uint64_t request_id,
                           int64_t at_version) override;
  // The version the server application of `key` will have once it applied
  // every update handed to it (each advancing it by its count).
  int64_t HandedVersionLocked(const std::string& key) const;
  // Snapshot requests waiting until the update that makes their version is
  // handed over (AskSnapshot's at_version), by key: (version, request id).
  std::map<std::string, std::vector<std::pair<int64_t, uint64_t>>> snapshot_waiters_;
  std::string JobOf(const std::string& key) override;

  // Require mu_.
  void ScheduleSendLocked(const v1::SendTransfer& send);
  // A push whose schedule names this host and one of its aggregations: a
  // streaming chain's member summed into the partial sum passing here (no
  // socket).
  void AcceptLocalLocked(const v1::SendTransfer& send, std::shared_ptr<SharedBuffer> buffer);
  // Queues an outgoing transfer of `buffer` (an aggregate or a push).
  void ScheduleOutgoingLocked(const v1::SendTransfer& send, std::shared_ptr<SharedBuffer> buffer,
                              std::vector<v1::TensorInfo> tensors,
                              std::shared_ptr<const daemon::PacketChecksums> checksums = nullptr);
  void StartAggregationLocked(const v1::AggregateTask& task);
  // A constituent was received completely: true if it was one here (its
  // bytes are in the sum already); ends the aggregation when it was the last.
  bool FoldLocked(uint64_t transfer_id);
  // Forgets a received transfer whose bytes are summed already (a round
  // member or an aggregate's constituent) and keeps its buffer for the next
  // transfer of that size: a fresh memfd costs a page fault and a zeroed
  // page per 4 KiB (buffer_pool.h).
  void RecycleIncomingLocked(std::map<uint64_t, Incoming>::iterator incoming);
  // Sums [offset, +length) of constituent `transfer` into its aggregate and
  // queues the aggregate's packets that became complete; false (and the
  // aggregation failed) on a bad packet.
  bool FoldIntoAggregateLocked(uint64_t aggregate_id, uint64_t transfer, const uint8_t* data,
                               uint64_t offset, uint32_t length);
  // Drop: the scheduler cancelled it. Fail: it cannot be completed here
  // (reported to the scheduler).
  void DropAggregationLocked(uint64_t aggregate_id, const std::string& reason);
  void FailAggregationLocked(uint64_t aggregate_id, const std::string& reason);
  // This host's uplink now: the monitor's last report, else the configured
  // capacity; 0 = not known.
  double UplinkBps() const;
  // Streams round `round`'s sum to a worker's daemon as chunks complete.
  absl::Status ServeRoundGet(int fd, const transport::PacketHeader& request,
                             const v1::DataGetRequest& body, int64_t round);

  // Require mu_.
  void TryDeliverLocked(uint32_t job_id, const std::string& server);
  // Synchronous rounds (daemon::RoundTable). Require mu_. Join announces a
  // member (and sums the packets it received before); Apply carries out
  // what a table call said to do: report failures, queue final chunks on
  // the watching reply streams, hand complete sums to the server.
  void JoinRoundLocked(const v1::ExpectDelivery& expect);
  void ApplyRoundEffectsLocked(daemon::RoundTable::Effects& fx);
  void DeliverRoundLocked(const std::string& key, int64_t round, daemon::RoundTable::Effects* fx);
  static std::string ServerKey(uint32_t job_id, const std::string& server);

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
  std::shared_ptr<daemon::ScheduleStream> stream_;  // guarded by mu_
  uint64_t incarnation_ = 0;
  uint64_t scheduler_epoch_ = 0;  // of the scheduler last registered with
  double clock_offset_s_ = 0;  // scheduler time - local time
  std::string data_address_;

  boost::asio::io_context io_;
  // The asking side of model gets, with the connections kept for the next.
  std::unique_ptr<transport::GetClient> get_client_;
  std::unique_ptr<boost::asio::ip::tcp::acceptor> data_acceptor_;
  // The sockets of the data sessions running now (guarded by mu_).
  std::set<std::shared_ptr<boost::asio::ip::tcp::socket>> data_sessions_;
  // Threads carrying out applications' gets (guarded by mu_).
  int get_threads_ = 0;
  // The local applications' socket and sessions.
  std::unique_ptr<daemon::AppSessions> apps_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> stopping_{false};
  absl::Status fatal_;
  // This host's pushes until their outcome (own lock, a leaf under mu_).
  daemon::PushTable pushes_;
  std::map<std::string, ServerEndpoint> servers_;     // by ServerKey
  daemon::AppliedLog applied_log_;  // what this host's servers applied (issue 16 item 4)
  daemon::AppliedLog replica_log_;  // the pushes whose copies its replicas were handed
  // Each server endpoint's model version as its acknowledgements said, by
  // ServerKey: told to a restarted scheduler when the server registers again.
  std::map<std::string, int64_t> server_versions_;
  daemon::DeliverySequencer delivery_;                // commit order, by ServerKey
  std::map<uint64_t, Incoming> incoming_;             // by transfer id
  // Held replica copies whose bytes were all in when the schedule stream
  // broke, by copy transfer id (their bytes stay in incoming_): told to the
  // scheduler at registration, which has them delivered again or dropped.
  std::map<uint64_t, v1::HeldCopy> orphan_copies_;
  // Held copies dropped incomplete at the lost stream: told once, at the
  // next registration.
  std::map<uint64_t, v1::HeldCopy> lost_copies_;
  // Held parts of group pushes whose bytes are not all in yet (issue 18),
  // by transfer id -> their endpoint's key; reported ready, then forgotten.
  std::map<uint64_t, std::string> unready_parts_;
  // In-network aggregations (§5.2); own lock, a leaf under mu_.
  daemon::AggregationTable aggregations_;
  // One kept data connection per peer daemon.
  transport::DataKeys data_keys_;  // from the scheduler; its own lock
  std::unique_ptr<transport::PeerConnections> peers_;
  // Scheduled transfers, aggregates and get replies, paced and sent by its
  // own loop; own lock, taken under mu_ (never the other way round).
  std::unique_ptr<daemon::SendScheduler> send_;
  // Mercury-PS synchronous rounds; own lock, a leaf under mu_.
  daemon::RoundTable rounds_;
  // Gets of local servers' models, answered in batches of one snapshot
  // each (§10.3); own lock, taken under mu_ or alone.
  std::unique_ptr<daemon::ModelServer> model_server_;
  // The asking side of gets, and the copies it forwards to requesters
  // routed here (§10.3); own lock, taken under mu_ or alone.
  std::unique_ptr<daemon::ModelFetcher> fetcher_;
  // Which earlier requester forwards a round's sum to each later one.
  daemon::RoundRoutes round_routes_;
  // Receive buffers delivered and not yet acknowledged (then recycled).
  std::map<uint64_t, std::pair<std::shared_ptr<AppSession>, std::shared_ptr<SharedBuffer>>>
      awaiting_ack_;
  daemon::BufferPool buffer_pool_;
  Stats stats_;
  std::unique_ptr<monitor::BandwidthMonitor> monitor_;

  std::vector<std::thread> threads_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_DAEMON_DAEMON_H_
