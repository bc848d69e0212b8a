#include "daemon/engine/deliveries.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mlfabric::daemon {

namespace {

// Why the complete transfer cannot be handed over as `info` announced it,
// or "" if it can.
std::string SizeMismatch(const v1::ExpectDelivery& info, const Incoming& incoming) {
  if (info.snapshot()) {  // any size: the 8-byte version, then the model
    if (incoming.total < 8) {
      return absl::StrCat("a snapshot of ", incoming.total, " bytes has no version");
    }
  } else if (incoming.total != static_cast<uint64_t>(info.bytes())) {
    return absl::StrCat("received ", incoming.total, " bytes but the schedule said ",
                        info.bytes());
  }
  return "";
}

// The update as the server application gets it; a snapshot's version is
// its first 8 bytes (little-endian), the model the rest.
v1::LocalMessage UpdateMessage(const DeliverySequencer::Step& step, const Incoming& incoming) {
  v1::LocalMessage message;
  v1::LocalUpdate* update = message.mutable_update();
  update->set_transfer_id(step.info.transfer_id());
  update->set_worker(step.info.worker());
  update->set_version(step.info.version());
  update->set_norm(step.info.norm());
  update->set_bytes(step.info.bytes());
  update->set_sequence(step.sequence);
  update->set_count(std::max(1, step.info.constituents_size()));
  if (step.info.snapshot()) {
    uint64_t version = 0;
    for (int i = 0; i < 8; ++i) {
      version |= static_cast<uint64_t>(incoming.buffer->data()[i]) << (8 * i);
    }
    update->set_snapshot(true);
    update->set_data_offset(8);
    update->set_version(static_cast<int64_t>(version));
    update->set_bytes(static_cast<int64_t>(incoming.total) - 8);
    update->set_count(0);
  }
  return message;
}

}  // namespace

Deliveries::Deliveries(std::string host, IncomingTransfers* incoming, ServerEndpoints* servers,
                       CompletionReporter* reporter, ReplicaSnapshots* snapshots)
    : host_(std::move(host)),
      incoming_(incoming),
      servers_(servers),
      reporter_(reporter),
      snapshots_(snapshots) {}

void Deliveries::ExpectLocked(const v1::ExpectDelivery& expect) {
  const std::string key = ServerKey(expect.job_id(), expect.server());
  if (servers_->AppLocked(key) == nullptr && servers_->RegisteringLocked(expect.server())) {
    // The server is registering here: the scheduler planned for it as soon
    // as it registered there, before this daemon published its endpoint.
    // The position waits for the end of that registration (under load the
    // gap was long enough to fail a first push as "not connected").
    sequencer_.Expect(key, expect);
    if (expect.group_push() != 0 && expect.held()) unready_parts_[expect.transfer_id()] = key;
    awaiting_registration_.emplace(expect.server(), expect.job_id());
    return;
  }
  if (servers_->EnsureLocked(key) == nullptr) {
    sequencer_.Expect(key, expect, "server application is not connected");
    reporter_->ReportFailure(expect.transfer_id(), NotConnected(expect.server()));
  } else {
    sequencer_.Expect(key, expect);
    if (expect.group_push() != 0 && expect.held()) unready_parts_[expect.transfer_id()] = key;
  }
  TryDeliverLocked(expect.job_id(), expect.server());
}

std::string Deliveries::NotConnected(const std::string& server) const {
  return absl::StrCat("server '", server, "' is not connected to ", host_, "'s daemon");
}

void Deliveries::RegistrationEndedLocked(const std::string& server) {
  if (servers_->RegisteringLocked(server)) return;  // another application of that name still is
  for (auto it = awaiting_registration_.lower_bound({server, 0});
       it != awaiting_registration_.end() && it->first == server;) {
    const uint32_t job_id = it->second;
    it = awaiting_registration_.erase(it);
    const std::string key = ServerKey(job_id, server);
    if (servers_->EnsureLocked(key) == nullptr) {  // refused, or of another job
      const std::string why = NotConnected(server);
      for (uint64_t transfer : sequencer_.CancelAll(key, "server application is not connected")) {
        reporter_->ReportFailure(transfer, why);
      }
    }
    TryDeliverLocked(job_id, server);
  }
}

void Deliveries::ArrivedLocked(uint64_t transfer) {
  for (const auto& [job_id, server] : sequencer_.EndpointsExpecting(transfer)) {
    TryDeliverLocked(job_id, server);
  }
}

std::optional<uint32_t> Deliveries::JobExpectingLocked(uint64_t transfer) const {
  const auto endpoints = sequencer_.EndpointsExpecting(transfer);
  if (endpoints.empty()) return std::nullopt;
  return endpoints.front().first;
}

