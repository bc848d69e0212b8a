// The C interface's workers (both Table 1 bounds, per-tensor priorities),
// general servers and replicas with the caller's callbacks, and AllReduce,
// over the C++ API (see c_api.h). Same handle table as c_api.cc.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "api/c_api.h"
#include "api/c_api_internal.h"

namespace mlfabric::c_api {
namespace {

// The caller's alloc callback (mlf_alloc_fn) as an Alltoall's or
// Allgather's receive buffer; its error fails the call.
AlltoallRecvBuffer AllocBuffer(mlf_alloc_fn alloc, void* ctx) {
  return [alloc, ctx](const std::vector<int64_t>& recv) -> absl::StatusOr<void*> {
    void* out = nullptr;
    char err[512] = {0};
    const int code = alloc(ctx, recv.data(), static_cast<int>(recv.size()), &out, err, sizeof err);
    if (code != 0) return absl::Status(static_cast<absl::StatusCode>(code), err);
    return out;
  };
}

// Calls the caller's update callback; its error becomes the push's failure.
absl::StatusOr<int64_t> CallUpdate(const Callbacks& callbacks, const Server::Update& u) {
  mlf_update_view view;
  view.transfer_id = u.transfer_id;
  view.sequence = u.sequence;
  view.count = u.count;
  view.worker = u.worker.c_str();
  view.version = u.version;
  view.norm = u.norm;
  view.data = u.data;
  view.bytes = u.bytes;
  int64_t new_version = 0;
  char err[2048] = {0};
  const int code = callbacks.on_update(callbacks.ctx, &view, &new_version, err, sizeof err);
  if (code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(code),
                        err[0] != '\0' ? err : "the update callback failed without a message");
  }
  return new_version;
}

// Calls the caller's request callback; its error becomes the get's failure.
absl::StatusOr<Server::Snapshot> CallRequest(const Callbacks& callbacks) {
  Server::Snapshot snapshot;
  char err[2048] = {0};
  const int code = callbacks.on_request(callbacks.ctx, &snapshot, err, sizeof err);
  if (code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(code),
                        err[0] != '\0' ? err : "the request callback failed without a message");
  }
  return snapshot;
}

// Registers entry->callbacks with the entry's replica (under serve_mu). The
// promotion callback is registered even without the caller's, so that
// mlf_ext_replica_promoted can tell from any thread. It points at the
// entry's flag without owning the entry: it runs only inside Serve(), whose
// caller holds the entry.
void RegisterReplicaCallbacks(Entry* entry) {
  const Callbacks callbacks = entry->callbacks;
  if (callbacks.on_update != nullptr) {
    entry->replica->RegisterUpdateCallback(
        [callbacks](const Server::Update& u) { return CallUpdate(callbacks, u); });
  }
  // Without a request callback, Replica answers gets with its own error.
  entry->replica->RegisterRequestCallback(
      callbacks.on_request == nullptr
          ? Replica::RequestCallback()
          : Replica::RequestCallback([callbacks] { return CallRequest(callbacks); }));
  std::atomic<bool>* promoted = &entry->promoted;
  entry->replica->RegisterPromotionCallback([callbacks, promoted](const Replica::Promotion& p) {
    promoted->store(true);  // before the callback, which may ask
    if (callbacks.on_promotion == nullptr) return;
    mlf_promotion_view view;
    view.server = p.server.c_str();
    view.old_host = p.old_host.c_str();
    view.reason = p.reason.c_str();
    view.model_version = p.model_version;
    callbacks.on_promotion(callbacks.ctx, &view);
  });
  if (callbacks.on_install != nullptr) {
    entry->replica->RegisterInstallCallback([callbacks](const Replica::Install& install) {
      char err[2048] = {0};
      const int code = callbacks.on_install(callbacks.ctx, install.version, install.data,
                                            install.bytes, err, sizeof err);
      if (code == 0) return absl::OkStatus();
      return absl::Status(static_cast<absl::StatusCode>(code),
                          err[0] != '\0' ? err : "the install callback failed without a message");
    });
  }
}

}  // namespace
}  // namespace mlfabric::c_api

using mlfabric::c_api::Entry;

