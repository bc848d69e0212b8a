/* MLfabric's C interface: the one boundary that framework adapters (the
 * pybind11 module, the TensorFlow op library) link against. It exposes only
 * C types, so an adapter never sees Abseil or protobuf headers -- TensorFlow
 * ships its own Abseil, and Debian's must not meet it in one translation unit.
 *
 *   char err[512];
 *   int64_t s = mlf_sum_server_start("", "demo", getenv("MLFABRIC_JOB_TOKEN"), "ps0", init, n, err, sizeof err);
 *
 * Objects are integer handles from one table (0 = error, message in `err`,
 * status code in `*code` where the call has one). Asynchronous
 * calls on one handle run one at a time, in call order, on that handle's own
 * thread, so collective calls stay in the same order on every rank; `done`
 * runs on that thread. All functions are thread-safe. */
#ifndef MLFABRIC_API_C_API_H_
#define MLFABRIC_API_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types (api/allreduce.h DataType, value for value); MLF_BOOL is
 * for broadcasts only. */
enum {
  MLF_FLOAT32 = 1, MLF_FLOAT64 = 2, MLF_INT32 = 3, MLF_INT64 = 4, MLF_FLOAT16 = 5,
  MLF_INT8 = 6, MLF_UINT8 = 7, MLF_INT16 = 8, MLF_UINT16 = 9, MLF_BOOL = 10
};
/* Reduce ops of an allreduce (api/allreduce.h ReduceOp, value for value). */
enum { MLF_SUM = 0, MLF_MIN = 1, MLF_MAX = 2, MLF_PRODUCT = 3 };
/* How a push ended (api/mlfabric.h PushOutcome). */
enum { MLF_APPLIED = 0, MLF_DROPPED = 1, MLF_FAILED = 2 };

/* code: 0 = ok; otherwise an absl::StatusCode value and `message` says why. */
typedef void (*mlf_done_fn)(void* ctx, int code, const char* message);
/* A push's end: `outcome` MLF_APPLIED (with the version after applying and
 * the delay), MLF_DROPPED or MLF_FAILED (with `reason`). */
typedef void (*mlf_push_done_fn)(void* ctx, int outcome, const char* reason,
                                 int64_t applied_version, int64_t delay);
/* A get's end: code 0 with the model's version and bytes (valid only during
 * the call), or an error code and `message`. */
typedef void (*mlf_get_done_fn)(void* ctx, int code, const char* message, int64_t version,
                                const void* data, uint64_t bytes);


/* ---- A summing parameter server (model += update, float32), served on its
 * own thread: the server half of asynchronous PS training. */
int64_t mlf_sum_server_start(const char* socket, const char* job, const char* token,
                             const char* name, const float* initial, uint64_t count, char* err,
                             size_t err_len);
/* One shard of a server group (api/mlfabric.h ClientOptions::shard; README
 * "Server groups"): bytes [begin, end) of the model pushed to `group`. */
typedef struct {
  const char* group;  /* the group's name, as workers push to it */
  int32_t index;      /* this shard's position in the group, from 0 */
  int32_t count;      /* the group's number of shards */
  int64_t begin;      /* the first byte of the model it holds */
  int64_t end;        /* one past its last byte */
} mlf_shard;
/* mlf_sum_server_start for shard `shard`: `initial` holds its part only. */
int64_t mlf_sum_server_start_shard(const char* socket, const char* job, const char* token,
                                   const char* name, const mlf_shard* shard, const float* initial,
                                   uint64_t count, char* err, size_t err_len);
/* Updates the summing server applied so far. */
int64_t mlf_sum_server_applied(int64_t handle);
/* Stops the summing server and forgets its handle. */
void mlf_sum_server_stop(int64_t handle);

/* ---- Workers with both Table 1 bounds and per-tensor priorities, general
 * servers and replicas whose update/request callbacks are the caller's (the
 * pybind11 module binds them to Python functions), and AllReduce. The "ext"
 * in their names is historical: they share the one handle table.
 *
 *   int code; char err[512];
 *   int64_t w = mlf_ext_worker_create("", "", "", "w1", -1, -1, &code, err, sizeof err);
 *   const void* parts[2] = {w0, w1};  uint64_t sizes[2] = {b0, b1};
 *   mlf_ext_push_async(w, "ps0", 2, parts, sizes, NULL, version, norm, done, ctx);
 */

