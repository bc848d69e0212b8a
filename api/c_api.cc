// The C interface over the C++ API (see c_api.h): handles, one FIFO thread
// per handle for asynchronous calls, statuses flattened to (code, message).
#include "api/c_api.h"

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
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

namespace mlfabric {
namespace {

// Runs closures one at a time, in submission order, on its own thread.
class SerialExecutor {
 public:
  SerialExecutor() : thread_([this] { Loop(); }) {}
  ~SerialExecutor() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
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
        if (tasks_.empty()) return;  // stopping, and everything queued ran
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

class SumServer {
 public:
  SumServer(std::unique_ptr<Server> server, std::vector<float> model)
      : server_(std::move(server)), model_(std::move(model)) {
    version_ = server_->initial_version();
    server_->RegisterUpdateCallback([this](const Server::Update& u) -> absl::StatusOr<int64_t> {
      std::lock_guard<std::mutex> lock(mu_);
      if (u.bytes != model_.size() * sizeof(float)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "update of ", u.bytes, " bytes does not match the model's ",
            model_.size() * sizeof(float), " bytes (float32)"));
      }
      const float* values = reinterpret_cast<const float*>(u.data);
      for (size_t i = 0; i < model_.size(); ++i) model_[i] += values[i];
      ++applied_;
      return ++version_;
    });
    server_->RegisterRequestCallback([this]() -> absl::StatusOr<Server::Snapshot> {
      std::lock_guard<std::mutex> lock(mu_);
      Server::Snapshot snapshot;
      snapshot.version = version_;
      snapshot.bytes.resize(model_.size() * sizeof(float));
      std::memcpy(snapshot.bytes.data(), model_.data(), snapshot.bytes.size());
      return snapshot;
    });
    thread_ = std::thread([this] { (void)server_->Serve(); });
  }
  ~SumServer() {
    server_->Stop();
    thread_.join();
  }
  int64_t applied() {
    std::lock_guard<std::mutex> lock(mu_);
    return applied_;
  }

 private:
  std::unique_ptr<Server> server_;
  std::mutex mu_;
  std::vector<float> model_;
  int64_t version_ = 0;
  int64_t applied_ = 0;
  std::thread thread_;
};

struct Entry {
  std::unique_ptr<AllReducer> reducer;
  std::unique_ptr<Worker> worker;
  std::unique_ptr<SumServer> sum_server;
  std::unique_ptr<SerialExecutor> executor;  // last member: destroyed (joined) first
};

std::mutex g_mu;
std::map<int64_t, std::shared_ptr<Entry>>& Entries() {
  static auto* entries = new std::map<int64_t, std::shared_ptr<Entry>>();
  return *entries;
}
int64_t g_next_handle = 1;

int64_t Add(std::shared_ptr<Entry> entry) {
  std::lock_guard<std::mutex> lock(g_mu);
  const int64_t handle = g_next_handle++;
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

void SetError(const absl::Status& status, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  const std::string text(status.message());
  std::snprintf(err, err_len, "%s", text.c_str());
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

ClientOptions Options(const char* socket, const char* job, const char* token, const char* name) {
  ClientOptions options;
  options.daemon_socket = Or(socket, "MLFABRIC_DAEMON_SOCKET", "");
  options.job = Or(job, "MLFABRIC_JOB", "demo");
  options.job_token = Or(token, "MLFABRIC_JOB_TOKEN", "demo-token");
  options.name = Or(name, nullptr, "");
  return options;
}

absl::Status BadHandle(int64_t handle, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("no ", what, " with handle ", handle,
                                                 " (destroyed or never created)"));
}

}  // namespace
}  // namespace mlfabric

using mlfabric::Entry;

extern "C" {

int64_t mlf_allreducer_create(const char* backend, const char* socket, const char* job,
                              const char* token, double timeout_s, char* err, size_t err_len) {
  mlfabric::AllReduceOptions options;
  options.backend = mlfabric::Or(backend, nullptr, "auto");
  options.client = mlfabric::Options(socket, job, token, "");
  if (const char* name = std::getenv("MLFABRIC_WORKER_NAME")) options.client.name = name;
  if (timeout_s > 0) options.timeout_s = timeout_s;
  auto reducer = mlfabric::MakeAllReducer(options);
  if (!reducer.ok()) {
    mlfabric::SetError(reducer.status(), err, err_len);
    return 0;
  }
  auto entry = std::make_shared<Entry>();
  entry->reducer = std::move(*reducer);
  entry->executor = std::make_unique<mlfabric::SerialExecutor>();
  return mlfabric::Add(std::move(entry));
}

int mlf_allreducer_rank(int64_t handle) {
  auto entry = mlfabric::Find(handle);
  return entry && entry->reducer ? entry->reducer->rank() : -1;
}

int mlf_allreducer_size(int64_t handle) {
  auto entry = mlfabric::Find(handle);
  return entry && entry->reducer ? entry->reducer->size() : -1;
}

const char* mlf_allreducer_backend(int64_t handle) {
  auto entry = mlfabric::Find(handle);
  return entry && entry->reducer ? entry->reducer->backend() : "";
}

static void Collective(int64_t handle, bool broadcast, void* data, uint64_t count, int dtype,
                       int root, mlf_done_fn done, void* ctx) {
  auto entry = mlfabric::Find(handle);
  if (!entry || !entry->reducer) {
    auto status = mlfabric::BadHandle(handle, "AllReducer");
    done(ctx, static_cast<int>(status.code()), std::string(status.message()).c_str());
    return;
  }
  entry->executor->Submit([entry, broadcast, data, count, dtype, root, done, ctx] {
    const auto type = static_cast<mlfabric::DataType>(dtype);
    absl::Status status =
        mlfabric::DataTypeSize(type) == 0
            ? absl::InvalidArgumentError(absl::StrCat(
                  "unsupported dtype code ", dtype, ": use float32, float64, int32 or int64"))
        : broadcast ? entry->reducer->Broadcast(data, count, type, root)
                    : entry->reducer->AllReduce(data, count, type);
    done(ctx, static_cast<int>(status.code()), std::string(status.message()).c_str());
  });
}

void mlf_allreduce_async(int64_t handle, void* data, uint64_t count, int dtype, mlf_done_fn done,
                         void* ctx) {
  Collective(handle, false, data, count, dtype, 0, done, ctx);
}

void mlf_broadcast_async(int64_t handle, void* data, uint64_t count, int dtype, int root,
                         mlf_done_fn done, void* ctx) {
  Collective(handle, true, data, count, dtype, root, done, ctx);
}

namespace {
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int code = 0;
  std::string message;
  static void Done(void* ctx, int code, const char* message) {
    auto* w = static_cast<Waiter*>(ctx);
    std::lock_guard<std::mutex> lock(w->mu);
    w->code = code;
    w->message = message;
    w->done = true;
    w->cv.notify_all();
  }
  int Wait(char* err, size_t err_len) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    if (code != 0 && err && err_len) std::snprintf(err, err_len, "%s", message.c_str());
    return code;
  }
};
}  // namespace

