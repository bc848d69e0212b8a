// Daemon: the server applications as daemon::ModelServer sees them
// (ServerApps), and this host's uplink. Gets are answered by the
// ModelServer; the asking and forwarding side is daemon::ModelFetcher.
#include "daemon/daemon.h"

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/daemon_internal.h"

namespace mlfabric {

// ---- daemon::ServerApps: the server applications, as the ModelServer
// sees them.

bool Daemon::AwaitServer(const std::string& key, double wait_s) {
  std::unique_lock<std::mutex> lock(mu_);
  auto connected = [&] {
    auto found = servers_.find(key);
    return found != servers_.end() && found->second.app != nullptr;
  };
  cv_.wait_for(lock, std::chrono::duration<double>(wait_s),
               [&] { return connected() || stopping_.load(); });
  return connected();
}

absl::Status Daemon::AskSnapshot(const std::string& key, uint64_t request_id,
                                 int64_t at_version) {
  std::shared_ptr<AppSession> app;
  v1::LocalMessage ask;
  ask.mutable_model_request()->set_request_id(request_id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = servers_.find(key);
    if (it != servers_.end()) app = it->second.app;
    if (app == nullptr) return absl::NotFoundError(absl::StrCat("no server '", key, "' here"));
    // The application reads its channel in order: a request sent right
    // after the update that makes `at_version` is answered at that version.
    // Sent under mu_, so that no update is handed over in between.
    if (at_version >= 0 && HandedVersionLocked(key) < at_version) {
      snapshot_waiters_[key].emplace_back(at_version, request_id);
      return absl::OkStatus();
    }
    if (at_version >= 0) return app->channel->Send(ask);
  }
  return app->channel->Send(ask);
}

int64_t Daemon::HandedVersionLocked(const std::string& key) const {
  int64_t version = 0;
  if (auto known = server_versions_.find(key); known != server_versions_.end()) {
    version = known->second;
  }
  for (const auto& [transfer, handed] : awaiting_ack_) {
    if (handed.first != nullptr && ServerKey(handed.first->job_id, handed.first->name) == key) {
      ++version;
    }
  }
  return version;
}

std::string Daemon::JobOf(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = servers_.find(key);
  return it != servers_.end() && it->second.app != nullptr ? it->second.app->job : "";
}


double Daemon::UplinkBps() const {
  if (monitor_) {
    if (std::optional<monitor::Report> report = monitor_->LastReport()) {
      if (report->up_bps > 0) return report->up_bps;
    }
  }
  return config_.uplink_bps;
}










}  // namespace mlfabric
