// MLfabric's C++ API (docs/architecture.md §3, mlfabric.md Table 1): what a training
// program links to hand every model-update transfer to MLfabric.
//
// Worker:
//   ClientOptions options;                 // job, token, daemon socket
//   options.name = "worker-1";
//   ASSIGN_OR_RETURN(auto worker, Worker::Connect(options));
//   ASSIGN_OR_RETURN(Model model, worker->Get("ps0"));      // latest model
//   std::future<PushResult> done =
//       worker->Push("ps0", grad.data(), grad.size() * sizeof(float),
//                    model.version, /*norm=*/Norm(grad));
//   PushResult r = done.get();   // applied (version, delay), dropped (reason) or failed (error)
//
// Server:
//   ASSIGN_OR_RETURN(auto server, Server::Connect(options, "ps0"));
//   server->RegisterUpdateCallback([&](const Server::Update& u) -> absl::StatusOr<int64_t> {
//     Apply(u.data, u.bytes);  return ++version; });
//   server->RegisterRequestCallback([&]() -> absl::StatusOr<Server::Snapshot> {
//     return Server::Snapshot{version, Bytes(weights)}; });
//   RETURN_IF_ERROR(server->Serve());   // until the daemon goes away or Stop()
//
// Every push ends exactly once as applied, dropped or failed; if the daemon
// dies, pending pushes and gets fail with a reason instead of hanging.
// Thread safety: Worker methods may be called from any thread. Server
// callbacks run on the server's single serving thread, in commit order.
#ifndef MLFABRIC_API_MLFABRIC_H_
#define MLFABRIC_API_MLFABRIC_H_

#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ipc/buffer_pool.h"
#include "ipc/local_ipc.h"
#include "ipc/mapped_buffers.h"