void Deliveries::TryDeliverLocked(uint32_t job_id, const std::string& server) {
  const std::string key = ServerKey(job_id, server);
  if (!servers_->KnownLocked(key)) return;
  // Held for the registration in progress (ExpectLocked).
  if (servers_->AppLocked(key) == nullptr && servers_->RegisteringLocked(server)) return;
  ReportReadyPartsLocked(key);
  auto complete = [this](uint64_t transfer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side) {
    return incoming_->Complete(transfer);
  };
  while (true) {
    // A snapshot cut after the last position handed over is asked for
    // before the next one (replica_snapshots.h).
    if (snapshots_ != nullptr) {
      snapshots_->FireLocked(key, sequencer_.NextPosition(key), servers_->AppLocked(key));
    }
    const DeliverySequencer::Step step = sequencer_.Next(key, complete);
    if (step.kind == DeliverySequencer::Step::kNothing) return;
    const uint64_t transfer_id = step.info.transfer_id();
    if (step.kind == DeliverySequencer::Step::kSkip) {
      SkipLocked(step);
      continue;
    }
    const Incoming* incoming = incoming_->Find(transfer_id);
    std::string reason = incoming_->JobMismatch(transfer_id, job_id);
    if (reason.empty()) reason = SizeMismatch(step.info, *incoming);
    if (!reason.empty()) {
      reporter_->ReportFailure(transfer_id, reason);
      sequencer_.Cancel(key, step.sequence, reason);
      continue;
    }
    HandOverLocked(key, server, step, *incoming);
    // Handed over or failed to: the position is settled either way.
    delivered_.fetch_add(1);
    incoming_->Erase(transfer_id);
    orphan_copies_.erase(transfer_id);
    sequencer_.Advance(key);
  }
}

void Deliveries::ReportReadyPartsLocked(const std::string& key) {
  for (auto part = unready_parts_.begin(); part != unready_parts_.end();) {
    if (part->second != key || !incoming_->Complete(part->first)) {
      ++part;
      continue;
    }
    reporter_->ReportPartReady(part->first);
    part = unready_parts_.erase(part);
  }
}

void Deliveries::SkipLocked(const DeliverySequencer::Step& step) {
  const uint64_t transfer_id = step.info.transfer_id();
  MLF_LOG(INFO) << "skipping update " << transfer_id << " (sequence " << step.sequence
                << "): " << step.reason;
  // A held copy kept across the lost stream keeps its bytes for its
  // new announcement.
  if (!orphan_copies_.count(transfer_id)) incoming_->Erase(transfer_id);
  unready_parts_.erase(transfer_id);
}

void Deliveries::HandOverLocked(const std::string& key, const std::string& server,
                                const DeliverySequencer::Step& step, const Incoming& incoming) {
  const uint64_t transfer_id = step.info.transfer_id();
  absl::Status sent = servers_->HandLocked(key, UpdateMessage(step, incoming), incoming.buffer,
                                           step.info.group_push() != 0);
  if (!sent.ok()) {
    reporter_->ReportFailure(transfer_id, absl::StrCat("cannot hand the update to server '",
                                                       server, "': ", sent.message()));
    return;
  }
  LogHandedLocked(transfer_id, step.info);
}

void Deliveries::LogHandedLocked(uint64_t transfer_id, const v1::ExpectDelivery& info) {
  // A restarted scheduler knows a group push, not its parts; a group
  // aggregate's part names its pushes.
  std::vector<uint64_t> pushes(info.constituents().begin(), info.constituents().end());
  if (info.group_push() != 0 && pushes.empty()) pushes = {info.group_push()};
  // A replica's aggregate of punted copies names pushes its server
  // applied and reported long ago: not this daemon's to report as
  // applied by a server, but as held by the replica (the copy's push,
  // or the aggregate's), so a restarted scheduler copies none twice.
  if (absl::StartsWith(info.server(), "replica:")) {
    std::vector<uint64_t> copied = std::move(pushes);
    if (copied.empty() && info.source_transfer_id() != 0) {
      copied.push_back(info.source_transfer_id());
    }
    if (!copied.empty()) servers_->replica_log().Handed(transfer_id, std::move(copied));
    pushes.clear();
  }
  servers_->applied_log().Handed(transfer_id, std::move(pushes));
}