extern "C" {

int64_t mlf_ext_allreducer_create(const char* backend, const char* socket, const char* job,
                                  const char* token, double timeout_s, const char* root_server,
                                  int backup_workers, int rank, int size, int* code, char* err,
                                  size_t err_len) {
  mlfabric::AllReduceOptions options;
  options.rank = rank;
  options.size = size;
  options.backend = mlfabric::c_api::Or(backend, nullptr, "auto");
  const auto params = mlfabric::c_api::Params(socket, job, token, "", -1, -1);
  options.client = params.client;
  options.client.name = mlfabric::c_api::Or(nullptr, "MLFABRIC_WORKER_NAME", "");
  if (timeout_s > 0) options.timeout_s = timeout_s;
  options.root_server = mlfabric::c_api::Or(root_server, nullptr, "");
  options.backup_workers = backup_workers;
  auto reducer = mlfabric::MakeAllReducer(options);
  if (!reducer.ok()) return mlfabric::c_api::Fail(reducer.status(), code, err, err_len);
  auto entry = std::make_shared<Entry>();
  entry->reducer = std::move(*reducer);
  entry->serial = std::make_unique<mlfabric::c_api::Serial>();
  return mlfabric::c_api::Add(std::move(entry));
}

int mlf_ext_allreducer_rank(int64_t handle) {
  auto entry = mlfabric::c_api::Find(handle);
  return entry && entry->reducer ? entry->reducer->rank() : -1;
}

int mlf_ext_allreducer_summed(int64_t handle) {
  auto entry = mlfabric::c_api::Find(handle);
  return entry && entry->reducer ? entry->reducer->summed() : -1;
}

int mlf_ext_allreducer_local_size(int64_t handle) {
  auto entry = mlfabric::c_api::Find(handle);
  return entry && entry->reducer ? entry->reducer->local_size() : -1;
}

int mlf_ext_allreducer_size(int64_t handle) {
  auto entry = mlfabric::c_api::Find(handle);
  return entry && entry->reducer ? entry->reducer->size() : -1;
}

const char* mlf_ext_allreducer_backend(int64_t handle) {
  auto entry = mlfabric::c_api::Find(handle);
  return entry && entry->reducer ? entry->reducer->backend() : "";
}

static_assert(MLF_BOOL == static_cast<int>(mlfabric::DataType::kBool) &&
                  MLF_UINT16 == static_cast<int>(mlfabric::DataType::kUint16) &&
                  MLF_PRODUCT == static_cast<int>(mlfabric::ReduceOp::kProduct),
              "the C codes mirror DataType and ReduceOp");

// `op` is the reduce op of an allreduce (ignored for a broadcast);
// `call` what the caller said about an allreduce (its shape).
static void ExtCollective(int64_t handle, bool broadcast, void* data, uint64_t count, int dtype,
                          int op, int root, mlf_done_fn done, void* ctx,
                          mlfabric::CallOptions call = {}) {
  auto entry = mlfabric::c_api::Find(handle);
  if (!entry || !entry->reducer) {
    done(ctx, static_cast<int>(absl::StatusCode::kInvalidArgument),
         mlfabric::c_api::BadHandle(handle, "AllReducer").c_str());
    return;
  }
  std::shared_ptr<mlfabric::AllReducer> reducer = entry->reducer;
  entry->serial->Submit([reducer, broadcast, data, count, dtype, op, root, done, ctx,
                         call = std::move(call)] {
    const auto type = static_cast<mlfabric::DataType>(dtype);
    absl::Status status =
        mlfabric::DataTypeSize(type) == 0
            ? absl::InvalidArgumentError(absl::StrCat(
                  "unsupported dtype code ", dtype,
                  ": use float16, float32, float64, int8, uint8, int16, uint16, int32 or int64"))
        : broadcast ? reducer->Broadcast(data, count, type, root)
                    : reducer->AllReduce(data, count, type, static_cast<mlfabric::ReduceOp>(op),
                                         call);
    done(ctx, static_cast<int>(status.code()), std::string(status.message()).c_str());
  });
}

void mlf_ext_allreduce_async(int64_t handle, void* data, uint64_t count, int dtype, int op,
                             mlf_done_fn done, void* ctx) {
  ExtCollective(handle, false, data, count, dtype, op, 0, done, ctx);
}

void mlf_ext_allreduce_shaped_async(int64_t handle, void* data, uint64_t count, int dtype, int op,
                                    const int64_t* dims, int ndims, mlf_done_fn done, void* ctx) {
  mlfabric::CallOptions call;
  if (ndims >= 0) call.shape.emplace(dims, dims + ndims);
  ExtCollective(handle, false, data, count, dtype, op, 0, done, ctx, std::move(call));
}

void mlf_ext_broadcast_async(int64_t handle, void* data, uint64_t count, int dtype, int root,
                             mlf_done_fn done, void* ctx) {
  ExtCollective(handle, true, data, count, dtype, MLF_SUM, root, done, ctx);
}

void mlf_ext_alltoall_async(int64_t handle, const void* send, int64_t rows, int64_t row_elements,
                            const int64_t* send_rows, int n, int dtype, mlf_alloc_fn alloc,
                            mlf_done_fn done, void* ctx) {
  auto entry = mlfabric::c_api::Find(handle);
  if (!entry || !entry->reducer) {
    done(ctx, static_cast<int>(absl::StatusCode::kInvalidArgument),
         mlfabric::c_api::BadHandle(handle, "AllReducer").c_str());
    return;
  }
  std::shared_ptr<mlfabric::AllReducer> reducer = entry->reducer;
  std::vector<int64_t> counts(send_rows, send_rows + std::max(n, 0));
  entry->serial->Submit([reducer, send, rows, row_elements, counts, dtype, alloc, done, ctx] {
    const mlfabric::AlltoallRecvBuffer buffer = mlfabric::c_api::AllocBuffer(alloc, ctx);
    absl::Status status = reducer->Alltoall(send, rows, row_elements, counts,
                                            static_cast<mlfabric::DataType>(dtype), buffer,
                                            nullptr);
    done(ctx, static_cast<int>(status.code()), std::string(status.message()).c_str());
  });
}

void mlf_ext_allgather_async(int64_t handle, const void* send, int64_t rows, int64_t row_elements,
                             int dtype, const int64_t* dims, int ndims, mlf_alloc_fn alloc,
                             mlf_done_fn done, void* ctx) {
  auto entry = mlfabric::c_api::Find(handle);
  if (!entry || !entry->reducer) {
    done(ctx, static_cast<int>(absl::StatusCode::kInvalidArgument),
         mlfabric::c_api::BadHandle(handle, "AllReducer").c_str());
    return;
  }
  std::shared_ptr<mlfabric::AllReducer> reducer = entry->reducer;
  mlfabric::CallOptions call;
  if (ndims >= 0) call.shape.emplace(dims, dims + ndims);
  entry->serial->Submit([reducer, send, rows, row_elements, dtype, call = std::move(call), alloc,
                         done, ctx] {
    const mlfabric::AlltoallRecvBuffer buffer = mlfabric::c_api::AllocBuffer(alloc, ctx);
    absl::Status status = reducer->Allgather(send, rows, row_elements,
                                             static_cast<mlfabric::DataType>(dtype), buffer,
                                             nullptr, call);
    done(ctx, static_cast<int>(status.code()), std::string(status.message()).c_str());
  });
}

void mlf_ext_reducescatter_async(int64_t handle, const void* data, int64_t rows,
                                 int64_t row_elements, int dtype, int op, void* out,
                                 const int64_t* dims, int ndims, mlf_done_fn done, void* ctx) {
  auto entry = mlfabric::c_api::Find(handle);
  if (!entry || !entry->reducer) {
    done(ctx, static_cast<int>(absl::StatusCode::kInvalidArgument),
         mlfabric::c_api::BadHandle(handle, "AllReducer").c_str());
    return;
  }
  std::shared_ptr<mlfabric::AllReducer> reducer = entry->reducer;
  mlfabric::CallOptions call;
  if (ndims >= 0) call.shape.emplace(dims, dims + ndims);
  entry->serial->Submit([reducer, data, rows, row_elements, dtype, op, out, call = std::move(call),
                         done, ctx] {
    absl::Status status =
        reducer->ReduceScatter(data, rows, row_elements, static_cast<mlfabric::DataType>(dtype),
                               static_cast<mlfabric::ReduceOp>(op), out, call);
    done(ctx, static_cast<int>(status.code()), std::string(status.message()).c_str());
  });
}

int64_t mlf_reducescatter_rows(int64_t rows, int size, int rank) {
  if (rank < 0 || rank >= size) return 0;
  return mlfabric::ReduceScatterRows(rows, size)[static_cast<size_t>(rank)];
}

void mlf_ext_allreducer_destroy(int64_t handle) { mlfabric::c_api::Remove(handle); }

int64_t mlf_ext_worker_create(const char* socket, const char* job, const char* token,
                              const char* name, int64_t delay_bound, double divergence_bound,
                              int* code, char* err, size_t err_len) {
  auto params = mlfabric::c_api::Params(socket, job, token, name, delay_bound, divergence_bound);
  if (params.client.name.empty()) {
    params.client.name = mlfabric::c_api::Or(nullptr, "MLFABRIC_WORKER_NAME", "worker");
  }
  auto worker = mlfabric::RegisterAsWorker(params);
  if (!worker.ok()) return mlfabric::c_api::Fail(worker.status(), code, err, err_len);
  auto entry = std::make_shared<Entry>();
  entry->worker = std::move(*worker);
  entry->serial = std::make_unique<mlfabric::c_api::Serial>();
  return mlfabric::c_api::Add(std::move(entry));
}

int mlf_ext_worker_membership(int64_t handle, uint64_t* generation, char* names, size_t names_len,
                              size_t* names_used, char* err, size_t err_len) {
  auto entry = mlfabric::c_api::Find(handle);
  absl::StatusOr<mlfabric::JobMembers> members =
      entry && entry->worker
          ? entry->worker->Membership()
          : absl::StatusOr<mlfabric::JobMembers>(
                absl::InvalidArgumentError(mlfabric::c_api::BadHandle(handle, "Worker")));
  int code = 0;
  if (!members.ok()) {
    mlfabric::c_api::Fail(members.status(), &code, err, err_len);
    return code;
  }
  size_t used = 0;
  for (const std::string& name : members->members) used += name.size() + 1;
  if (names_used != nullptr) *names_used = used;
  if (used > names_len || (used > 0 && names == nullptr)) {
    mlfabric::c_api::Fail(absl::OutOfRangeError(absl::StrCat("the members' names need ", used,
                                                             " bytes; ", names_len, " given")),
                          &code, err, err_len);
    return code;
  }
  char* at = names;
  for (const std::string& name : members->members) {
    std::memcpy(at, name.c_str(), name.size() + 1);
    at += name.size() + 1;
  }
  if (generation != nullptr) *generation = members->generation;
  return 0;
}

int64_t mlf_ext_worker_initial_version(int64_t handle) {
  auto entry = mlfabric::c_api::Find(handle);
  return entry && entry->worker ? entry->worker->initial_version() : -1;
}

void mlf_ext_push_async(int64_t handle, const char* server, size_t n, const void* const* data,
                        const uint64_t* bytes, const int32_t* priorities, int64_t version,
                        double norm, mlf_push_done_fn done, void* ctx) {
  auto entry = mlfabric::c_api::Find(handle);
  if (!entry || !entry->worker) {
    done(ctx, MLF_FAILED, mlfabric::c_api::BadHandle(handle, "Worker").c_str(), 0, 0);
    return;
  }
  if (n == 0) {
    done(ctx, MLF_FAILED, "push: no tensors to push (give at least one)", 0, 0);
    return;
  }
  if (server == nullptr || *server == '\0') {
    done(ctx, MLF_FAILED, "push: the server name is empty", 0, 0);
    return;
  }
  if (version < 0) {
    done(ctx, MLF_FAILED,
         absl::StrCat("push: version ", version, " is negative (pass the version get returned)")
             .c_str(),
         0, 0);
    return;
  }
  if (!(norm >= 0) || norm == std::numeric_limits<double>::infinity()) {
    done(ctx, MLF_FAILED,
         absl::StrCat("push: norm ", norm, " must be finite and >= 0").c_str(), 0, 0);
    return;
  }
  std::vector<mlfabric::TensorSpec> tensors(n);
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    tensors[i].id = static_cast<uint32_t>(i);
    tensors[i].bytes = bytes[i];
    // Default: layer order, front layers first (they are needed first by
    // the next forward pass).
    tensors[i].priority = priorities != nullptr ? priorities[i] : static_cast<int32_t>(i);
    total += bytes[i];
  }
  const void* contiguous = data[0];
  std::vector<uint8_t> joined;
  if (n > 1) {
    joined.resize(total);
    uint64_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
      if (bytes[i] > 0) std::memcpy(joined.data() + offset, data[i], bytes[i]);
      offset += bytes[i];
    }
    contiguous = joined.data();
  }
  entry->worker->PushAsync(
      server, contiguous, total, version, norm,
      [done, ctx](mlfabric::PushResult result) {
        done(ctx, static_cast<int>(result.outcome), result.reason.c_str(),
             result.applied_version, result.delay);
      },
      tensors);
}

