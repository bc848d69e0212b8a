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
  std::unique_ptr<SumServer> sum_server;
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

}  // namespace
}  // namespace mlfabric

using mlfabric::Entry;

extern "C" {

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
