// The C API's shared internals (api/c_api.cc, api/c_api_python.cc): the one
// handle table every mlf_* object lives in, the per-handle executor, and the
// argument helpers. Not part of the interface: adapters include c_api.h only.
//
// Thread safety: the handle table is guarded by its own mutex; an Entry's
// members are used as documented beside them.
#ifndef MLFABRIC_API_C_API_INTERNAL_H_
#define MLFABRIC_API_C_API_INTERNAL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "api/allreduce.h"
#include "api/c_api.h"
#include "api/mlfabric.h"
#include "api/registration.h"
#include "api/replica.h"

namespace mlfabric::c_api {

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
  mlf_promotion_fn on_promotion = nullptr;  // replicas only
  mlf_install_fn on_install = nullptr;      // replicas that install snapshots
  void* ctx = nullptr;
};

// A summing parameter server (model += update, float32) on its own thread.
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
  // Set on Serve()'s thread when the replica is promoted, read from any
  // (Replica::promoted() is for Serve()'s thread only).
  std::atomic<bool> promoted{false};
  std::unique_ptr<SumServer> sum_server;
  Callbacks callbacks;
  std::mutex serve_mu;  // one Serve() at a time
  std::unique_ptr<Serial> serial;  // last member: destroyed (joined) first
};

// The one handle table. Handles count from 1; 0 is never a handle.
int64_t Add(std::shared_ptr<Entry> entry);
std::shared_ptr<Entry> Find(int64_t handle);
std::shared_ptr<Entry> Remove(int64_t handle);

// `value` if set, else $env if set, else `fallback`.
std::string Or(const char* value, const char* env, const char* fallback);
// Client options from the C arguments and the launcher's environment.
RegistrationParams Params(const char* socket, const char* job, const char* token,
                          const char* name, int64_t delay_bound, double divergence_bound);
// Makes `params` register shard `shard` (NULL: no shard).
void SetShard(const mlf_shard* shard, RegistrationParams* params);
void Fill(char* err, size_t err_len, const std::string& text);
// Sets *code and err from `status`; returns 0 (the error handle).
int Fail(const absl::Status& status, int* code, char* err, size_t err_len);
std::string BadHandle(int64_t handle, const char* what);

}  // namespace mlfabric::c_api

#endif  // MLFABRIC_API_C_API_INTERNAL_H_