/* ---- AllReduce (api/allreduce.h), as mlf_allreducer_* in api/c_api.h but
 * safe to destroy right after a collective completes (no executor thread
 * ever drops the last reference to its own handle). */
/* root_server: NULL or "" = "<job>-allreduce-root"; backup_workers: see
 * AllReduceOptions (mlfabric backend only); rank, size: -1 = from the
 * launcher's environment (MLFABRIC_RANK/MLFABRIC_SIZE), as
 * AllReduceOptions::rank/size (an elastic rank rebuilding its reducer for
 * a new membership passes them). */
int64_t mlf_ext_allreducer_create(const char* backend, const char* socket, const char* job,
                                  const char* token, double timeout_s, const char* root_server,
                                  int backup_workers, int rank, int size, int* code, char* err,
                                  size_t err_len);
/* This process's rank (AllReducer::rank). */
int mlf_ext_allreducer_rank(int64_t handle);
/* Contributions each sum holds (AllReducer::summed). */
int mlf_ext_allreducer_summed(int64_t handle);
/* Ranks that sum with this one in shared memory (AllReducer::local_size). */
int mlf_ext_allreducer_local_size(int64_t handle);
/* The number of ranks (AllReducer::size). */
int mlf_ext_allreducer_size(int64_t handle);
/* "mlfabric", "mpi" or "nccl" (AllReducer::backend). */
const char* mlf_ext_allreducer_backend(int64_t handle);
/* Collective: every rank makes the same calls in the same order; they run
 * one at a time, in call order, on the handle's thread, where `done` runs.
 * `op`: MLF_SUM, MLF_MIN, MLF_MAX or MLF_PRODUCT. Inputs (length, dtype, op,
 * root) that differ across ranks complete every rank's call with code 9
 * (FailedPrecondition). */
void mlf_ext_allreduce_async(int64_t handle, void* data, uint64_t count, int dtype, int op,
                             mlf_done_fn done, void* ctx);
/* The same with the tensor's shape (`dims`, `ndims` entries; ndims < 0:
 * none, as mlf_ext_allreduce_async): under mpirun the ranks must also
 * agree on it (AllReducer::AllReduce with CallOptions::shape), else code 9
 * naming the ranks and shapes. `dims` is copied before this returns. */
void mlf_ext_allreduce_shaped_async(int64_t handle, void* data, uint64_t count, int dtype, int op,
                                    const int64_t* dims, int ndims, mlf_done_fn done, void* ctx);
/* Broadcast (AllReducer::Broadcast) of root's `data`, in place; collective,
 * as mlf_ext_allreduce_async. */
void mlf_ext_broadcast_async(int64_t handle, void* data, uint64_t count, int dtype, int root,
                             mlf_done_fn done, void* ctx);
/* Alltoall (AllReducer::Alltoall): `send` holds `rows` rows of
 * `row_elements` elements; send_rows[d] (n = size entries) rows go to rank d.
 * Once the counts are exchanged, `alloc` runs on the handle's thread with
 * the rows each rank sends this one (n entries) and returns 0 with
 * *buffer set to room for their sum x row_elements elements (NULL when
 * empty), or a status code with a message in `err`; then the rows move and
 * `done` runs. `send` and `send_rows` must stay valid until then. */
typedef int (*mlf_alloc_fn)(void* ctx, const int64_t* recv_rows, int n, void** buffer, char* err,
                            size_t err_len);
/* Starts the Alltoall described above. */
void mlf_ext_alltoall_async(int64_t handle, const void* send, int64_t rows, int64_t row_elements,
                            const int64_t* send_rows, int n, int dtype, mlf_alloc_fn alloc,
                            mlf_done_fn done, void* ctx);
/* Allgather (AllReducer::Allgather): every rank's `rows` rows of
 * `row_elements` elements (the ranks' rows may differ), concatenated in
 * rank order; `alloc` is called as for mlf_ext_alltoall_async with the rows
 * of every rank (n = size entries). `dims` (`ndims` of them; ndims < 0:
 * none named) is the tensor's shape, whose dimensions after the first the
 * ranks must agree on (CallOptions); copied before this returns. `send`
 * must stay valid until `done`. */