void mlf_ext_get_async(int64_t handle, const char* server, int32_t priority, mlf_get_done_fn done,
                       void* ctx) {
  auto entry = mlfabric::c_api::Find(handle);
  if (!entry || !entry->worker) {
    done(ctx, static_cast<int>(absl::StatusCode::kInvalidArgument),
         mlfabric::c_api::BadHandle(handle, "Worker").c_str(), 0, nullptr, 0);
    return;
  }
  std::string name = server != nullptr ? server : "";
  std::shared_ptr<mlfabric::Worker> worker = entry->worker;
  entry->serial->Submit([worker, name, priority, done, ctx] {
    auto model = worker->Get(name, priority);
    if (!model.ok()) {
      done(ctx, static_cast<int>(model.status().code()),
           std::string(model.status().message()).c_str(), 0, nullptr, 0);
      return;
    }
    done(ctx, 0, "", model->version, model->data(), model->size());
  });
}

void mlf_ext_worker_destroy(int64_t handle) { mlfabric::c_api::Remove(handle); }

void mlf_ext_snapshot_set(void* snapshot, int64_t version, const void* data, uint64_t bytes) {
  auto* s = static_cast<mlfabric::Server::Snapshot*>(snapshot);
  s->version = version;
  s->bytes.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
}

int64_t mlf_ext_server_create(const char* socket, const char* job, const char* token,
                              const char* name, int64_t delay_bound, double divergence_bound,
                              const mlf_shard* shard, int* code, char* err, size_t err_len) {
  auto params = mlfabric::c_api::Params(socket, job, token, name, delay_bound, divergence_bound);
  mlfabric::c_api::SetShard(shard, &params);
  if (params.client.name.empty()) {
    return mlfabric::c_api::Fail(absl::InvalidArgumentError("a server needs a name (e.g. \"ps0\")"),
                          code, err, err_len);
  }
  auto server = mlfabric::RegisterAsServer(params);
  if (!server.ok()) return mlfabric::c_api::Fail(server.status(), code, err, err_len);
  auto entry = std::make_shared<Entry>();
  entry->server = std::move(*server);
  return mlfabric::c_api::Add(std::move(entry));
}

