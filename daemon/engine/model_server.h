// The server side of model gets (mlfabric.md §10.3; docs/architecture.md §3): gets of
// a server application on this host, answered in batches that share one
// snapshot, each batch sent down the distribution tree the scheduler plans
// for it.
//
//   ModelServer server(options, &apps, &scheduler, &send, &watchdog);
//   // on a data session, a get for a local server:
//   RETURN_IF_ERROR(server.Serve(fd, request_header, request_body));
//   // the server application's answer to a snapshot request:
//   server.Answer(batch, {version, model, error});
//   // the server application went away:
//   server.FailServer(key, "server 'ps' disconnected");
//
// A get joins the batch now gathering (GetBatcher). Its first get asks the
// application for a snapshot once the previous batch has left; every get of
// the batch resolves with that snapshot and its version. With two or more
// remote requesters (or one, when late gets may join) and a model of at
// least get_tree_min_bytes, the scheduler plans the batch's tree
// (PlanDistribution): a requester routed to a distributor is told so in
// the reply's header; the others get their copy from here through the
// SendScheduler's priority queue. A batch leaves once its copies have left
// the host (or when the uplink could have sent them, so one slow receiver
// does not hold back the next batch). A server that does not answer within
// get_timeout_s fails the whole batch with that reason.
//
// Thread safety: any method from any thread; own lock, taken before the
// SendScheduler's; the ServerApps calls are made without it.
#ifndef MLFABRIC_DAEMON_ENGINE_MODEL_SERVER_H_
#define MLFABRIC_DAEMON_ENGINE_MODEL_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "daemon/control/scheduler_client.h"
#include "daemon/engine/get_batcher.h"
#include "daemon/engine/model_request_ids.h"
#include "daemon/engine/send_scheduler.h"
#include "daemon/transport/packet.h"
#include "daemon/transport/send_watchdog.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

// The server applications on this host, as the model server sees them.
// `key` is "<job id>/<server name>".
class ServerApps {
 public:
  virtual ~ServerApps() = default;
  // Whether a server application serves `key`, waiting up to `wait_s` for
  // one that is registering.
  virtual bool AwaitServer(const std::string& key, double wait_s) = 0;
  // Asks it for a model snapshot; the answer comes later through
  // ModelServer::Answer(request_id, ...). NotFound if it is not connected.
  // `at_version` >= 0: the snapshot of exactly that version if the
  // application has not passed it yet (asked once the update that makes it
  // is handed over); else of the version it has.
  virtual absl::Status AskSnapshot(const std::string& key, uint64_t request_id,
                                   int64_t at_version) = 0;
  // The job it belongs to ("" if unknown).
  virtual std::string JobOf(const std::string& key) = 0;
};

class ModelServer {
 public:
  struct Options {
    std::string host;
    uint32_t payload_bytes = 32 << 10;
    double server_connect_wait_s = 2;  // for an application still registering
    double get_batch_wait_s = 2;
    double get_timeout_s = 30;
    int64_t get_tree_min_bytes = 1 << 20;
    int64_t get_late_joins = 2;
    double get_late_join_min_share = 0.5;
    // Snapshots kept per shard endpoint (NewHistoryRequest); 0 = none.
    size_t snapshot_history = 16;
    // This host's uplink now (bit/s; 0 = not known).
    std::function<double()> uplink_bps;
  };
  struct Stats {
    int64_t gets = 0;          // gets answered
    int64_t snapshots = 0;     // snapshots they took (one per batch)
    int64_t copies_sent = 0;   // copies sent from here
    int64_t routed = 0;        // gets sent to a distributor instead
  };

  // Every pointer must outlive this object.
  ModelServer(Options options, ServerApps* apps, SchedulerClient* scheduler, SendScheduler* send,
              transport::SendWatchdog* watchdog);

  // Answers get `request` for server `body.server()` on socket `fd`. An
  // error means the socket can no longer be used.
  absl::Status Serve(int fd, const transport::PacketHeader& request,
                     const v1::DataGetRequest& body);
  // The application's snapshot for batch `batch` (ignored if the batch gave
  // up meanwhile).
  void Answer(uint64_t batch, GetBatcher::Snapshot snapshot);
  // Server groups: a request id for the snapshot the daemon asks
  // `key`'s application for right after handing it an update; its answer
  // is kept as that version's (the last Options::snapshot_history), so that
  // a fresh get at one version finds it. 0 when none are kept.
  uint64_t NewHistoryRequest(const std::string& key);
  // Fails every batch of `key` (its application went away).
  void FailServer(const std::string& key, const std::string& why);
  // Ends every wait.
  void Stop();

  Stats stats() const;

 private:
  // Plans batch `batch`'s tree with the scheduler and records each
  // member's route (direct when no tree applies or the plan fails).
  void RouteBatch(const std::string& key, uint32_t job_id, const std::string& server,
                  uint64_t batch, int64_t model_bytes);
  // Serve, for a get that joins a batch: joins it, takes the batch's
  // snapshot if it is the first (AskBatchSnapshotLocked) and waits for it.
  std::optional<GetBatcher::Ticket> BatchSnapshot(const std::string& key,
                                                  const transport::PacketHeader& request,
                                                  const v1::DataGetRequest& body,
                                                  std::string* error, int64_t* version,
                                                  std::shared_ptr<SharedBuffer>* model);
  // Asks the application for batch `batch`'s snapshot once the previous
  // batch may let it (mu_ held, released while asking).
  void AskBatchSnapshotLocked(const std::string& key, const std::string& server, uint64_t batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // This get's route in its batch's tree (planned here by the get that took
  // the snapshot); direct when none comes within get_timeout_s.
  GetBatcher::Route AwaitRoute(const std::string& key, uint32_t job_id,
                               const std::string& server, const GetBatcher::Ticket& ticket,
                               int64_t model_bytes);
  // Sends `model` from here and waits until its bytes have (mostly) left
  // the host.
  absl::Status StreamModel(int fd, const transport::PacketHeader& request,
                           const std::shared_ptr<SharedBuffer>& model,
                           const std::optional<GetBatcher::Ticket>& ticket);
  // Returns once `fd`'s send queue holds at most a few packets not yet
  // acknowledged by the peer (or after timeout_s, or when stopping).
  void WaitSent(int fd, double timeout_s);

  const Options options_;
  ServerApps* const apps_;
  SchedulerClient* const scheduler_;
  SendScheduler* const send_;
  transport::SendWatchdog* const watchdog_;

  // A snapshot of its own for a fresh get (DataGetRequest.fresh), taken
  // now, of at least version `min_version`; waits up to get_timeout_s.
  void SoloSnapshot(const std::string& key, const std::string& server, int64_t min_version,
                    std::string* error, int64_t* version, std::shared_ptr<SharedBuffer>* model);

  mutable Mutex mu_;
  CondVar cv_;
  std::atomic<bool> stopping_{false};
  GetBatcher gets_;  // own lock, a leaf: its waits are on cv_, under mu_
  // Fresh gets' snapshot requests, by request id (kSoloId set), until answered.
  static constexpr uint64_t kSoloId = kSoloRequestBit;
  uint64_t next_solo_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::optional<GetBatcher::Snapshot>> solo_ ABSL_GUARDED_BY(mu_);
  // Shard snapshots by version, per key, and the requests still out.
  static constexpr uint64_t kHistoryId = kHistoryRequestBit;
  uint64_t next_history_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::string> history_requests_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::map<int64_t, GetBatcher::Snapshot>> history_
      ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> copies_sent_{0};
  std::atomic<int64_t> routed_{0};
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_MODEL_SERVER_H_
