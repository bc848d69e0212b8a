// The C interface over the C++ API (see c_api.h): the one handle table,
// the argument helpers, and the summing parameter server. Workers, servers,
// replicas and AllReduce are in c_api_python.cc.
#include "api/c_api.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "api/c_api_internal.h"

namespace mlfabric::c_api {
namespace {

std::mutex g_mu;
std::map<int64_t, std::shared_ptr<Entry>>& Entries() {
  static auto* entries = new std::map<int64_t, std::shared_ptr<Entry>>();
  return *entries;
}
int64_t g_next_handle = 1;

}  // namespace

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
  Fill(err, err_len, std::string(status.message()));
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
  params.client.job_token = Or(token, "MLFABRIC_JOB_TOKEN", "");  // "" fails at registration
  params.client.name = Or(name, nullptr, "");
  params.delay_bound = delay_bound;
  params.divergence_bound = divergence_bound;
  return params;
}

void SetShard(const mlf_shard* shard, RegistrationParams* params) {
  if (shard == nullptr || shard->group == nullptr || shard->group[0] == '\0') return;
  params->client.shard = {shard->group, shard->index, shard->count, shard->begin, shard->end};
}

std::string BadHandle(int64_t handle, const char* what) {
  return absl::StrCat("no ", what, " with handle ", handle, " (closed or never created)");
}

}  // namespace mlfabric::c_api

using mlfabric::c_api::Entry;

extern "C" {

int64_t mlf_sum_server_start(const char* socket, const char* job, const char* token,
                             const char* name, const float* initial, uint64_t count, char* err,
                             size_t err_len) {
  return mlf_sum_server_start_shard(socket, job, token, name, nullptr, initial, count, err,
                                    err_len);
}

int64_t mlf_sum_server_start_shard(const char* socket, const char* job, const char* token,
                                   const char* name, const mlf_shard* shard, const float* initial,
                                   uint64_t count, char* err, size_t err_len) {
  mlfabric::RegistrationParams params = mlfabric::c_api::Params(socket, job, token, name, -1, -1);
  mlfabric::c_api::SetShard(shard, &params);
  auto server = mlfabric::RegisterAsServer(params);
  if (!server.ok()) {
    mlfabric::c_api::SetError(server.status(), err, err_len);
    return 0;
  }
  auto entry = std::make_shared<Entry>();
  entry->sum_server = std::make_unique<mlfabric::c_api::SumServer>(
      std::move(*server), std::vector<float>(initial, initial + count));
  return mlfabric::c_api::Add(std::move(entry));
}

int64_t mlf_sum_server_applied(int64_t handle) {
  auto entry = mlfabric::c_api::Find(handle);
  return entry && entry->sum_server ? entry->sum_server->applied() : -1;
}

void mlf_sum_server_stop(int64_t handle) { mlfabric::c_api::Remove(handle); }

}  // extern "C"
