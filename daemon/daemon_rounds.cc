// Daemon: In-order delivery to server applications (the delivery sequencer) and Mercury-PS synchronous rounds (mercury.md §IV Key idea 3, mlfabric.md §6).
#include "daemon/daemon.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <cerrno>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <deque>
#include <functional>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "aggregator/reduce.h"
#include "common/crc32c.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "daemon/transport/framing.h"

#include "daemon/daemon_internal.h"

namespace mlfabric {

void Daemon::TryDeliverLocked(uint32_t job_id, const std::string& server) {
  const std::string key = ServerKey(job_id, server);
  auto it = servers_.find(key);
  if (it == servers_.end()) return;
  ServerEndpoint& endpoint = it->second;
  auto complete = [this](uint64_t transfer) {
    auto incoming = incoming_.find(transfer);
    return incoming != incoming_.end() && incoming->second.received >= incoming->second.total;
  };
  // Parts of group pushes (issue 18) held here whose bytes are all in: the
  // scheduler releases them once every shard's part is.
  for (auto part = unready_parts_.begin(); part != unready_parts_.end();) {
    if (part->second != key || !complete(part->first)) {
      ++part;
      continue;
    }
    reporter_->ReportPartReady(part->first);
    part = unready_parts_.erase(part);
  }
  while (true) {
    const daemon::DeliverySequencer::Step step = delivery_.Next(key, complete);
    if (step.kind == daemon::DeliverySequencer::Step::kNothing) return;
    const uint64_t transfer_id = step.info.transfer_id();
    if (step.kind == daemon::DeliverySequencer::Step::kSkip) {
      MLF_LOG(INFO) << "skipping update " << transfer_id << " (sequence " << step.sequence
                    << "): " << step.reason;
      // A held copy kept across the lost stream keeps its bytes for its
      // new announcement.
      if (!orphan_copies_.count(transfer_id)) incoming_.erase(transfer_id);
      unready_parts_.erase(transfer_id);
      continue;
    }
    auto incoming = incoming_.find(transfer_id);
    std::string reason = JobMismatchLocked(transfer_id, job_id);
    if (reason.empty() && incoming->second.total != static_cast<uint64_t>(step.info.bytes())) {
      reason = absl::StrCat("received ", incoming->second.total, " bytes but the schedule said ",
                            step.info.bytes());
    }
    if (!reason.empty()) {
      reporter_->ReportFailure(transfer_id, reason);
      delivery_.Cancel(key, step.sequence, reason);
      continue;
    }
    v1::LocalMessage message;
    v1::LocalUpdate* update = message.mutable_update();
    update->set_transfer_id(transfer_id);
    update->set_worker(step.info.worker());
    update->set_version(step.info.version());
    update->set_norm(step.info.norm());
    update->set_bytes(step.info.bytes());
    update->set_sequence(step.sequence);
    update->set_count(std::max(1, step.info.constituents_size()));
    absl::Status sent = endpoint.app->channel->Send(message, incoming->second.buffer->fd());
    if (!sent.ok()) {
      reporter_->ReportFailure(transfer_id, absl::StrCat("cannot hand the update to server '",
                                                         server, "': ", sent.message()));
    } else {
      awaiting_ack_[transfer_id] = {endpoint.app, incoming->second.buffer};
      // A shard of a server group: the snapshot of the version this update
      // makes, asked right after it, is kept for group gets (model_server.h).
      if (step.info.group_push() != 0 && model_server_) {
        if (const uint64_t id = model_server_->NewHistoryRequest(key); id != 0) {
          v1::LocalMessage ask;
          ask.mutable_model_request()->set_request_id(id);
          (void)endpoint.app->channel->Send(ask);
        }
      }
      if (auto waiting = snapshot_waiters_.find(key); waiting != snapshot_waiters_.end()) {
        // Snapshot requests for the version this update makes go right
        // after it (AskSnapshot's at_version).
        const int64_t handed = HandedVersionLocked(key);
        auto& list = waiting->second;
        for (auto w = list.begin(); w != list.end();) {
          if (w->first > handed) {
            ++w;
            continue;
          }
          v1::LocalMessage ask;
          ask.mutable_model_request()->set_request_id(w->second);
          (void)endpoint.app->channel->Send(ask);
          w = list.erase(w);
        }
        if (list.empty()) snapshot_waiters_.erase(waiting);
      }
      // A restarted scheduler knows a group push, not its parts.
      std::vector<uint64_t> pushes(step.info.constituents().begin(),
                                   step.info.constituents().end());
      if (step.info.group_push() != 0) pushes = {step.info.group_push()};
      // A replica's aggregate of punted copies names pushes its server
      // applied and reported long ago: not this daemon's to report as
      // applied by a server, but as held by the replica (the copy's push,
      // or the aggregate's), so a restarted scheduler copies none twice.
      if (absl::StartsWith(step.info.server(), "replica:")) {
        std::vector<uint64_t> copied = std::move(pushes);
        if (copied.empty() && step.info.source_transfer_id() != 0) {
          copied.push_back(step.info.source_transfer_id());
        }
        if (!copied.empty()) replica_log_.Handed(transfer_id, std::move(copied));
        pushes.clear();
      }
      applied_log_.Handed(transfer_id, std::move(pushes));
    }
    ++stats_.deliveries;
    incoming_.erase(incoming);
    orphan_copies_.erase(transfer_id);
    delivery_.Advance(key);
  }
}

void Daemon::KeepHeldCopiesLocked() {
  for (const auto& [key, endpoint] : servers_) {
    // Parts of group pushes not handed over yet whose bytes are all in: the
    // scheduler may have released the push at other shards just before it
    // went, and they applied it. The restarted scheduler has the part
    // delivered here too if any shard applied its push, dropped if none did.
    // A part still arriving was never released anywhere: dropped.
    for (const v1::ExpectDelivery& part : delivery_.Undelivered(key)) {
      if (part.group_push() == 0) continue;
      auto incoming = incoming_.find(part.transfer_id());
      if (incoming == incoming_.end() || incoming->second.received < incoming->second.total) {
        continue;
      }
      v1::HeldCopy& kept = orphan_copies_[part.transfer_id()];
      kept.set_job(endpoint.app ? endpoint.app->job : "");
      *kept.mutable_copy() = part;
    }
    for (const v1::ExpectDelivery& held : delivery_.Held(key)) {
      if (held.group_push() != 0) continue;  // above
      auto incoming = incoming_.find(held.transfer_id());
      if (incoming == incoming_.end() || incoming->second.received < incoming->second.total) {
        // Still arriving: its source dropped it with the same lost stream.
        // Told to the scheduler all the same: if its push applied, the
        // replica lacks it.
        MLF_LOG(WARNING) << "replica copy " << held.transfer_id() << " of push "
                         << held.source_transfer_id()
                         << " was still arriving when the schedule stream broke; dropped";
        if (incoming != incoming_.end()) incoming_.erase(incoming);
        v1::HeldCopy& lost = lost_copies_[held.transfer_id()];
        lost.set_job(endpoint.app ? endpoint.app->job : "");
        *lost.mutable_copy() = held;
        lost.set_incomplete(true);
        continue;
      }
      v1::HeldCopy& kept = orphan_copies_[held.transfer_id()];
      kept.set_job(endpoint.app ? endpoint.app->job : "");
      *kept.mutable_copy() = held;
    }
  }
  if (!orphan_copies_.empty()) {
    MLF_LOG(WARNING) << "keeping " << orphan_copies_.size()
                     << " held replica copy(ies) or group part(s) for the scheduler to decide";
  }
}

// ------------------------------------------------------ synchronous rounds

void Daemon::JoinRoundLocked(const v1::ExpectDelivery& expect) {
  const std::string key = ServerKey(expect.job_id(), expect.server());
  auto server = servers_.find(key);
  const bool connected = server != servers_.end() && server->second.app != nullptr;
  daemon::RoundTable::Effects fx;
  rounds_.Join(expect, connected, &fx);
  // Packets that arrived before this announcement are summed now.
  const uint64_t transfer = expect.transfer_id();
  auto incoming = incoming_.find(transfer);
  if (fx.failed.empty() && incoming != incoming_.end()) {
    if (std::string mismatch = JobMismatchLocked(transfer, expect.job_id()); !mismatch.empty()) {
      incoming_.erase(incoming);
      rounds_.Fail(key, expect.version(), mismatch, &fx);
    } else if (incoming->second.total != static_cast<uint64_t>(expect.bytes())) {
      rounds_.Fail(key, expect.version(),
                   absl::StrCat("push ", transfer, " arrived with ", incoming->second.total,
                                " bytes, not ", expect.bytes()),
                   &fx);
    } else {
      const auto ranges = std::move(incoming->second.unfolded);
      incoming->second.unfolded.clear();
      // incoming_ holds the buffer while the ranges are summed.
      const uint8_t* data = incoming->second.buffer->data();
      const bool complete = incoming->second.received == incoming->second.total;
      for (const auto& [offset, length] : ranges) {
        rounds_.Fold(transfer, data + offset, offset, length, &fx);
      }
      if (complete) RecycleIncomingLocked(incoming);
    }
  }
  ApplyRoundEffectsLocked(fx);
}

void Daemon::ApplyRoundEffectsLocked(daemon::RoundTable::Effects& fx) {
  // Delivering a round can fail it, which yields more effects: until none.
  while (!fx.failed.empty() || !fx.chunks.empty() || !fx.complete.empty() || fx.changed) {
    daemon::RoundTable::Effects now = std::move(fx);
    fx = {};
    for (const auto& [member, reason] : now.failed) reporter_->ReportFailure(member, reason);
    // Workers' gets stream the new chunks at once (Mercury PS).
    for (const daemon::RoundTable::Chunk& chunk : now.chunks) {
      send_->QueueReply(chunk.stream, chunk.begin, chunk.end);
    }
    for (const auto& [key, round] : now.complete) DeliverRoundLocked(key, round, &fx);
    if (now.changed) {
      cv_.notify_all();
      send_->Wake();  // round gets whose round failed (AwaitReply's predicate)
    }
  }
}

void Daemon::DeliverRoundLocked(const std::string& key, int64_t round,
                                daemon::RoundTable::Effects* fx) {
  auto server = servers_.find(key);
  if (server == servers_.end() || server->second.app == nullptr) {
    rounds_.Fail(key, round, absl::StrCat("server ", key, " is not connected"), fx);
    return;
  }
  const std::optional<daemon::RoundTable::Delivery> delivery = rounds_.BeginDelivery(key, round);
  if (!delivery.has_value()) return;
  v1::LocalMessage message;
  v1::LocalUpdate* update = message.mutable_update();
  update->set_transfer_id(delivery->id);
  update->set_worker(absl::StrCat("round of ", delivery->size));
  update->set_version(delivery->round);
  update->set_bytes(delivery->bytes);
  update->set_sequence(static_cast<uint64_t>(delivery->round) + 1);
  update->set_count(delivery->size);
  absl::Status sent = server->second.app->channel->Send(message, delivery->sum->fd());
  if (!sent.ok()) {
    rounds_.DeliveryFailed(delivery->id,
                           absl::StrCat("cannot hand round ", delivery->round, " to server '",
                                        server->second.app->name, "': ", sent.message()),
                           fx);
    return;
  }
  applied_log_.Handed(delivery->id, delivery->members);
  ++stats_.deliveries;
  ++stats_.rounds;
}

absl::Status Daemon::ServeRoundGet(int fd, const PacketHeader& request,
                                   const v1::DataGetRequest& body, int64_t round_number) {
  const std::string& server = body.server();
  const std::string key = ServerKey(request.job, server);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(config_.round_wait_s));
  std::string error;
  int64_t bytes = -1;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto endpoint = servers_.find(key);
    if (endpoint == servers_.end() || endpoint->second.app == nullptr) {
      error = absl::StrCat("server '", server, "' is not connected to ", config_.host,
                           "'s daemon");
    } else {
      // The round begins when its first member is announced; a get may come
      // first (the worker pushed and asked at once).
      using GetState = daemon::RoundTable::GetState;
      GetState state = GetState::kNotYet;
      std::string failure;
      cv_.wait_until(lock, deadline, [&] {
        state = rounds_.Lookup(key, round_number, &failure, &bytes);
        return stopping_.load() || state != GetState::kNotYet;
      });
      if (stopping_.load()) {
        error = "the daemon is stopping";
      } else if (state == GetState::kGone) {
        error = absl::StrCat("round ", round_number, " of server '", server,
                             "' is gone: this worker is ", config_.rounds_kept,
                             " or more rounds behind (see --rounds_kept)");
      } else if (state == GetState::kNotYet) {
        error = absl::StrCat("round ", round_number, " of server '", server,
                             "' did not begin within ", config_.round_wait_s,
                             " s (see --round_wait_s): did every worker push?");
      } else if (state == GetState::kFailed) {
        error = absl::StrCat("round ", round_number, " failed: ", failure);
      }
    }
  }
  // Reply header as for a model get; the round's result is version round + 1.
  v1::DataGetReply reply;
  reply.set_version(round_number + 1);
  reply.set_error(error);
  reply.set_batch(static_cast<uint64_t>(round_number) + 1);
  // The sum reaches later requesters through earlier ones (round_routes.h).
  daemon::RoundRoutes::Route route;
  if (error.empty() && bytes >= config_.get_tree_min_bytes && !body.no_relay() &&
      body.requester_host() != config_.host) {
    route = round_routes_.Join(key, round_number, body.requester_host(),
                               body.requester_address());
  }
  if (!route.via_host.empty()) {
    reply.set_relay_host(route.via_host);
    reply.set_relay_address(route.via_address);
  }
  RETURN_IF_ERROR(transport::WriteGetReply(*send_watchdog_, fd, request, reply, error.empty() ? bytes : 0));
  if (!error.empty()) return absl::OkStatus();
  if (!route.via_host.empty()) {
    MLF_LOG(DEBUG) << "round " << round_number << " of server '" << server << "' for "
                   << body.requester_host() << " goes through " << route.via_host;
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.gets_routed;
    return absl::OkStatus();
  }
  // The sum streams chunk by chunk as the table reports them final.
  const uint64_t stream = send_->ReserveReplyId();
  std::string failed_meanwhile;
  {
    std::lock_guard<std::mutex> lock(mu_);  // round effects are applied under it
    std::optional<daemon::RoundTable::Watch> watch =
        rounds_.AddWatcher(key, round_number, stream);
    if (!watch.has_value()) {
      failed_meanwhile = rounds_.Failure(key, round_number);
    } else {
      const uint64_t payload_bytes = static_cast<uint64_t>(config_.payload_bytes);
      size_t packets = 0;
      for (const auto& [begin, end] : watch->chunks) {
        packets += (end - begin + payload_bytes - 1) / payload_bytes;
      }
      send_->OpenReply(stream, fd, request, watch->sum, packets);
      for (const auto& [begin, end] : watch->ready) send_->QueueReply(stream, begin, end);
    }
  }
  absl::Status streamed =
      failed_meanwhile.empty()
          ? send_->AwaitReply(
                stream,
                [&] {
                  const std::string failure = rounds_.Failure(key, round_number);
                  if (failure.empty()) return failure;
                  return absl::StrCat("round ", round_number, " failed: ", failure);
                },
                deadline)
          : absl::AbortedError(absl::StrCat("round ", round_number, " failed: ", failed_meanwhile));
  if (failed_meanwhile.empty()) rounds_.RemoveWatcher(key, round_number, stream);
  // A failed write (Unavailable) ends the session; anything else is told.
  if (streamed.ok() || streamed.code() == absl::StatusCode::kUnavailable) return streamed;
  if (streamed.code() == absl::StatusCode::kDeadlineExceeded) {
    streamed = absl::DeadlineExceededError(
        absl::StrCat("round ", round_number, " of server '", server, "' was not complete within ",
                     config_.round_wait_s, " s"));
  }
  // The round failed or timed out: the worker's daemon is told why.
  PacketHeader abort;
  abort.kind = PacketKind::kAbort;
  abort.job = request.job;
  abort.transfer = request.transfer;
  const std::string reason(streamed.message());
  return transport::WritePacket(*send_watchdog_, fd, abort, reason.data(), reason.size());
}

}  // namespace mlfabric