void mlf_ext_allgather_async(int64_t handle, const void* send, int64_t rows, int64_t row_elements,
                             int dtype, const int64_t* dims, int ndims, mlf_alloc_fn alloc,
                             mlf_done_fn done, void* ctx);
/* ReduceScatter (AllReducer::ReduceScatter): `out` receives this rank's
 * mlf_reducescatter_rows(rows, size, rank) rows of the reduction. `dims`
 * (`ndims` of them; ndims < 0: none named) is the tensor's shape, which
 * the ranks must agree on (CallOptions). */
void mlf_ext_reducescatter_async(int64_t handle, const void* data, int64_t rows,
                                 int64_t row_elements, int dtype, int op, void* out,
                                 const int64_t* dims, int ndims, mlf_done_fn done, void* ctx);
/* Horovod's split of `rows` over `size` ranks: rank `rank`'s rows. */
int64_t mlf_reducescatter_rows(int64_t rows, int size, int rank);
/* Forgets the handle; safe right after a collective completed. */
void mlf_ext_allreducer_destroy(int64_t handle);

/* ---- Worker (api/registration.h RegisterAsWorker). delay_bound -1 and
 * divergence_bound -1 mean "the job's"; other negative values are errors. */
int64_t mlf_ext_worker_create(const char* socket, const char* job, const char* token,
                              const char* name, int64_t delay_bound, double divergence_bound,
                              int* code, char* err, size_t err_len);
/* The model version the daemon reported at registration. */
int64_t mlf_ext_worker_initial_version(int64_t handle);
/* Pushes `n` tensors as one update: their bytes are concatenated in order
 * (tensor i gets id i) into one shared-memory buffer before this returns.
 * `priorities` may be NULL (tensor i gets priority i: front layers first);
 * lower values are more urgent (api/mlfabric.h TensorSpec). Bad arguments
 * complete the push at once as failed, with a reason naming the argument. */
void mlf_ext_push_async(int64_t handle, const char* server, size_t n, const void* const* data,
                        const uint64_t* bytes, const int32_t* priorities, int64_t version,
                        double norm, mlf_push_done_fn done, void* ctx);
/* Gets the model of `server`; `done` runs on the handle's own thread (FIFO)
 * and the model bytes are valid only during it. `priority`: of the reply's
 * packets in the server daemon's queue (lower first; see
 * mlfabric::Worker::Get). */
void mlf_ext_get_async(int64_t handle, const char* server, int32_t priority, mlf_get_done_fn done,
                       void* ctx);
/* The job's membership (mlfabric::Worker::Membership): its generation and
 * its live workers' names, sorted, written to `names` one after another,
 * each ended by '\0' (`*names_used` bytes in all). Returns 0, or a nonzero
 * status code with `err` saying why (OutOfRange: `names_len` is too small,
 * `*names_used` is what is needed). Blocks for one round trip. */
int mlf_ext_worker_membership(int64_t handle, uint64_t* generation, char* names, size_t names_len,
                              size_t* names_used, char* err, size_t err_len);
/* Disconnects the worker and forgets its handle. */
void mlf_ext_worker_destroy(int64_t handle);

/* ---- Servers and replicas with caller callbacks (api/mlfabric.h Server,
 * api/replica.h Replica). The callbacks run on the thread that calls
 * mlf_ext_server_serve / mlf_ext_replica_serve, one at a time, in commit
 * order. */

/* One delivery to a server or replica (api/mlfabric.h Server::Update). */
typedef struct {
  uint64_t transfer_id; /* the scheduler's id of the push (or aggregate) */
  uint64_t sequence;   /* commit position at this server */
  int64_t count;       /* pushes summed into this delivery (>1: an aggregate, §5.2) */
  const char* worker;  /* the worker that pushed it */
  int64_t version;     /* v(g): the model version the update was computed from */
  double norm;         /* the update's L2 norm */
  const void* data;    /* valid only during the callback */
  uint64_t bytes;      /* how many bytes */
} mlf_update_view;

/* Returns 0 and sets *new_version, or a non-zero status code with a message
 * in `err`: the push (every push of an aggregate) then fails with it. */
typedef int (*mlf_update_fn)(void* ctx, const mlf_update_view* update, int64_t* new_version,
                             char* err, size_t err_len);
/* Fills the snapshot with mlf_ext_snapshot_set and returns 0, or returns a
 * non-zero status code with a message in `err` (the get fails with it). */