int64_t mlf_ext_server_initial_version(int64_t handle) {
  auto entry = mlfabric::c_api::Find(handle);
  return entry && entry->server ? entry->server->initial_version() : -1;
}

void mlf_ext_server_set_callbacks(int64_t handle, mlf_update_fn on_update,
                                  mlf_request_fn on_request, void* ctx) {
  auto entry = mlfabric::c_api::Find(handle);
  if (!entry || !entry->server) return;
  std::lock_guard<std::mutex> lock(entry->serve_mu);  // not while serving
  entry->callbacks = {on_update, on_request, nullptr, nullptr, ctx};
  mlfabric::c_api::Callbacks callbacks = entry->callbacks;
  entry->server->RegisterUpdateCallback(
      [callbacks](const mlfabric::Server::Update& u) { return mlfabric::c_api::CallUpdate(callbacks, u); });
  entry->server->RegisterRequestCallback(
      [callbacks] { return mlfabric::c_api::CallRequest(callbacks); });
}

int mlf_ext_server_serve(int64_t handle, char* err, size_t err_len) {
  auto entry = mlfabric::c_api::Find(handle);
  if (!entry || !entry->server) {
    mlfabric::c_api::Fill(err, err_len, mlfabric::c_api::BadHandle(handle, "Server"));
    return static_cast<int>(absl::StatusCode::kInvalidArgument);
  }
  std::unique_lock<std::mutex> lock(entry->serve_mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    mlfabric::c_api::Fill(err, err_len, "this server is already serving (serve() runs once at a time)");
    return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  }
  if (entry->callbacks.on_update == nullptr || entry->callbacks.on_request == nullptr) {
    mlfabric::c_api::Fill(err, err_len,
                   "register both an update callback and a request callback before serve()");
    return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  }
  absl::Status status = entry->server->Serve();
  if (!status.ok()) mlfabric::c_api::Fill(err, err_len, std::string(status.message()));
  return static_cast<int>(status.code());
}