namespace mlfabric {

// How an application reaches its host's daemon and who it is there: the
// options of Worker::Connect and Server::Connect (and of RegistrationParams).
struct ClientOptions {
  // The daemon's --local_socket; empty = $MLFABRIC_DAEMON_SOCKET.
  std::string daemon_socket;
  std::string job = "demo";  // the job this application belongs to
  // The job's token from the scheduler's config; empty = $MLFABRIC_JOB_TOKEN
  // (none ships by default: registering without one is an error).
  std::string job_token;
  std::string name;                 // worker or server name
  double connect_timeout_s = 30;    // wait this long for the daemon to come up
  // Workers: when the daemon goes away (killed, restarted), connect to the
  // daemon at the same socket again for up to this long. Pushes in flight
  // stay pending and end with their real outcomes, which the new daemon
  // asks the scheduler for (by each push's uid); gets in flight fail, and
  // later pushes and gets wait for the new daemon. 0 = fail everything in
  // flight at once. -1 = $MLFABRIC_RECONNECT_S, else 10 s.
  double reconnect_s = -1;
  // Servers: > 0 makes this a synchronous-round (Mercury PS) server: each
  // round sums exactly `round_size` pushes computed from the same model
  // version. The server's daemon sums them packet by packet as they arrive
  // and streams every finished packet of the sum back to the workers' gets
  // (mercury.md §IV, Key idea 3); the server's update callback then gets the
  // round once, with count = round_size, and the version advances by one per
  // round. A worker's Get after its push of round v returns that round's sum
  // (version v + 1); before any push, the request callback's model.
  int round_size = 0;
  // Round servers: backup workers (Chen et al., "Revisiting distributed
  // synchronous SGD", 2016). A round closes with the first round_size -
  // backup_workers pushes the scheduler receives; a later push of that
  // round ends dropped ("late_for_round: ...") and its worker's Get still
  // returns the round's sum, of round_size - backup_workers pushes.
  int backup_workers = 0;
  // Servers that are not round servers: the scheduler plans each push to
  // this server as it arrives, not at the next batch tick (every 100 ms),
  // and a sync job does not make its pushes rounds. For servers whose
  // senders wait on every push, as in a collective (Alltoall's exchange
  // servers); a training server's pushes should batch.
  bool plan_on_arrival = false;
  // Workers: their delay and divergence bounds (RegistrationParams), sent
  // to the scheduler; -1 = the job's.
  int64_t delay_bound = -1;       // tau_max in model versions (§5.1)
  double divergence_bound = -1;   // Div_max, an L2 distance (§5.3)
  // Servers: one shard of a server group (docs/user-guide/sharded-servers.md;
  // mlfabric.md §10.2). This server holds bytes [begin, end) of a model
  // that workers push to and get from by the group's name; shard 0 begins
  // at 0 and each shard begins where the one before it ends (SplitModel).
  // The push a shard's update callback sees is its own part only.
  struct Shard {
    std::string group;  // empty: not a shard
    int index = 0;      // this shard's position in the group, from 0
    int count = 0;      // the group's number of shards
    int64_t begin = 0;  // the first byte of the model this shard holds
    int64_t end = 0;    // one past its last byte
  } shard;  // this server's place in its group
};

// Byte ranges [begin, end) that split a model of `bytes` bytes into `count`
// shards of nearly equal size, each a whole number of `element_bytes`-byte
// elements (`bytes` must be a multiple of it; count in [1, 64], at most one
// shard per element).
absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> SplitModel(int64_t bytes, int count,
                                                                    int64_t element_bytes = 4);

// How a push ended: applied at its server, dropped by the planner (with a
// reason, e.g. "stale"), or failed (with the error).
enum class PushOutcome { kApplied, kDropped, kFailed };

// "applied", "dropped" or "failed".
const char* PushOutcomeName(PushOutcome outcome);

// The end of one push: every push ends exactly once, as one of the three.
struct PushResult {
  PushOutcome outcome = PushOutcome::kFailed;  // applied, dropped or failed
  std::string reason;            // why it was dropped or failed
  int64_t applied_version = 0;   // model version after applying (applied)
  int64_t delay = 0;             // updates applied since v(g) (applied)
};

// Per-tensor layout of a pushed buffer: consecutive regions in id order.
// Lower priority values are sent first. The default, kLayerOrder, gives the
// i-th tensor of the push priority i: front layers first, as in Mercury
// (mercury.md §IV); any other negative priority fails the push.
struct TensorSpec {
  static constexpr int32_t kLayerOrder = -1;  // priority = the tensor's index
  uint32_t id = 0;                   // the tensor's id within the push
  uint64_t bytes = 0;                // its bytes, after the previous tensor's
  int32_t priority = kLayerOrder;    // lower is sent first
};

// Element type of a pushed buffer: what aggregators and synchronous-round
// servers sum element-wise. kOpaque bytes are never summed in the network.
enum class ElementType : int32_t {
  kFloat32 = 0, kFloat64 = 1, kOpaque = 2, kInt32 = 3, kInt64 = 4,
  kFloat16 = 5,  // IEEE binary16 (the fp16 AllReduce)
  kInt8 = 6, kUint8 = 7, kInt16 = 8, kUint16 = 9,  // summed wrapping modulo 2^width
};

// A model returned by Worker::Get: its version and its bytes, a view of a
// shared buffer the daemon filled (no copy).
struct Model {
  int64_t version = 0;  // the server's model version
  // After a push to a synchronous-round server, Get returns the round's sum:
  // this is how many pushes it sums. That is the round's size, or fewer when
  // a member left the job mid-round and the round shrank to the others
  // (docs/user-guide/sync-training.md, "Job membership"): divide by it, not
  // by the number of workers you started with. 0 for a model.
  int32_t count = 0;
  // Gives the buffer back to the daemon for a later get once this model is
  // gone (declared before `buffer`, so it runs after the buffer is
  // dropped); empty when the daemon did not lend the buffer. A lent buffer
  // is a view of the Worker's kept mapping (get_mappings_), which nothing
  // reads until the daemon lends the buffer again with new contents.
  std::shared_ptr<void> lease;
  SharedBuffer buffer;  // the model's bytes, zero-copy from the daemon
  const uint8_t* data() const { return buffer.data(); }  // the model's first byte
  size_t size() const { return buffer.size(); }          // the model's bytes
};

// A job's membership (elastic training, docs/user-guide/sync-training.md
// "Job membership"): its live workers and a generation that grows by one
// with every join or leave, as the scheduler knew them when asked.
struct JobMembers {
  uint64_t generation = 0;           // grows by one with every join or leave
  std::vector<std::string> members;  // worker names, sorted bytewise
};

// A training process's handle on its daemon: pushes updates to servers and
// gets their models. Thread-safe; one per process is enough.
class Worker {
 public:
  // Connects to the daemon at options.daemon_socket and registers as worker
  // options.name of options.job; fails naming what was wrong (no daemon, a
  // bad token, a negative delay bound).
  static absl::StatusOr<std::unique_ptr<Worker>> Connect(const ClientOptions& options);
  ~Worker();

