#include "daemon/engine/round_service.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "daemon/transport/framing.h"
#include "daemon/transport/get_client.h"

namespace mlfabric::daemon {

using transport::PacketHeader;
using transport::PacketKind;

RoundService::RoundService(Options options, ReceiveLock* lock, const std::atomic<bool>* stopping,
                           IncomingTransfers* incoming, ServerEndpoints* servers,
                           SendScheduler* send, CompletionReporter* reporter,
                           transport::SendWatchdog* watchdog, BufferPool* pool)
    : options_(std::move(options)),
      lock_(lock),
      stopping_(stopping),
      incoming_(incoming),
      servers_(servers),
      send_(send),
      reporter_(reporter),
      watchdog_(watchdog),
      pool_(pool),
      table_(options_.rounds_kept, options_.chunk_bytes, pool),
      routes_(options_.round_tree_fanout, options_.rounds_kept) {}

bool RoundService::IsMemberLocked(uint64_t transfer) const {
  return table_.RoundOf(transfer).has_value();
}

std::optional<uint32_t> RoundService::JobOfLocked(uint64_t transfer) const {
  auto round = table_.RoundOf(transfer);
  if (!round.has_value()) return std::nullopt;
  return static_cast<uint32_t>(std::strtoul(round->first.c_str(), nullptr, 10));  // "job/server"
}

void RoundService::FoldPacketLocked(uint64_t transfer, const uint8_t* data, uint64_t offset,
                                    uint32_t length) {
  RoundTable::Effects fx;
  table_.Fold(transfer, data, offset, length, &fx);
  ApplyLocked(fx);
}

void RoundService::JoinLocked(const v1::ExpectDelivery& expect) {
  const std::string key = ServerKey(expect.job_id(), expect.server());
  RoundTable::Effects fx;
  table_.Join(expect, servers_->AppLocked(key) != nullptr, &fx);
  // Packets that arrived before this announcement are summed now, unless
  // this member's join failed (its bytes are of no use then). Other
  // failures in `fx` are older rounds this one evicted.
  const uint64_t transfer = expect.transfer_id();
  Incoming* incoming = incoming_->Find(transfer);
  const bool joined = std::none_of(fx.failed.begin(), fx.failed.end(),
                                   [&](const auto& failed) { return failed.first == transfer; });
  if (!joined && incoming != nullptr) {
    incoming_->Erase(transfer);
  } else if (incoming != nullptr) {
    if (std::string mismatch = incoming_->JobMismatch(transfer, expect.job_id());
        !mismatch.empty()) {
      incoming_->Erase(transfer);
      table_.Fail(key, expect.version(), mismatch, &fx);
    } else if (incoming->total != static_cast<uint64_t>(expect.bytes())) {
      table_.Fail(key, expect.version(),
                  absl::StrCat("push ", transfer, " arrived with ", incoming->total,
                               " bytes, not ", expect.bytes()),
                  &fx);
      incoming_->Erase(transfer);  // its round failed: its bytes are of no use
    } else {
      const auto ranges = std::move(incoming->unfolded);
      incoming->unfolded.clear();
      const bool complete = incoming->received == incoming->total;
      // The incoming transfer holds the buffer while the ranges are summed.
      // (A same-host member begun without one has no unfolded ranges: its
      // bytes are summed from its push's buffer as they are taken.)
      if (incoming->buffer != nullptr) {
        const uint8_t* data = incoming->buffer->data();
        for (const auto& [offset, length] : ranges) {
          table_.Fold(transfer, data + offset, offset, length, &fx);
        }
      }
      if (complete) incoming_->Recycle(transfer);
    }
  }
  ApplyLocked(fx);
}

void RoundService::FailServerLocked(const std::string& key, const std::string& reason,
                                    bool spare_delivering) {
  RoundTable::Effects fx;
  table_.FailServer(key, reason, &fx, spare_delivering);
  ApplyLocked(fx);
}

void RoundService::FailLocked(const std::string& key, int64_t round, const std::string& reason) {
  RoundTable::Effects fx;
  table_.Fail(key, round, reason, &fx);
  ApplyLocked(fx);
}

void RoundService::ShrinkLocked(const std::string& key, int64_t round, int32_t size,
                                const std::string& reason) {
  RoundTable::Effects fx;
  table_.Shrink(key, round, size, reason, &fx);
  ApplyLocked(fx);
}

bool RoundService::FailMemberLocked(uint64_t transfer, const std::string& reason) {
  RoundTable::Effects fx;
  const bool member = table_.FailMemberRound(transfer, reason, &fx);
  ApplyLocked(fx);
  return member;
}

void RoundService::ApplyLocked(RoundTable::Effects& fx) {
  // Delivering a round can fail it, which yields more effects: until none.
  while (!fx.failed.empty() || !fx.chunks.empty() || !fx.complete.empty() || fx.changed) {
    RoundTable::Effects now = std::move(fx);
    fx = {};
    for (const auto& [member, reason] : now.failed) reporter_->ReportFailure(member, reason);
    // Workers' gets stream the new chunks at once (Mercury PS).
    for (const RoundTable::Chunk& chunk : now.chunks) {
      send_->QueueReply(chunk.stream, chunk.begin, chunk.end,
                        static_cast<uint32_t>(std::max(0, chunk.contributions)));
    }
    for (const auto& [key, round] : now.complete) DeliverLocked(key, round, &fx);
    if (now.changed) {
      lock_->NotifyAll();
      send_->Wake();  // round gets whose round failed (AwaitReply's predicate)
    }
  }
}

void RoundService::DeliverLocked(const std::string& key, int64_t round, RoundTable::Effects* fx) {
  const std::shared_ptr<AppSession> app = servers_->AppLocked(key);
  if (app == nullptr) {
    table_.Fail(key, round, absl::StrCat("server ", key, " is not connected"), fx);
    return;
  }
  const std::optional<RoundTable::Delivery> delivery = table_.BeginDelivery(key, round);
  if (!delivery.has_value()) return;
  v1::LocalMessage message;
  v1::LocalUpdate* update = message.mutable_update();
  update->set_transfer_id(delivery->id);
  update->set_worker(absl::StrCat("round of ", delivery->size));
  update->set_version(delivery->round);
  update->set_bytes(delivery->bytes);
  update->set_sequence(static_cast<uint64_t>(delivery->round) + 1);
  update->set_count(delivery->size);
  absl::Status sent = app->channel->Send(message, delivery->sum->fd());
  if (!sent.ok()) {
    table_.DeliveryFailed(delivery->id,
                          absl::StrCat("cannot hand round ", delivery->round, " to server '",
                                       app->name, "': ", sent.message()),
                          fx);
    return;
  }
  servers_->applied_log().Handed(delivery->id, delivery->members);
  rounds_delivered_.fetch_add(1);
}

std::optional<std::vector<v1::CompletionReport>> RoundService::AcknowledgedLocked(
    const v1::LocalUpdateAck& ack) {
  if (!table_.IsDelivery(ack.transfer_id())) return std::nullopt;
  std::vector<v1::CompletionReport> reports;
  const auto round = table_.Acknowledge(ack.transfer_id());
  if (!round.has_value()) return reports;  // failed meanwhile; already reported
  // A round advances the model by one version, whatever the callback
  // returned: it is the version the workers' gets already saw.
  servers_->RoundAcknowledgedLocked(round->key, ack.transfer_id(), round->members,
                                    round->round + 1, ack.error().empty());
  for (uint64_t member : round->members) {
    v1::CompletionReport& report = reports.emplace_back();
    report.set_host(options_.host);
    report.set_transfer_id(member);
    report.set_applied(ack.error().empty());
    report.set_model_version(round->round + 1);
    if (!ack.error().empty()) {
      report.set_error(absl::StrCat("server refused round ", round->round, ": ", ack.error()));
    }
  }
  return reports;
}

std::string RoundService::AwaitBegunLocked(const std::string& key, const std::string& server,
                                           int64_t round_number,
                                           std::chrono::steady_clock::time_point deadline,
                                           int64_t* bytes) {
  if (servers_->AppLocked(key) == nullptr) {
    return absl::StrCat("server '", server, "' is not connected to ", options_.host,
                        "'s daemon");
  }
  // The round begins when its first member is announced; a get may come
  // first (the worker pushed and asked at once).
  using GetState = RoundTable::GetState;
  GetState state = GetState::kNotYet;
  std::string failure;
  while (true) {
    state = table_.Lookup(key, round_number, &failure, bytes);
    if (stopping_->load() || state != GetState::kNotYet) break;
    if (std::chrono::steady_clock::now() >= deadline) break;
    lock_->WaitUntil(deadline);
  }
  if (stopping_->load()) return "the daemon is stopping";
  switch (state) {
    case GetState::kGone:
      return absl::StrCat("round ", round_number, " of server '", server, "' is gone: this worker is ",
                          options_.rounds_kept, " or more rounds behind (see --rounds_kept)");
    case GetState::kNotYet:
      return absl::StrCat("round ", round_number, " of server '", server, "' did not begin within ",
                          options_.round_wait_s, " s (see --round_wait_s): did every worker push?");
    case GetState::kFailed:
      return absl::StrCat("round ", round_number, " failed: ", failure);
    case GetState::kBegun:
      break;
  }
  return "";
}

absl::Status RoundService::AwaitSum(uint32_t job, const std::string& server, int64_t round_number,
                                    int64_t* version, std::shared_ptr<SharedBuffer>* sum,
                                    uint32_t* contributions) {
  const std::string key = ServerKey(job, server);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(options_.round_wait_s));
  std::shared_ptr<SharedBuffer> complete;
  {
    ReceiveLock::Hold lock(lock_);
    int64_t bytes = -1;
    std::string error = AwaitBegunLocked(key, server, round_number, deadline, &bytes);
    if (!error.empty()) return absl::UnavailableError(error);
    // Complete once every chunk is final; ApplyLocked wakes us per change.
    std::string failure;
    while (true) {
      failure = table_.Failure(key, round_number);
      complete = table_.CompleteSum(key, round_number);
      if (stopping_->load() || !failure.empty() || complete != nullptr) break;
      if (std::chrono::steady_clock::now() >= deadline) break;
      lock_->WaitUntil(deadline);
    }
    if (!failure.empty()) {
      return absl::AbortedError(absl::StrCat("round ", round_number, " failed: ", failure));
    }
    if (stopping_->load()) return absl::CancelledError("the daemon is stopping");
    if (complete == nullptr) {
      return absl::DeadlineExceededError(
          absl::StrCat("round ", round_number, " of server '", server, "' was not complete within ",
                       options_.round_wait_s, " s"));
    }
    if (static_cast<int64_t>(complete->size()) < bytes) {
      return absl::InternalError(absl::StrCat("round ", round_number, "'s sum holds ",
                                              complete->size(), " bytes, not ", bytes));
    }
    // The copy below reads it without the lock: the round keeps it (and
    // our reference keeps it from the pool) until it is evicted.
    *version = round_number + 1;
    if (contributions != nullptr) {
      *contributions = static_cast<uint32_t>(std::max(0, table_.Size(key, round_number)));
    }
    // A buffer an application gave back (AppRequests lends them), else new.
    *sum = pool_ != nullptr ? pool_->Take(static_cast<size_t>(bytes)) : nullptr;
    if (*sum == nullptr) {
      auto copy = SharedBuffer::Create(static_cast<size_t>(bytes));
      if (!copy.ok()) return copy.status();
      *sum = std::make_shared<SharedBuffer>(std::move(*copy));
    }
  }
  std::memcpy((*sum)->data(), complete->data(), (*sum)->size());
  local_gets_.fetch_add(1);
  local_get_bytes_.fetch_add(static_cast<int64_t>((*sum)->size()));
  return absl::OkStatus();
}