void mlf_ext_server_stop(int64_t handle) {
  auto entry = mlfabric::c_api::Find(handle);
  if (entry && entry->server) entry->server->Stop();
}

void mlf_ext_server_destroy(int64_t handle) {
  auto entry = mlfabric::c_api::Remove(handle);
  if (entry && entry->server) entry->server->Stop();
}

int64_t mlf_ext_replica_create(const char* server, const char* socket, const char* job,
                               const char* token, const char* name, int64_t delay_bound,
                               double divergence_bound, int installs_snapshots, int* code,
                               char* err, size_t err_len) {
  auto params = mlfabric::c_api::Params(socket, job, token, name, delay_bound, divergence_bound);
  params.replica_snapshot = installs_snapshots != 0;
  auto replica = mlfabric::RegisterAsReplica(server != nullptr ? server : "", params);
  if (!replica.ok()) return mlfabric::c_api::Fail(replica.status(), code, err, err_len);
  auto entry = std::make_shared<Entry>();
  entry->replica = std::move(*replica);
  mlfabric::c_api::RegisterReplicaCallbacks(entry.get());  // the promoted flag
  return mlfabric::c_api::Add(std::move(entry));
}

void mlf_ext_replica_set_callback(int64_t handle, mlf_update_fn on_update, void* ctx) {
  mlf_ext_replica_set_callbacks(handle, on_update, nullptr, nullptr, ctx);
}

