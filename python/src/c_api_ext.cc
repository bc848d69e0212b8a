// python/src/c_api_ext.h over the C++ API: workers with per-tensor
// priorities, servers and replicas whose callbacks are the caller's.
// Statuses are flattened to (code, message) as in api/c_api.cc.
#include "python/src/c_api_ext.h"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "api/allreduce.h"
#include "api/mlfabric.h"
#include "api/registration.h"
#include "api/replica.h"

namespace mlfabric {
namespace {

// Runs closures one at a time, in submission order, on its own thread.
class Serial {
 public:
  Serial() : thread_([this] { Loop(); }) {}
  ~Serial() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    // Never join from the executor's own thread (EDEADLK aborts the
    // process); tasks hold no Entry, so this is only a safety net.
    if (std::this_thread::get_id() == thread_.get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  void Submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;
};

struct Callbacks {
  mlf_update_fn on_update = nullptr;
  mlf_request_fn on_request = nullptr;
  void* ctx = nullptr;
};

// Completion callbacks never own an Entry or a Worker: a callback that drops
// the last reference on the thread the object would join (the worker's
// reader, an executor's thread) would abort with "Resource deadlock
// avoided". Closing a handle destroys it on the closing thread; pending
// pushes then fail with a reason (Worker's destructor).
struct Entry {
  std::shared_ptr<AllReducer> reducer;  // shared with queued collectives
  std::shared_ptr<Worker> worker;  // shared with queued gets (see above)
  std::unique_ptr<Server> server;
  std::unique_ptr<Replica> replica;
  Callbacks callbacks;
  std::mutex serve_mu;  // one Serve() at a time
  std::unique_ptr<Serial> serial;  // last member: destroyed (joined) first
};

std::mutex g_mu;
std::map<int64_t, std::shared_ptr<Entry>>& Entries() {
  static auto* entries = new std::map<int64_t, std::shared_ptr<Entry>>();
  return *entries;
}
int64_t g_next = int64_t{1} << 40;

int64_t Add(std::shared_ptr<Entry> entry) {
  std::lock_guard<std::mutex> lock(g_mu);
  const int64_t handle = g_next++;
  Entries()[handle] = std::move(entry);
  return handle;
}

std::shared_ptr<Entry> Find(int64_t handle) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = Entries().find(handle);
  return it == Entries().end() ? nullptr : it->second;
}

std::shared_ptr<Entry> Remove(int64_t handle) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = Entries().find(handle);
  if (it == Entries().end()) return nullptr;
  auto entry = std::move(it->second);
  Entries().erase(it);
  return entry;
}

void Fill(char* err, size_t err_len, const std::string& text) {
  if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", text.c_str());
}

int Fail(const absl::Status& status, int* code, char* err, size_t err_len) {
  if (code != nullptr) *code = static_cast<int>(status.code());
  Fill(err, err_len, std::string(status.message()));
  return 0;
}

std::string Or(const char* value, const char* env, const char* fallback) {
  if (value != nullptr && *value != '\0') return value;
  if (env != nullptr) {
    if (const char* from_env = std::getenv(env); from_env != nullptr && *from_env != '\0') {
      return from_env;
    }
  }
  return fallback;
}

RegistrationParams Params(const char* socket, const char* job, const char* token,
                          const char* name, int64_t delay_bound, double divergence_bound) {
  RegistrationParams params;
  params.client.daemon_socket = Or(socket, "MLFABRIC_DAEMON_SOCKET", "");
  params.client.job = Or(job, "MLFABRIC_JOB", "demo");
  params.client.job_token = Or(token, "MLFABRIC_JOB_TOKEN", "demo-token");
  params.client.name = Or(name, nullptr, "");
  params.delay_bound = delay_bound;
  params.divergence_bound = divergence_bound;
  return params;
}

std::string BadHandle(int64_t handle, const char* what) {
  return absl::StrCat("no ", what, " with handle ", handle, " (closed or never created)");
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

}  // namespace
}  // namespace mlfabric

using mlfabric::Entry;

