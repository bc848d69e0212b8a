#include "daemon/engine/server_endpoints.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace mlfabric::daemon {

std::string ServerKey(uint32_t job_id, const std::string& server) {
  return absl::StrCat(job_id, "/", server);
}

ServerEndpoints::ServerEndpoints(ReceiveLock* lock, BufferPool* pool,
                                 const std::atomic<bool>* stopping)
    : lock_(lock), pool_(pool), stopping_(stopping) {}

void ServerEndpoints::PublishLocked(const std::string& key, std::shared_ptr<AppSession> app) {
  endpoints_[key] = std::move(app);
  lock_->NotifyAll();  // gets waiting for this server (AwaitServer)
}

void ServerEndpoints::EndRegistrationLocked(const std::string& server) {
  auto it = registering_.find(server);
  if (it != registering_.end() && --it->second == 0) registering_.erase(it);
}

std::shared_ptr<AppSession> ServerEndpoints::AppLocked(const std::string& key) const {
  auto it = endpoints_.find(key);
  return it == endpoints_.end() ? nullptr : it->second;
}

std::shared_ptr<AppSession> ServerEndpoints::EnsureLocked(const std::string& key) {
  return endpoints_[key];
}

std::vector<std::string> ServerEndpoints::KeysLocked() const {
  std::vector<std::string> keys;
  keys.reserve(endpoints_.size());
  for (const auto& [key, app] : endpoints_) keys.push_back(key);
  return keys;
}

std::optional<std::string> ServerEndpoints::ForgetLocked(const std::shared_ptr<AppSession>& app) {
  for (auto it = awaiting_ack_.begin(); it != awaiting_ack_.end();) {
    it = it->second.first == app ? awaiting_ack_.erase(it) : std::next(it);
  }
  if (app->role != v1::ROLE_SERVER && app->role != v1::ROLE_REPLICA) return std::nullopt;
  const std::string name = app->role == v1::ROLE_REPLICA ? "replica:" + app->name : app->name;
  const std::string key = ServerKey(app->job_id, name);
  auto it = endpoints_.find(key);
  if (it == endpoints_.end() || it->second != app) return std::nullopt;
  it->second = nullptr;
  snapshot_waiters_.erase(key);
  lock_->NotifyAll();
  return key;
}

std::shared_ptr<AppSession> ServerEndpoints::RenameLocked(const std::string& from,
                                                          const std::string& to) {
  std::shared_ptr<AppSession> app;
  if (auto it = endpoints_.find(from); it != endpoints_.end()) {
    app = std::move(it->second);
    endpoints_.erase(it);
  }
  endpoints_[to] = app;
  lock_->NotifyAll();
  return app;
}

absl::Status ServerEndpoints::HandLocked(const std::string& key, const v1::LocalMessage& message,
                                         std::shared_ptr<SharedBuffer> buffer, bool group_part) {
  const std::shared_ptr<AppSession> app = AppLocked(key);
  if (app == nullptr) return absl::UnavailableError("its application is not connected");
  if (absl::Status sent = app->channel->Send(message, buffer->fd()); !sent.ok()) return sent;
  awaiting_ack_[message.update().transfer_id()] = {app, std::move(buffer)};
  // A shard of a server group: the snapshot of the version this update
  // makes, asked right after it, is kept for group gets (model_server.h).
  if (group_part && model_server_ != nullptr) {
    if (const uint64_t id = model_server_->NewHistoryRequest(key); id != 0) {
      v1::LocalMessage ask;
      ask.mutable_model_request()->set_request_id(id);
      (void)app->channel->Send(ask);
    }
  }
  SendWaitingSnapshotsLocked(key, app);
  return absl::OkStatus();
}