typedef int (*mlf_request_fn)(void* ctx, void* snapshot, char* err, size_t err_len);
/* Copies `bytes` bytes of model state at `version` into `snapshot`. */
void mlf_ext_snapshot_set(void* snapshot, int64_t version, const void* data, uint64_t bytes);

/* `shard`: NULL, or this server is that shard of a server group. */
int64_t mlf_ext_server_create(const char* socket, const char* job, const char* token,
                              const char* name, int64_t delay_bound, double divergence_bound,
                              const mlf_shard* shard, int* code, char* err, size_t err_len);
/* The model version the daemon reported at registration. */
int64_t mlf_ext_server_initial_version(int64_t handle);
/* Both callbacks must be set before serving; `ctx` is passed to both. */
void mlf_ext_server_set_callbacks(int64_t handle, mlf_update_fn on_update,
                                  mlf_request_fn on_request, void* ctx);
/* Blocks until mlf_ext_server_stop (returns 0) or the daemon goes away
 * (returns the status code, message in `err`). */
int mlf_ext_server_serve(int64_t handle, char* err, size_t err_len);
/* Makes a running serve call return. */
void mlf_ext_server_stop(int64_t handle);
/* Stops and forgets the handle; a running serve call returns first. */
void mlf_ext_server_destroy(int64_t handle);

/* What a replica's promotion callback receives (api/replica.h
 * Replica::Promotion); the strings are valid only during the callback. */
typedef struct {
  const char* server;     /* the server the replica now is */
  const char* old_host;   /* where the server was */
  const char* reason;     /* why it failed over */
  int64_t model_version;  /* the old server's: continue version numbers from here */
} mlf_promotion_view;
/* Runs once, when the scheduler makes the replica the server (failover,
 * api/replica.h); the promotion has happened, so it cannot fail. */
typedef void (*mlf_promotion_fn)(void* ctx, const mlf_promotion_view* promotion);

/* Replaces the replica's model with a snapshot of the server's: `bytes`
 * bytes at `version` (valid only during the callback); the updates after it
 * follow through on_update. Returns 0, or a non-zero status code with a
 * message in `err` (the snapshot fails and the scheduler sends another). */
typedef int (*mlf_install_fn)(void* ctx, int64_t version, const void* data, uint64_t bytes,
                              char* err, size_t err_len);

/* `installs_snapshots` non-zero: the replica starts from a snapshot of its
 * server's model (RegistrationParams::replica_snapshot); set an install
 * callback before serving. */
int64_t mlf_ext_replica_create(const char* server, const char* socket, const char* job,
                               const char* token, const char* name, int64_t delay_bound,
                               double divergence_bound, int installs_snapshots, int* code,
                               char* err, size_t err_len);
/* = mlf_ext_replica_set_callbacks(handle, on_update, NULL, NULL, ctx). */
void mlf_ext_replica_set_callback(int64_t handle, mlf_update_fn on_update, void* ctx);
/* Set before serving; `ctx` is passed to all three. on_update is required.
 * Once promoted, the replica answers the workers' gets with on_request
 * (NULL: the gets fail with an error saying so); on_promotion may be NULL. */
void mlf_ext_replica_set_callbacks(int64_t handle, mlf_update_fn on_update,
                                   mlf_request_fn on_request, mlf_promotion_fn on_promotion,
                                   void* ctx);
/* Set before serving, after mlf_ext_replica_set_callbacks (its `ctx` is
 * passed); required when created with installs_snapshots. */
void mlf_ext_replica_set_install_callback(int64_t handle, mlf_install_fn on_install);
/* 1 once the scheduler made the replica the server, 0 before, -1 for an
 * unknown handle. Any thread, also while serving. */
int mlf_ext_replica_promoted(int64_t handle);
/* Blocks until mlf_ext_replica_stop (returns 0) or the daemon goes away
 * (returns the status code, message in `err`). */
int mlf_ext_replica_serve(int64_t handle, char* err, size_t err_len);
/* Makes a running serve call return. */
void mlf_ext_replica_stop(int64_t handle);
/* Stops and forgets the handle; a running serve call returns first. */
void mlf_ext_replica_destroy(int64_t handle);

#ifdef __cplusplus
}
#endif

#endif /* MLFABRIC_API_C_API_H_ */