void mlf_ext_replica_set_callbacks(int64_t handle, mlf_update_fn on_update,
                                   mlf_request_fn on_request, mlf_promotion_fn on_promotion,
                                   void* ctx) {
  auto entry = mlfabric::c_api::Find(handle);
  if (!entry || !entry->replica) return;
  std::lock_guard<std::mutex> lock(entry->serve_mu);  // not while serving
  entry->callbacks = {on_update, on_request, on_promotion, entry->callbacks.on_install, ctx};
  mlfabric::c_api::RegisterReplicaCallbacks(entry.get());
}

void mlf_ext_replica_set_install_callback(int64_t handle, mlf_install_fn on_install) {
  auto entry = mlfabric::c_api::Find(handle);
  if (!entry || !entry->replica) return;
  std::lock_guard<std::mutex> lock(entry->serve_mu);  // not while serving
  entry->callbacks.on_install = on_install;
  mlfabric::c_api::RegisterReplicaCallbacks(entry.get());
}

int mlf_ext_replica_promoted(int64_t handle) {
  auto entry = mlfabric::c_api::Find(handle);
  if (!entry || !entry->replica) return -1;
  return entry->promoted.load() ? 1 : 0;
}

int mlf_ext_replica_serve(int64_t handle, char* err, size_t err_len) {
  auto entry = mlfabric::c_api::Find(handle);
  if (!entry || !entry->replica) {
    mlfabric::c_api::Fill(err, err_len, mlfabric::c_api::BadHandle(handle, "Replica"));
    return static_cast<int>(absl::StatusCode::kInvalidArgument);
  }
  std::unique_lock<std::mutex> lock(entry->serve_mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    mlfabric::c_api::Fill(err, err_len, "this replica is already serving (serve() runs once at a time)");
    return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  }
  if (entry->callbacks.on_update == nullptr) {
    mlfabric::c_api::Fill(err, err_len, "register an update callback before serve()");
    return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  }
  absl::Status status = entry->replica->Serve();
  if (!status.ok()) mlfabric::c_api::Fill(err, err_len, std::string(status.message()));
  return static_cast<int>(status.code());
}

void mlf_ext_replica_stop(int64_t handle) {
  auto entry = mlfabric::c_api::Find(handle);
  if (entry && entry->replica) entry->replica->Stop();
}

void mlf_ext_replica_destroy(int64_t handle) {
  auto entry = mlfabric::c_api::Remove(handle);
  if (entry && entry->replica) entry->replica->Stop();
}

}  // extern "C"