int mlf_allreduce(int64_t handle, void* data, uint64_t count, int dtype, char* err,
                  size_t err_len) {
  Waiter waiter;
  mlf_allreduce_async(handle, data, count, dtype, &Waiter::Done, &waiter);
  return waiter.Wait(err, err_len);
}

int mlf_broadcast(int64_t handle, void* data, uint64_t count, int dtype, int root, char* err,
                  size_t err_len) {
  Waiter waiter;
  mlf_broadcast_async(handle, data, count, dtype, root, &Waiter::Done, &waiter);
  return waiter.Wait(err, err_len);
}

void mlf_allreducer_destroy(int64_t handle) { mlfabric::Remove(handle); }

int64_t mlf_worker_create(const char* socket, const char* job, const char* token,
                          const char* name, int64_t delay_bound, char* err, size_t err_len) {
  mlfabric::RegistrationParams params;
  params.client = mlfabric::Options(socket, job, token, name);
  if (params.client.name.empty()) {
    params.client.name = mlfabric::Or(nullptr, "MLFABRIC_WORKER_NAME", "worker");
  }
  params.delay_bound = delay_bound;
  auto worker = mlfabric::RegisterAsWorker(params);
  if (!worker.ok()) {
    mlfabric::SetError(worker.status(), err, err_len);
    return 0;
  }
  auto entry = std::make_shared<Entry>();
  entry->worker = std::move(*worker);
  entry->executor = std::make_unique<mlfabric::SerialExecutor>();
  return mlfabric::Add(std::move(entry));
}

int64_t mlf_worker_initial_version(int64_t handle) {
  auto entry = mlfabric::Find(handle);
  return entry && entry->worker ? entry->worker->initial_version() : -1;
}

void mlf_push_async(int64_t handle, const char* server, const void* data, uint64_t bytes,
                    int64_t version, double norm, mlf_push_done_fn done, void* ctx) {
  auto entry = mlfabric::Find(handle);
  if (!entry || !entry->worker) {
    done(ctx, MLF_FAILED, std::string(mlfabric::BadHandle(handle, "Worker").message()).c_str(), 0,
         0);
    return;
  }
  entry->worker->PushAsync(server, data, bytes, version, norm,
                           [entry, done, ctx](mlfabric::PushResult result) {
                             done(ctx, static_cast<int>(result.outcome), result.reason.c_str(),
                                  result.applied_version, result.delay);
                           });
}

void mlf_get_async(int64_t handle, const char* server, mlf_get_done_fn done, void* ctx) {
  auto entry = mlfabric::Find(handle);
  if (!entry || !entry->worker) {
    auto status = mlfabric::BadHandle(handle, "Worker");
    done(ctx, static_cast<int>(status.code()), std::string(status.message()).c_str(), 0, nullptr,
         0);
    return;
  }
  std::string name = server;
  entry->executor->Submit([entry, name, done, ctx] {
    auto model = entry->worker->Get(name);
    if (!model.ok()) {
      done(ctx, static_cast<int>(model.status().code()),
           std::string(model.status().message()).c_str(), 0, nullptr, 0);
      return;
    }
    done(ctx, 0, "", model->version, model->data(), model->size());
  });
}

void mlf_worker_destroy(int64_t handle) { mlfabric::Remove(handle); }

int64_t mlf_sum_server_start(const char* socket, const char* job, const char* token,
                             const char* name, const float* initial, uint64_t count, char* err,
                             size_t err_len) {
  mlfabric::RegistrationParams params;
  params.client = mlfabric::Options(socket, job, token, name);
  auto server = mlfabric::RegisterAsServer(params);
  if (!server.ok()) {
    mlfabric::SetError(server.status(), err, err_len);
    return 0;
  }
  auto entry = std::make_shared<Entry>();
  entry->sum_server = std::make_unique<mlfabric::SumServer>(
      std::move(*server), std::vector<float>(initial, initial + count));
  return mlfabric::Add(std::move(entry));
}

int64_t mlf_sum_server_applied(int64_t handle) {
  auto entry = mlfabric::Find(handle);
  return entry && entry->sum_server ? entry->sum_server->applied() : -1;
}

void mlf_sum_server_stop(int64_t handle) { mlfabric::Remove(handle); }

}  // extern "C"