std::string RoundService::OpenSumStreamLocked(const std::string& key, int64_t round_number,
                                              uint64_t stream, int fd,
                                              const PacketHeader& request) {
  std::optional<RoundTable::Watch> watch = table_.AddWatcher(key, round_number, stream);
  if (!watch.has_value()) return table_.Failure(key, round_number);
  size_t packets = 0;
  for (const auto& [begin, end] : watch->chunks) {
    packets += (end - begin + options_.payload_bytes - 1) / options_.payload_bytes;
  }
  send_->OpenReply(stream, fd, request, watch->sum, packets);
  const auto contributions = static_cast<uint32_t>(std::max(0, watch->contributions));
  for (const auto& [begin, end] : watch->ready) send_->QueueReply(stream, begin, end, contributions);
  return "";
}

absl::Status RoundService::ServeGet(int fd, const PacketHeader& request,
                                    const v1::DataGetRequest& body, int64_t round_number) {
  const std::string& server = body.server();
  const std::string key = ServerKey(request.job, server);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(options_.round_wait_s));
  std::string error;
  int64_t bytes = -1;
  {
    ReceiveLock::Hold lock(lock_);
    error = AwaitBegunLocked(key, server, round_number, deadline, &bytes);
  }
  // Reply header as for a model get; the round's result is version round + 1.
  v1::DataGetReply reply;
  reply.set_version(round_number + 1);
  reply.set_error(error);
  reply.set_batch(static_cast<uint64_t>(round_number) + 1);
  // The sum reaches later requesters through earlier ones (round_routes.h).
  RoundRoutes::Route route;
  if (error.empty() && bytes >= options_.get_tree_min_bytes && !body.no_relay() &&
      body.requester_host() != options_.host) {
    route = routes_.Join(key, round_number, body.requester_host(), body.requester_address());
  }
  if (!route.via_host.empty()) {
    reply.set_relay_host(route.via_host);
    reply.set_relay_address(route.via_address);
  }
  RETURN_IF_ERROR(
      transport::WriteGetReply(*watchdog_, fd, request, reply, error.empty() ? bytes : 0));
  if (!error.empty()) return absl::OkStatus();
  if (!route.via_host.empty()) {
    MLF_LOG(DEBUG) << "round " << round_number << " of server '" << server << "' for "
                   << body.requester_host() << " goes through " << route.via_host;
    gets_routed_.fetch_add(1);
    return absl::OkStatus();
  }
  // The sum streams chunk by chunk as the table reports them final.
  const uint64_t stream = send_->ReserveReplyId();
  std::string failed_meanwhile;
  {
    ReceiveLock::Hold lock(lock_);  // round effects are applied under it
    failed_meanwhile = OpenSumStreamLocked(key, round_number, stream, fd, request);
  }
  absl::Status streamed =
      failed_meanwhile.empty()
          ? send_->AwaitReply(
                stream,
                [&] {
                  const std::string failure = table_.Failure(key, round_number);
                  if (failure.empty()) return failure;
                  return absl::StrCat("round ", round_number, " failed: ", failure);
                },
                deadline)
          : absl::AbortedError(absl::StrCat("round ", round_number, " failed: ", failed_meanwhile));
  if (failed_meanwhile.empty()) table_.RemoveWatcher(key, round_number, stream);
  // A failed write (Unavailable) ends the session; anything else is told.
  if (streamed.ok() || streamed.code() == absl::StatusCode::kUnavailable) return streamed;
  if (streamed.code() == absl::StatusCode::kDeadlineExceeded) {
    streamed = absl::DeadlineExceededError(
        absl::StrCat("round ", round_number, " of server '", server, "' was not complete within ",
                     options_.round_wait_s, " s"));
  }
  // The round failed or timed out: the worker's daemon is told why.
  PacketHeader abort;
  abort.kind = PacketKind::kAbort;
  abort.job = request.job;
  abort.transfer = request.transfer;
  const std::string reason(streamed.message());
  return transport::WritePacket(*watchdog_, fd, abort, reason.data(), reason.size());
}

}  // namespace mlfabric::daemon