void Deliveries::ReleaseLocked(const v1::ReleaseDelivery& release) {
  unready_parts_.erase(release.transfer_id());
  if (release.cancel_if_incomplete() && !incoming_->Complete(release.transfer_id())) {
    // Its source went away before sending it all: it never will.
    const std::string why = "its source went away before all its bytes arrived";
    if (std::optional<v1::ExpectDelivery> cancelled =
            sequencer_.CancelTransfer(release.sequence(), release.transfer_id(), why)) {
      incoming_->Erase(release.transfer_id());
      reporter_->ReportFailure(release.transfer_id(), why);
      TryDeliverLocked(cancelled->job_id(), cancelled->server());
    }
    return;
  }
  if (std::optional<v1::ExpectDelivery> released =
          sequencer_.Release(release.sequence(), release.transfer_id())) {
    TryDeliverLocked(released->job_id(), released->server());
  }
}

void Deliveries::CancelLocked(const v1::CancelDelivery& cancel) {
  unready_parts_.erase(cancel.transfer_id());
  if (std::optional<v1::ExpectDelivery> cancelled =
          sequencer_.CancelTransfer(cancel.sequence(), cancel.transfer_id(), cancel.reason())) {
    incoming_->Erase(cancel.transfer_id());
    // Skipped before the application had it: it will not be applied.
    if (cancel.confirm()) reporter_->ReportFailure(cancel.transfer_id(), cancel.reason());
    TryDeliverLocked(cancelled->job_id(), cancelled->server());
  }
}

bool Deliveries::DropHeldCopyLocked(uint64_t transfer, const std::string& reason) {
  if (orphan_copies_.erase(transfer) == 0) return false;
  MLF_LOG(INFO) << "dropping held replica copy " << transfer << ": " << reason;
  incoming_->Erase(transfer);
  return true;
}

std::vector<uint64_t> Deliveries::CancelAllLocked(const std::string& key, const std::string& why) {
  return sequencer_.CancelAll(key, why);
}

std::vector<uint64_t> Deliveries::RenameLocked(const std::string& from, const std::string& to,
                                               const std::string& server) {
  return sequencer_.Rename(from, to, server);
}

size_t Deliveries::ScheduleLostLocked(const std::string& why) {
  KeepHeldCopiesLocked();
  size_t cancelled = 0;
  for (const std::string& key : servers_->KeysLocked()) {
    cancelled += sequencer_.CancelAll(key, why).size();
  }
  return cancelled;
}

void Deliveries::KeepHeldCopiesLocked() {
  for (const std::string& key : servers_->KeysLocked()) {
    const std::shared_ptr<AppSession> app = servers_->AppLocked(key);
    const std::string job = app ? app->job : "";
    // Parts of group pushes not handed over yet whose bytes are all in: the
    // scheduler may have released the push at other shards just before it
    // went, and they applied it. The restarted scheduler has the part
    // delivered here too if any shard applied its push, dropped if none did.
    // A part still arriving was never released anywhere: dropped.
    for (const v1::ExpectDelivery& part : sequencer_.Undelivered(key)) {
      if (part.group_push() == 0 || !incoming_->Complete(part.transfer_id())) continue;
      v1::HeldCopy& kept = orphan_copies_[part.transfer_id()];
      kept.set_job(job);
      *kept.mutable_copy() = part;
    }
    for (const v1::ExpectDelivery& held : sequencer_.Held(key)) {
      if (held.group_push() != 0) continue;  // above
      if (!incoming_->Complete(held.transfer_id())) {
        // Still arriving: its source dropped it with the same lost stream.
        // Told to the scheduler all the same: if its push applied, the
        // replica lacks it.
        MLF_LOG(WARNING) << "replica copy " << held.transfer_id() << " of push "
                         << held.source_transfer_id()
                         << " was still arriving when the schedule stream broke; dropped";
        incoming_->Erase(held.transfer_id());
        v1::HeldCopy& lost = lost_copies_[held.transfer_id()];
        lost.set_job(job);
        *lost.mutable_copy() = held;
        lost.set_incomplete(true);
        continue;
      }
      v1::HeldCopy& kept = orphan_copies_[held.transfer_id()];
      kept.set_job(job);
      *kept.mutable_copy() = held;
    }
  }
  if (!orphan_copies_.empty()) {
    MLF_LOG(WARNING) << "keeping " << orphan_copies_.size()
                     << " held replica copy(ies) or group part(s) for the scheduler to decide";
  }
}

size_t Deliveries::ResetLocked() {
  if (snapshots_ != nullptr) snapshots_->ResetLocked();
  const std::vector<uint64_t> pending = sequencer_.Reset();
  unready_parts_.clear();  // their positions went with the old scheduler
  for (uint64_t transfer : pending) incoming_->Erase(transfer);
  return pending.size();
}

void Deliveries::DescribeHeldCopiesLocked(v1::RegisterHostRequest* request) const {
  for (const auto& [copy, held] : orphan_copies_) *request->add_held_copies() = held;
  for (const auto& [copy, lost] : lost_copies_) *request->add_held_copies() = lost;
}

}  // namespace mlfabric::daemon
