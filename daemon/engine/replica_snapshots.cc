#include "daemon/engine/replica_snapshots.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "daemon/engine/server_endpoints.h"

namespace mlfabric::daemon {

ReplicaSnapshots::ReplicaSnapshots(SendScheduler* send, CompletionReporter* reporter)
    : send_(send), reporter_(reporter) {}

void ReplicaSnapshots::AddLocked(const v1::SnapshotToReplica& command) {
  due_[ServerKey(command.job_id(), command.server())].push_back(command);
}

void ReplicaSnapshots::FireLocked(const std::string& key, uint64_t next_position,
                                  const std::shared_ptr<AppSession>& app) {
  auto due = due_.find(key);
  if (due == due_.end()) return;
  std::vector<v1::SnapshotToReplica>& list = due->second;
  for (auto it = list.begin(); it != list.end();) {
    if (it->after_sequence() >= next_position) {  // a position up to the cut is still to come
      ++it;
      continue;
    }
    const v1::SnapshotToReplica command = *it;
    it = list.erase(it);
    if (app == nullptr) {
      reporter_->ReportFailure(command.transfer_id(),
                               absl::StrCat("server '", command.server(), "' is not connected"));
      continue;
    }
    uint64_t id = 0;
    {
      MutexLock lock(&mu_);
      id = next_request_++;
      asked_[id] = command;
    }
    // Right after position after_sequence on the application's channel:
    // it answers with the model as of exactly that position.
    v1::LocalMessage ask;
    ask.mutable_model_request()->set_request_id(id);
    if (absl::Status sent = app->channel->Send(ask); !sent.ok()) {
      {
        MutexLock lock(&mu_);
        asked_.erase(id);
      }
      reporter_->ReportFailure(command.transfer_id(),
                               absl::StrCat("cannot ask server '", command.server(),
                                            "' for a snapshot: ", sent.message()));
      continue;
    }
    MLF_LOG(INFO) << "asked server '" << command.server() << "' for snapshot "
                  << command.transfer_id() << " (after position " << command.after_sequence()
                  << ") for its replica on " << command.dst_host();
  }
  if (list.empty()) due_.erase(due);
}

void ReplicaSnapshots::FailServerLocked(const std::string& key, const std::string& why) {
  auto due = due_.find(key);
  if (due == due_.end()) return;
  for (const v1::SnapshotToReplica& command : due->second) {
    reporter_->ReportFailure(command.transfer_id(), why);
  }
  due_.erase(due);
}

bool ReplicaSnapshots::Answer(uint64_t request_id, int64_t version,
                              std::shared_ptr<SharedBuffer> model, const std::string& error) {
  v1::SnapshotToReplica command;
  {
    MutexLock lock(&mu_);
    auto it = asked_.find(request_id);
    if (it == asked_.end()) return (request_id & kSnapshotRequestBit) != 0;
    command = std::move(it->second);
    asked_.erase(it);
  }
  auto fail = [&](const std::string& why) { reporter_->ReportFailure(command.transfer_id(), why); };
  if (!error.empty() || model == nullptr) {
    fail(absl::StrCat("server '", command.server(), "' gave no snapshot: ",
                      error.empty() ? "no model" : error));
    return true;
  }
  // The version first, then the model: one transfer.
  absl::StatusOr<SharedBuffer> framed = SharedBuffer::Create(8 + model->size());
  if (!framed.ok()) {
    fail(std::string(framed.status().message()));
    return true;
  }
  for (int i = 0; i < 8; ++i) {
    framed->data()[i] = static_cast<uint8_t>(static_cast<uint64_t>(version) >> (8 * i));
  }
  if (model->size() > 0) std::memcpy(framed->data() + 8, model->data(), model->size());
  v1::SendTransfer send;
  send.set_transfer_id(command.transfer_id());
  send.set_job_id(command.job_id());
  send.set_dst_host(command.dst_host());
  send.set_dst_address(command.dst_address());
  send.set_start_s(0);  // unscheduled: at once, unpaced
  send.set_bytes(static_cast<int64_t>(framed->size()));
  absl::Status scheduled =
      send_->Schedule(send, std::make_shared<SharedBuffer>(std::move(*framed)), {}, nullptr);
  if (!scheduled.ok()) {
    fail(std::string(scheduled.message()));
    return true;
  }
  MLF_LOG(INFO) << "sending snapshot " << command.transfer_id() << " of server '"
                << command.server() << "' (version " << version << ", " << model->size()
                << " bytes) to " << command.dst_host();
  return true;
}

}  // namespace mlfabric::daemon