extern "C" {

int64_t mlf_ext_allreducer_create(const char* backend, const char* socket, const char* job,
                                  const char* token, double timeout_s, int* code, char* err,
                                  size_t err_len) {
  mlfabric::AllReduceOptions options;
  options.backend = mlfabric::Or(backend, nullptr, "auto");
  const auto params = mlfabric::Params(socket, job, token, "", -1, -1);
  options.client = params.client;
  options.client.name = mlfabric::Or(nullptr, "MLFABRIC_WORKER_NAME", "");
  if (timeout_s > 0) options.timeout_s = timeout_s;
  auto reducer = mlfabric::MakeAllReducer(options);
  if (!reducer.ok()) return mlfabric::Fail(reducer.status(), code, err, err_len);
  auto entry = std::make_shared<Entry>();
  entry->reducer = std::move(*reducer);
  entry->serial = std::make_unique<mlfabric::Serial>();
  return mlfabric::Add(std::move(entry));
}

int mlf_ext_allreducer_rank(int64_t handle) {
  auto entry = mlfabric::Find(handle);
  return entry && entry->reducer ? entry->reducer->rank() : -1;
}

int mlf_ext_allreducer_size(int64_t handle) {
  auto entry = mlfabric::Find(handle);
  return entry && entry->reducer ? entry->reducer->size() : -1;
}

const char* mlf_ext_allreducer_backend(int64_t handle) {
  auto entry = mlfabric::Find(handle);
  return entry && entry->reducer ? entry->reducer->backend() : "";
}

static void ExtCollective(int64_t handle, bool broadcast, void* data, uint64_t count, int dtype,
                          int root, mlf_done_fn done, void* ctx) {
  auto entry = mlfabric::Find(handle);
  if (!entry || !entry->reducer) {
    done(ctx, static_cast<int>(absl::StatusCode::kInvalidArgument),
         mlfabric::BadHandle(handle, "AllReducer").c_str());
    return;
  }
  std::shared_ptr<mlfabric::AllReducer> reducer = entry->reducer;
  entry->serial->Submit([reducer, broadcast, data, count, dtype, root, done, ctx] {
    const auto type = static_cast<mlfabric::DataType>(dtype);
    absl::Status status =
        mlfabric::DataTypeSize(type) == 0
            ? absl::InvalidArgumentError(absl::StrCat(
                  "unsupported dtype code ", dtype, ": use float32, float64, int32 or int64"))
        : broadcast ? reducer->Broadcast(data, count, type, root)
                    : reducer->AllReduce(data, count, type);
    done(ctx, static_cast<int>(status.code()), std::string(status.message()).c_str());
  });
}

void mlf_ext_allreduce_async(int64_t handle, void* data, uint64_t count, int dtype,
                             mlf_done_fn done, void* ctx) {
  ExtCollective(handle, false, data, count, dtype, 0, done, ctx);
}

void mlf_ext_broadcast_async(int64_t handle, void* data, uint64_t count, int dtype, int root,
                             mlf_done_fn done, void* ctx) {
  ExtCollective(handle, true, data, count, dtype, root, done, ctx);
}

void mlf_ext_allreducer_destroy(int64_t handle) { mlfabric::Remove(handle); }

int64_t mlf_ext_worker_create(const char* socket, const char* job, const char* token,
                              const char* name, int64_t delay_bound, double divergence_bound,
                              int* code, char* err, size_t err_len) {
  auto params = mlfabric::Params(socket, job, token, name, delay_bound, divergence_bound);
  if (params.client.name.empty()) {
    params.client.name = mlfabric::Or(nullptr, "MLFABRIC_WORKER_NAME", "worker");
  }
  auto worker = mlfabric::RegisterAsWorker(params);
  if (!worker.ok()) return mlfabric::Fail(worker.status(), code, err, err_len);
  auto entry = std::make_shared<Entry>();
  entry->worker = std::move(*worker);
  entry->serial = std::make_unique<mlfabric::Serial>();
  return mlfabric::Add(std::move(entry));
}

int64_t mlf_ext_worker_initial_version(int64_t handle) {
  auto entry = mlfabric::Find(handle);
  return entry && entry->worker ? entry->worker->initial_version() : -1;
}

void mlf_ext_push_async(int64_t handle, const char* server, size_t n, const void* const* data,
                        const uint64_t* bytes, const int32_t* priorities, int64_t version,
                        double norm, mlf_push_done_fn done, void* ctx) {
  auto entry = mlfabric::Find(handle);
  if (!entry || !entry->worker) {
    done(ctx, MLF_FAILED, mlfabric::BadHandle(handle, "Worker").c_str(), 0, 0);
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
  auto entry = mlfabric::Find(handle);
  if (!entry || !entry->worker) {
    done(ctx, static_cast<int>(absl::StatusCode::kInvalidArgument),
         mlfabric::BadHandle(handle, "Worker").c_str(), 0, nullptr, 0);
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

void mlf_ext_worker_destroy(int64_t handle) { mlfabric::Remove(handle); }

void mlf_ext_snapshot_set(void* snapshot, int64_t version, const void* data, uint64_t bytes) {
  auto* s = static_cast<mlfabric::Server::Snapshot*>(snapshot);
  s->version = version;
  s->bytes.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
}

int64_t mlf_ext_server_create(const char* socket, const char* job, const char* token,
                              const char* name, int64_t delay_bound, double divergence_bound,
                              int* code, char* err, size_t err_len) {
  auto params = mlfabric::Params(socket, job, token, name, delay_bound, divergence_bound);
  if (params.client.name.empty()) {
    return mlfabric::Fail(absl::InvalidArgumentError("a server needs a name (e.g. \"ps0\")"),
                          code, err, err_len);
  }
  auto server = mlfabric::RegisterAsServer(params);
  if (!server.ok()) return mlfabric::Fail(server.status(), code, err, err_len);
  auto entry = std::make_shared<Entry>();
  entry->server = std::move(*server);
  return mlfabric::Add(std::move(entry));
}

int64_t mlf_ext_server_initial_version(int64_t handle) {
  auto entry = mlfabric::Find(handle);
  return entry && entry->server ? entry->server->initial_version() : -1;
}

void mlf_ext_server_set_callbacks(int64_t handle, mlf_update_fn on_update,
                                  mlf_request_fn on_request, void* ctx) {
  auto entry = mlfabric::Find(handle);
  if (!entry || !entry->server) return;
  std::lock_guard<std::mutex> lock(entry->serve_mu);  // not while serving
  entry->callbacks = {on_update, on_request, ctx};
  mlfabric::Callbacks callbacks = entry->callbacks;
  entry->server->RegisterUpdateCallback(
      [callbacks](const mlfabric::Server::Update& u) { return mlfabric::CallUpdate(callbacks, u); });
  entry->server->RegisterRequestCallback(
      [callbacks]() -> absl::StatusOr<mlfabric::Server::Snapshot> {
        mlfabric::Server::Snapshot snapshot;
        char err[2048] = {0};
        const int code = callbacks.on_request(callbacks.ctx, &snapshot, err, sizeof err);
        if (code != 0) {
          return absl::Status(static_cast<absl::StatusCode>(code),
                              err[0] != '\0' ? err : "the request callback failed without a message");
        }
        return snapshot;
      });
}

int mlf_ext_server_serve(int64_t handle, char* err, size_t err_len) {
  auto entry = mlfabric::Find(handle);
  if (!entry || !entry->server) {
    mlfabric::Fill(err, err_len, mlfabric::BadHandle(handle, "Server"));
    return static_cast<int>(absl::StatusCode::kInvalidArgument);
  }
  std::unique_lock<std::mutex> lock(entry->serve_mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    mlfabric::Fill(err, err_len, "this server is already serving (serve() runs once at a time)");
    return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  }
  if (entry->callbacks.on_update == nullptr || entry->callbacks.on_request == nullptr) {
    mlfabric::Fill(err, err_len,
                   "register both an update callback and a request callback before serve()");
    return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  }
  absl::Status status = entry->server->Serve();
  if (!status.ok()) mlfabric::Fill(err, err_len, std::string(status.message()));
  return static_cast<int>(status.code());
}

void mlf_ext_server_stop(int64_t handle) {
  auto entry = mlfabric::Find(handle);
  if (entry && entry->server) entry->server->Stop();
}

void mlf_ext_server_destroy(int64_t handle) {
  auto entry = mlfabric::Remove(handle);
  if (entry && entry->server) entry->server->Stop();
}

int64_t mlf_ext_replica_create(const char* server, const char* socket, const char* job,
                               const char* token, const char* name, int64_t delay_bound,
                               double divergence_bound, int* code, char* err, size_t err_len) {
  auto params = mlfabric::Params(socket, job, token, name, delay_bound, divergence_bound);
  auto replica = mlfabric::RegisterAsReplica(server != nullptr ? server : "", params);
  if (!replica.ok()) return mlfabric::Fail(replica.status(), code, err, err_len);
  auto entry = std::make_shared<Entry>();
  entry->replica = std::move(*replica);
  return mlfabric::Add(std::move(entry));
}

void mlf_ext_replica_set_callback(int64_t handle, mlf_update_fn on_update, void* ctx) {
  auto entry = mlfabric::Find(handle);
  if (!entry || !entry->replica) return;
  std::lock_guard<std::mutex> lock(entry->serve_mu);
  entry->callbacks = {on_update, nullptr, ctx};
  mlfabric::Callbacks callbacks = entry->callbacks;
  entry->replica->RegisterUpdateCallback(
      [callbacks](const mlfabric::Server::Update& u) { return mlfabric::CallUpdate(callbacks, u); });
}

int mlf_ext_replica_serve(int64_t handle, char* err, size_t err_len) {
  auto entry = mlfabric::Find(handle);
  if (!entry || !entry->replica) {
    mlfabric::Fill(err, err_len, mlfabric::BadHandle(handle, "Replica"));
    return static_cast<int>(absl::StatusCode::kInvalidArgument);
  }
  std::unique_lock<std::mutex> lock(entry->serve_mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    mlfabric::Fill(err, err_len, "this replica is already serving (serve() runs once at a time)");
    return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  }
  if (entry->callbacks.on_update == nullptr) {
    mlfabric::Fill(err, err_len, "register an update callback before serve()");
    return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  }
  absl::Status status = entry->replica->Serve();
  if (!status.ok()) mlfabric::Fill(err, err_len, std::string(status.message()));
  return static_cast<int>(status.code());
}

void mlf_ext_replica_stop(int64_t handle) {
  auto entry = mlfabric::Find(handle);
  if (entry && entry->replica) entry->replica->Stop();
}

void mlf_ext_replica_destroy(int64_t handle) {
  auto entry = mlfabric::Remove(handle);
  if (entry && entry->replica) entry->replica->Stop();
}

}  // extern "C"