void ServerEndpoints::SendWaitingSnapshotsLocked(const std::string& key,
                                                 const std::shared_ptr<AppSession>& app) {
  auto waiting = snapshot_waiters_.find(key);
  if (waiting == snapshot_waiters_.end()) return;
  // Snapshot requests for the version this update makes go right after it
  // (AskSnapshot's at_version).
  const int64_t handed = HandedVersionLocked(key);
  auto& list = waiting->second;
  for (auto w = list.begin(); w != list.end();) {
    if (w->first > handed) {
      ++w;
      continue;
    }
    v1::LocalMessage ask;
    ask.mutable_model_request()->set_request_id(w->second);
    (void)app->channel->Send(ask);
    w = list.erase(w);
  }
  if (list.empty()) snapshot_waiters_.erase(waiting);
}

std::vector<uint64_t> ServerEndpoints::AcknowledgedLocked(const v1::LocalUpdateAck& ack) {
  if (auto done = awaiting_ack_.find(ack.transfer_id()); done != awaiting_ack_.end()) {
    if (ack.error().empty() && done->second.first != nullptr) {
      const std::shared_ptr<AppSession>& app = done->second.first;
      int64_t& version = versions_[ServerKey(app->job_id, app->name)];
      version = std::max(version, ack.model_version());
    }
    if (pool_ != nullptr) pool_->Recycle(std::move(done->second.second));
    awaiting_ack_.erase(done);
  }
  std::vector<uint64_t> pushes =
      applied_log_.Acked(ack.transfer_id(), ack.error().empty(), ack.model_version());
  (void)replica_log_.Acked(ack.transfer_id(), ack.error().empty(), ack.model_version());
  return pushes;
}

void ServerEndpoints::RoundAcknowledgedLocked(const std::string& key, uint64_t delivery,
                                              const std::vector<uint64_t>& members,
                                              int64_t version, bool applied) {
  applied_log_.Acked(delivery, /*applied=*/false, 0);  // logged per member:
  if (!applied) return;
  for (uint64_t member : members) applied_log_.Applied(member, version);
  int64_t& known = versions_[key];
  known = std::max(known, version);
}

std::optional<int64_t> ServerEndpoints::VersionLocked(const std::string& key) const {
  auto it = versions_.find(key);
  if (it == versions_.end()) return std::nullopt;
  return it->second;
}

int64_t ServerEndpoints::HandedVersionLocked(const std::string& key) const {
  int64_t version = 0;
  if (auto known = versions_.find(key); known != versions_.end()) version = known->second;
  for (const auto& [transfer, handed] : awaiting_ack_) {
    if (handed.first != nullptr && ServerKey(handed.first->job_id, handed.first->name) == key) {
      ++version;
    }
  }
  return version;
}

bool ServerEndpoints::AwaitServer(const std::string& key, double wait_s) {
  ReceiveLock::Hold lock(lock_);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(wait_s));
  while (AppLocked(key) == nullptr && !stopping_->load() &&
         std::chrono::steady_clock::now() < deadline) {
    lock_->WaitUntil(deadline);
  }
  return AppLocked(key) != nullptr;
}

absl::Status ServerEndpoints::AskSnapshot(const std::string& key, uint64_t request_id,
                                          int64_t at_version) {
  v1::LocalMessage ask;
  ask.mutable_model_request()->set_request_id(request_id);
  std::shared_ptr<AppSession> app;
  {
    ReceiveLock::Hold lock(lock_);
    app = AppLocked(key);
    if (app == nullptr) return absl::NotFoundError(absl::StrCat("no server '", key, "' here"));
    // The application reads its channel in order: a request sent right
    // after the update that makes `at_version` is answered at that version.
    // Sent under the lock, so that no update is handed over in between.
    if (at_version >= 0 && HandedVersionLocked(key) < at_version) {
      snapshot_waiters_[key].emplace_back(at_version, request_id);
      return absl::OkStatus();
    }
    if (at_version >= 0) return app->channel->Send(ask);
  }
  return app->channel->Send(ask);
}

std::string ServerEndpoints::JobOf(const std::string& key) {
  ReceiveLock::Hold lock(lock_);
  const std::shared_ptr<AppSession> app = AppLocked(key);
  return app != nullptr ? app->job : "";
}

}  // namespace mlfabric::daemon