  // Pushes `bytes` bytes (copied once, into shared memory) computed from
  // model version `version`, with the update's L2 norm (used for replica
  // divergence bounds). `shape`, when given, is the dimensions of the
  // tensor the bytes hold ({} is a scalar; a piece of a larger tensor names
  // the whole tensor's): a synchronous-round server's round then also
  // requires every push naming a shape to name the same one, and fails for
  // every member ("mismatch: ... has shape [..] but round R sums shape
  // [..]") when two differ. No shape agrees with any.
  std::future<PushResult> Push(const std::string& server, const void* data, size_t bytes,
                               int64_t version, double norm,
                               const std::vector<TensorSpec>& tensors = {},
                               ElementType type = ElementType::kFloat32,
                               const std::optional<std::vector<int64_t>>& shape = std::nullopt);
  // As Push, but calls `done` with the result (on the worker's reader
  // thread) instead of returning a future.
  void PushAsync(const std::string& server, const void* data, size_t bytes, int64_t version,
                 double norm, std::function<void(PushResult)> done,
                 const std::vector<TensorSpec>& tensors = {},
                 ElementType type = ElementType::kFloat32,
                 const std::optional<std::vector<int64_t>>& shape = std::nullopt);

  // The server's current model (blocks). `priority` orders the reply's
  // packets in the server daemon's queue among this job's traffic (lower
  // first, like TensorSpec::priority); the job's own rank (TensorLights)
  // comes before it.
  absl::StatusOr<Model> Get(const std::string& server, int32_t priority = 0);

  // The job's membership now, asked of the scheduler through the daemon
  // (blocks for one round trip). An error names what failed: the daemon
  // lost, the scheduler unreachable, or the job or worker unknown to it.
  absl::StatusOr<JobMembers> Membership();

  // The model version the daemon reported at registration.
  int64_t initial_version() const { return initial_version_; }
  // Times this worker connected to its daemon again after losing it.
  int64_t reconnects() const;
  // The host name of this worker's daemon: workers that see the same name
  // share one daemon and one machine.
  const std::string& daemon_host() const { return daemon_host_; }
  // Pushes whose shared buffer was one of an earlier push, which the
  // daemon had released (instead of a new memfd).
  int64_t push_buffers_reused() const { return push_buffers_.reused(); }
  // Lent get buffers mapped, and those that reused the mapping of an
  // earlier get (the daemon lent the same buffer again).
  int64_t get_buffers_mapped() const { return get_mappings_.misses(); }
  int64_t get_buffers_reused() const { return get_mappings_.hits(); }  // of which reused

 private:
  struct PendingPush {
    uint64_t uid = 0;  // LocalPush.uid
    std::function<void(PushResult)> done;
    std::chrono::steady_clock::time_point handed;  // to the daemon
    // The shared buffer the daemon was handed; reused once it says it
    // released it (LocalPushDone.buffer_released).
    std::shared_ptr<SharedBuffer> buffer;
  };
  // Shared buffers of pushes that ended (the daemon released them), kept
  // for the next push of the same size: a fresh memfd costs the allocation
  // and zeroing of every page, on both sides, each push.
  BufferPool push_buffers_{BufferPool::Bounds{4, size_t{512} << 20}};
  // The mappings of buffers the daemon lent with gets: it lends the same
  // ones again (from its pool, after LocalRelease), and mapping each afresh
  // cost a mmap with MAP_POPULATE and a munmap per get. Safe to keep: the
  // daemon refills a lent buffer only after the Model that viewed it is
  // gone, and the next Model to view it is handed out after that refill.
  // Only this daemon's buffers: cleared when connecting to another.
  MappedBuffers get_mappings_;

  Worker() = default;
  void ReaderLoop();
  // ReaderLoop's answers from the daemon: a push ended (its callback
  // runs), a get ended (its model, lent buffer `fd`, or error is set).
  void PushDone(const v1::LocalPushDone& done);
  void GetDone(const v1::LocalGetDone& done, int fd, const std::shared_ptr<LocalChannel>& channel);
  void MembershipDone(const v1::LocalMembership& done);
  // The membership queries waiting, taken out (they fail with the caller's error).
  std::vector<std::shared_ptr<std::promise<absl::StatusOr<JobMembers>>>> TakeMemberships();
  void FailAll(const std::string& reason);
  // The connection was lost (`why`): connects and registers again within
  // reconnect_s and asks how the pending pushes ended; false if it could
  // not (everything was failed then).
  bool Reconnect(const std::string& why);
  // The channel to send on once connected (waits while reconnecting, up
  // to its deadline); null once closed (`*reason` says why).
  std::shared_ptr<LocalChannel> SendChannel(std::string* reason);
  // The push, taken out of pushes_ (false if it ended already).
  bool TakePush(uint64_t request_id, PendingPush* push);

