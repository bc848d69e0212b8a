/* MLfabric's C interface: the one boundary that framework adapters (the
 * pybind11 module, the TensorFlow op library) link against. It exposes only
 * C types, so an adapter never sees Abseil or protobuf headers -- TensorFlow
 * ships its own Abseil, and Debian's must not meet it in one translation unit.
 *
 *   char err[512];
 *   int64_t r = mlf_allreducer_create("mlfabric", "", "demo", "demo-token", 300, err, sizeof err);
 *   if (r == 0) { puts(err); ... }
 *   mlf_allreduce_async(r, data, count, MLF_FLOAT32, on_done, ctx);  // FIFO per handle
 *
 * Objects are integer handles (0 = error, message in `err`). Asynchronous
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

enum { MLF_FLOAT32 = 1, MLF_FLOAT64 = 2, MLF_INT32 = 3, MLF_INT64 = 4 };
enum { MLF_APPLIED = 0, MLF_DROPPED = 1, MLF_FAILED = 2 };

/* code: 0 = ok; otherwise an absl::StatusCode value and `message` says why. */
typedef void (*mlf_done_fn)(void* ctx, int code, const char* message);
typedef void (*mlf_push_done_fn)(void* ctx, int outcome, const char* reason,
                                 int64_t applied_version, int64_t delay);
typedef void (*mlf_get_done_fn)(void* ctx, int code, const char* message, int64_t version,
                                const void* data, uint64_t bytes);

/* ---- AllReduce (api/allreduce.h). socket/job/token may be "" (env/defaults). */
int64_t mlf_allreducer_create(const char* backend, const char* socket, const char* job,
                              const char* token, double timeout_s, char* err, size_t err_len);
int mlf_allreducer_rank(int64_t handle);
int mlf_allreducer_size(int64_t handle);
const char* mlf_allreducer_backend(int64_t handle);
void mlf_allreduce_async(int64_t handle, void* data, uint64_t count, int dtype, mlf_done_fn done,
                         void* ctx);
void mlf_broadcast_async(int64_t handle, void* data, uint64_t count, int dtype, int root,
                         mlf_done_fn done, void* ctx);
/* Blocking forms: return 0 or a status code with the message in `err`. */
int mlf_allreduce(int64_t handle, void* data, uint64_t count, int dtype, char* err,
                  size_t err_len);
int mlf_broadcast(int64_t handle, void* data, uint64_t count, int dtype, int root, char* err,
                  size_t err_len);
void mlf_allreducer_destroy(int64_t handle);

/* ---- Worker (api/mlfabric.h, api/registration.h). */
int64_t mlf_worker_create(const char* socket, const char* job, const char* token,
                          const char* name, int64_t delay_bound, char* err, size_t err_len);
int64_t mlf_worker_initial_version(int64_t handle);
/* The data is copied before this returns. */
void mlf_push_async(int64_t handle, const char* server, const void* data, uint64_t bytes,
                    int64_t version, double norm, mlf_push_done_fn done, void* ctx);
/* `done` gets the model bytes, valid only during the call. */
void mlf_get_async(int64_t handle, const char* server, mlf_get_done_fn done, void* ctx);
void mlf_worker_destroy(int64_t handle);

/* ---- A summing parameter server (model += update, float32), served on its
 * own thread: the server half of asynchronous PS training. */
int64_t mlf_sum_server_start(const char* socket, const char* job, const char* token,
                             const char* name, const float* initial, uint64_t count, char* err,
                             size_t err_len);
int64_t mlf_sum_server_applied(int64_t handle);
void mlf_sum_server_stop(int64_t handle);

#ifdef __cplusplus
}
#endif

#endif /* MLFABRIC_API_C_API_H_ */
