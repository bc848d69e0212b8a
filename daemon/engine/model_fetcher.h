// The asking side of model gets, and the distributor's side of §10.3's
// trees (mlfabric.md §10.3; docs/architecture.md §3 "The server's link is the scarce
// resource").
//
//   ModelFetcher fetcher(options, &resolver, &get_client, &send, &watchdog);
//   int64_t version; std::shared_ptr<SharedBuffer> model;
//   RETURN_IF_ERROR(fetcher.Fetch(job, server, /*round=*/-1, priority,
//                                 &version, &model));
//   // on a data session, a requester routed here:
//   RETURN_IF_ERROR(fetcher.ServeRelay(fd, request_header, request_body));
//
// Fetch asks the scheduler where the server lives (ServerResolver, which
// remembers it), asks the server's daemon, and receives the model there or
// from the distributor the server's daemon names; if that distributor
// cannot forward, the server's daemon answers itself. `round` >= 0 asks a
// synchronous-round server for that round's sum; when that server is on
// this host, the sum is read here (LocalRoundSums), without a socket. Every copy received is
// kept (RelayTable) so that requesters routed here get it packet by packet
// as it arrives (cut-through), through the SendScheduler's queue. A copy
// that fails mid-way fails the requesters below it, with the reason.
//
// Thread safety: any method from any thread. Its lock orders the relay
// table's changes with the reply streams they feed; it is taken before the
// SendScheduler's, never held across a socket read or write or an RPC.
#ifndef MLFABRIC_DAEMON_ENGINE_MODEL_FETCHER_H_
#define MLFABRIC_DAEMON_ENGINE_MODEL_FETCHER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "daemon/control/server_resolver.h"
#include "ipc/buffer_pool.h"
#include "daemon/engine/local_round_sums.h"
#include "daemon/engine/relay_table.h"
#include "daemon/engine/send_scheduler.h"
#include "daemon/transport/get_client.h"
#include "daemon/transport/packet.h"
#include "daemon/transport/send_watchdog.h"
#include "ipc/local_ipc.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

class ModelFetcher {
 public:
  struct Options {
    std::string host;          // this daemon's host name
    std::string data_address;  // where requesters routed here connect
    // How long a requester routed here waits for our own get to begin.
    double get_timeout_s = 30;
    // A get of a server with a replica that fails waits up to this long
    // for the scheduler to name the replica's host (a failover), and gets
    // from there; 0 = fail at once.
    double failover_wait_s = 6;
  };

  // Every pointer must outlive this object.
  ModelFetcher(Options options, ServerResolver* resolver, transport::GetClient* client,
               SendScheduler* send, transport::SendWatchdog* watchdog);

  // The model (or round `round`'s sum) of `server` of `job`; errors name
  // where the get failed (the scheduler, the server's daemon, a
  // distributor).
  // `fresh_min_version` >= 0: a snapshot taken now, of at least that
  // version, sent by the server's daemon itself (DataGetRequest.fresh).
  // `contributions` (if not null): for round `round`'s sum, the pushes it
  // sums (fewer than the round was opened with when it shrank); 0 for a
  // model.
  absl::Status Fetch(const std::string& job, const std::string& server, int64_t round,
                     uint32_t priority, int64_t* version, std::shared_ptr<SharedBuffer>* model,
                     int64_t fresh_min_version = -1, uint32_t* contributions = nullptr);

  // As a distributor: answers get `request` (body.relay_batch() != 0) on
  // socket `fd` with our copy of that batch, forwarded as it arrives. An
  // error means the socket can no longer be used.
  absl::Status ServeRelay(int fd, const transport::PacketHeader& request,
                          const v1::DataGetRequest& body);

  // Round sums of servers on this host are read from `local` (no data
  // session to our own daemon, local_round_sums.h); null: every get goes
  // through a socket. Set before the first Fetch; `local` must outlive
  // this object.
  void SetLocalRoundSums(LocalRoundSums* local) { local_rounds_ = local; }
  // Models are received into buffers taken from `pool` when it has one of
  // their size (applications give get buffers back, AppRequests); null:
  // always a new one. Set before the first Fetch.
  void SetBufferPool(BufferPool* pool) { pool_ = pool; }

  // Ends every wait of ServeRelay.
  void Stop();

  // Copies forwarded to requesters routed here.
  int64_t copies_forwarded() const { return copies_forwarded_.load(); }

 private:
  // relays_'s key: a server's model batches, or its synchronous rounds.
  static std::string RelayKey(uint32_t job_id, const std::string& server, bool round);
  // A server group: every shard's part, of one version.
  absl::Status FetchGroup(const std::string& job, const std::string& group,
                          const v1::ResolveServerReply& where, uint32_t priority,
                          int64_t* version, std::shared_ptr<SharedBuffer>* model);
  static constexpr int kGroupGetAttempts = 50;
  absl::Status FetchFrom(const v1::ResolveServerReply& where, const std::string& server,
                         int64_t round, uint32_t priority, int64_t* version,
                         std::shared_ptr<SharedBuffer>* model, int64_t fresh_min_version = -1,
                         uint32_t* contributions = nullptr);
  // FetchFrom, when the server's reply on `direct` routes the get through a
  // distributor of the same batch (§10.3): the model comes from there,
  // packet by packet as it receives it. A failure there fails this get
  // only; if the distributor forwards nothing, the server's daemon is
  // asked again. `request` and `body` are the direct get's.
  absl::Status FetchThroughDistributor(const v1::ResolveServerReply& where,
                                       const std::string& server, const std::string& relay_key,
                                       const transport::GetClient::Connection& direct,
                                       transport::PacketHeader request, v1::DataGetRequest body,
                                       int64_t* version, std::shared_ptr<SharedBuffer>* model,
                                       uint32_t* contributions);
  // Reads the model that follows a get's reply header; a non-empty
  // `relay_key` keeps the copy for requesters routed here. `source` names
  // where it comes from, for their errors.
  absl::Status Receive(transport::GetClient::Connection& connection, const std::string& relay_key,
                       const std::string& source, std::shared_ptr<SharedBuffer>* model);
  // ServeRelay: this daemon's copy of `key`'s batch `batch` once its own
  // get has begun (up to get_timeout_s); null with `reply`'s error set when
  // there is none to forward, else with `reply`'s version set.
  std::shared_ptr<SharedBuffer> AwaitRelayCopy(const std::string& key, uint64_t batch,
                                               const std::string& server, const std::string& who,
                                               v1::DataGetReply* reply);
  // Carries out what the relay table said. Requires mu_.
  // Dropped copies go back to the buffer pool.
  void ApplyLocked(RelayTable::Effects effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  ServerResolver* const resolver_;
  transport::GetClient* const client_;
  SendScheduler* const send_;
  transport::SendWatchdog* const watchdog_;
  LocalRoundSums* local_rounds_ = nullptr;
  BufferPool* pool_ = nullptr;

  Mutex mu_;
  CondVar cv_;  // a copy's state changed, or stopping
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Own lock, a leaf: read without mu_; its changes are made, and their
  // effects applied, under mu_ so that the reply streams they feed see
  // them in order.
  RelayTable relays_;
  std::atomic<uint64_t> next_request_{1};
  std::atomic<int64_t> copies_forwarded_{0};
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_MODEL_FETCHER_H_