  ClientOptions options_;  // as connected, to connect and register again
  double reconnect_s_ = 0;
  std::string socket_path_;
  std::string daemon_host_;
  int64_t initial_version_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // reconnecting_ or closed_ changed
  std::shared_ptr<LocalChannel> channel_;  // guarded by mu_
  bool reconnecting_ = false;
  bool shutting_down_ = false;  // the destructor runs: no reconnecting
  int64_t reconnects_ = 0;
  bool closed_ = false;
  std::string closed_reason_;
  uint64_t next_request_id_ = 1;
  uint64_t next_uid_ = 0;  // random start, then one up per push
  std::map<uint64_t, PendingPush> pushes_;
  std::map<uint64_t, std::shared_ptr<std::promise<absl::StatusOr<Model>>>> gets_;
  std::map<uint64_t, std::shared_ptr<std::promise<absl::StatusOr<JobMembers>>>> memberships_;
  std::thread reader_;
};

// A parameter server's handle on its daemon: the daemon hands it updates in
// commit order (the update callback) and asks it for model snapshots to
// answer gets (the request callback).
class Server {
 public:
  // One delivery: a pushed update, or an in-network aggregate of `count`.
  struct Update {
    uint64_t transfer_id = 0;  // the scheduler's id of the push (or aggregate)
    uint64_t sequence = 0;   // commit position at this server
    // Pushed updates summed into this delivery: 1, or the number of
    // constituents of an in-network aggregate (§5.2). Apply it as that many
    // updates: the model version advances by `count`.
    int64_t count = 1;
    std::string worker;      // the worker that pushed it
    int64_t version = 0;     // v(g)
    double norm = 0;         // the update's L2 norm, as pushed
    const uint8_t* data = nullptr;  // its bytes, valid during the callback
    size_t bytes = 0;        // how many
  };
  // The model a get is answered with.
  struct Snapshot {
    int64_t version = 0;          // the model's version
    std::vector<uint8_t> bytes;   // the model's bytes
  };
  // Applies one update (or aggregate of `count` updates); returns the model
  // version after applying it, or an error that fails the push(es).
  using UpdateCallback = std::function<absl::StatusOr<int64_t>(const Update&)>;
  // Returns the current model, to answer a batch of gets.
  using RequestCallback = std::function<absl::StatusOr<Snapshot>()>;

  // Connects to the daemon and registers as server options.name of
  // options.job (a round server with options.round_size > 0, a shard with
  // options.shard.group set).
  static absl::StatusOr<std::unique_ptr<Server>> Connect(const ClientOptions& options);
  ~Server();

  // The update callback; set it before Serve().
  void RegisterUpdateCallback(UpdateCallback callback) { on_update_ = std::move(callback); }
  // The request callback; set it before Serve().
  void RegisterRequestCallback(RequestCallback callback) { on_request_ = std::move(callback); }

  // Serves deliveries and model requests until Stop() or the daemon goes
  // away (then returns kUnavailable).
  absl::Status Serve();
  // Makes Serve() return; may be called from any thread.
  void Stop();
  // The model version the daemon reported at registration.
  int64_t initial_version() const { return initial_version_; }

 private:
  Server() = default;
  std::unique_ptr<LocalChannel> channel_;
  UpdateCallback on_update_;
  RequestCallback on_request_;
  int64_t initial_version_ = 0;
  std::atomic<bool> stopping_{false};
};

namespace internal {
// The job's token: ClientOptions::job_token, else $MLFABRIC_JOB_TOKEN, else
// InvalidArgument saying so.
absl::StatusOr<std::string> JobToken(const ClientOptions& options);
// Maps a delivered update's memfd (taking `fd`), runs `on_update` on it and
// returns the acknowledgement for the daemon: the new model version, or the
// error. What a Server and a Replica do with every update.
v1::LocalMessage ApplyDeliveredUpdate(const v1::LocalUpdate& update, int fd,
                                      const Server::UpdateCallback& on_update);
// Answers a model request with `on_request`'s snapshot (or its error; an
// empty callback is an error). Fails only when the channel does.
absl::Status AnswerModelRequest(LocalChannel& channel, const v1::LocalModelRequest& request,
                                const Server::RequestCallback& on_request);
// The serve loop of a Server and a Replica: receives each message from the
// daemon and hands it to `handle` with the memfd that came with it (-1:
// none; `handle` owns it). Returns the first error `handle` returns; OK when
// the channel ends after `stopping` was set (Stop()); Unavailable, naming
// the cause, when it ends otherwise.
absl::Status ServeMessages(
    LocalChannel& channel, const std::atomic<bool>& stopping,
    absl::FunctionRef<absl::Status(const v1::LocalMessage& message, int fd)> handle);
}  // namespace internal

}  // namespace mlfabric

#endif  // MLFABRIC_API_MLFABRIC_H_
