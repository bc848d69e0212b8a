/* MLfabric's C interface: the one boundary that framework adapters (the
 * pybind11 module, the TensorFlow op library) link against. It exposes only
 * C types, so an adapter never sees Abseil or protobuf headers -- TensorFlow
 * ships its own Abseil, and Debian's must not meet it in one translation unit.
 *
 *   char err[512];
 *   int64_t s = mlf_sum_server_start("", "demo", "demo-token", "ps0", init, n, err, sizeof err);
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

/* AllReduce, workers (per-tensor priorities, both Table 1 bounds), general
 * servers and replicas with the caller's callbacks: python/src/c_api_ext.h,
 * built with this file into python/libmlfabric_pycore.so. */

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
