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
  while (true) {
    const daemon::DeliverySequencer::Step step = delivery_.Next(key, complete);
    if (step.kind == daemon::DeliverySequencer::Step::kNothing) return;
    const uint64_t transfer_id = step.info.transfer_id();
    if (step.kind == daemon::DeliverySequencer::Step::kSkip) {
      MLF_LOG(INFO) << "skipping update " << transfer_id << " (sequence " << step.sequence
                    << "): " << step.reason;
      incoming_.erase(transfer_id);
      continue;
    }
    auto incoming = incoming_.find(transfer_id);
    if (incoming->second.total != static_cast<uint64_t>(step.info.bytes())) {
      const std::string reason = absl::StrCat("received ", incoming->second.total,
                                              " bytes but the schedule said ", step.info.bytes());
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
    }
    ++stats_.deliveries;
    incoming_.erase(incoming);
    delivery_.Advance(key);
  }
}

// ------------------------------------------------------ synchronous rounds

std::shared_ptr<Daemon::Round> Daemon::RoundLocked(uint32_t job_id, const std::string& server,
                                                   int64_t round) {
  const std::string key = ServerKey(job_id, server);
  auto [it, created] = rounds_.try_emplace({key, round});
  if (!created) return it->second;
  it->second = std::make_shared<Round>();
  it->second->job_id = job_id;
  it->second->server = server;
  it->second->round = round;
  it->second->pool_id = (uint64_t{1} << 61) | next_local_id_++;
  // Keep the last rounds_kept rounds for gets that come late (workers
  // behind, late backup workers); older ones go.
  for (auto old = rounds_.begin(); old != rounds_.end();) {
    if (old->first.first == key && old->first.second <= round - config_.rounds_kept) {
      if (!old->second->reported) {
        FailRoundLocked(old->second, absl::StrCat("round ", round, " began"));
      }
      for (const auto& [member, contributions] : old->second->members) round_of_.erase(member);
      (void)pool_.UnregisterTransfer(old->second->pool_id);
      old = rounds_.erase(old);
    } else {
      ++old;
    }
  }
  return it->second;
}

void Daemon::JoinRoundLocked(const v1::ExpectDelivery& expect) {
  std::shared_ptr<Round> round = RoundLocked(expect.job_id(), expect.server(), expect.version());
  const uint64_t transfer = expect.transfer_id();
  round_of_[transfer] = round;
  round->members[transfer] = expect.contributions();
  if (!round->failed.empty()) {
    reporter_->ReportFailure(transfer, absl::StrCat("round ", round->round, " failed: ", round->failed));
    return;
  }
  const std::optional<aggregator::DType> type = PoolType(expect.dtype());
  if (round->bytes < 0) {
    const size_t element = ElementBytes(expect.dtype());
    if (!type.has_value() || expect.bytes() <= 0 || expect.bytes() % element != 0) {
      FailRoundLocked(round, absl::StrCat("round of ", expect.bytes(), " bytes of ",
                                          v1::DType_Name(expect.dtype()),
                                          " cannot be summed element-wise"));
      return;
    }
    auto sum = SharedBuffer::Create(static_cast<size_t>(expect.bytes()));  // zero-filled
    if (!sum.ok()) {
      FailRoundLocked(round, std::string(sum.status().message()));
      return;
    }
    round->size = expect.round_size();
    round->bytes = expect.bytes();
    round->dtype = expect.dtype();
    round->sum = std::make_shared<SharedBuffer>(std::move(*sum));
    aggregator::AggregationSpec spec;
    spec.dtype = *type;
    spec.bytes = static_cast<uint64_t>(round->bytes);
    spec.packet_bytes = kRoundChunkBytes;
    spec.expected_contributions = static_cast<uint32_t>(std::max(0, round->size));
    round->packets = aggregator::PacketCount(spec);
    if (auto registered = pool_.RegisterTransfer(
            round->pool_id, spec,
            absl::Span<std::byte>(reinterpret_cast<std::byte*>(round->sum->data()),
                                  round->sum->size()));
        !registered.ok()) {
      FailRoundLocked(round, absl::StrCat("round ", round->round, ": ", registered.message()));
      return;
    }
    cv_.notify_all();  // gets waiting for the round to begin
  } else if (expect.round_size() != round->size || expect.bytes() != round->bytes ||
             expect.dtype() != round->dtype) {
    FailRoundLocked(round, absl::StrCat("push ", transfer, " (", expect.bytes(), " bytes of ",
                                        v1::DType_Name(expect.dtype()), ") does not match round ",
                                        round->round, " (", round->bytes, " bytes of ",
                                        v1::DType_Name(round->dtype), ")"));
    return;
  }
  round->contributions += expect.contributions();
  if (expect.contributions() <= 0) {
    FailRoundLocked(round, absl::StrCat("push ", transfer, " stands for ",
                                        expect.contributions(), " contributions"));
    return;
  }
  // The pool refuses more contributions than the round's size.
  if (auto joined = pool_.AddContributor(round->pool_id, transfer, 1.0,
                                         static_cast<uint32_t>(expect.contributions()));
      !joined.ok()) {
    FailRoundLocked(round, absl::StrCat("round ", round->round, " was sent ",
                                        round->contributions, " pushes for ", round->size, ": ",
                                        joined.message()));
    return;
  }
  auto server = servers_.find(ServerKey(expect.job_id(), expect.server()));
  if (server == servers_.end() || server->second.app == nullptr) {
    FailRoundLocked(round, absl::StrCat("server '", expect.server(), "' is not connected to ",
                                        config_.host, "'s daemon"));
    return;
  }
  // Packets that arrived before this announcement are summed now.
  auto incoming = incoming_.find(transfer);
  if (incoming != incoming_.end()) {
    if (incoming->second.total != static_cast<uint64_t>(expect.bytes())) {
      FailRoundLocked(round, absl::StrCat("push ", transfer, " arrived with ",
                                          incoming->second.total, " bytes, not ", expect.bytes()));
      return;
    }
    const auto ranges = std::move(incoming->second.unfolded);
    incoming->second.unfolded.clear();
    const std::shared_ptr<SharedBuffer> buffer = incoming->second.buffer;
    const bool complete = incoming->second.received == incoming->second.total;
    if (complete) incoming_.erase(incoming);
    for (const auto& [offset, length] : ranges) {
      FoldIntoRoundLocked(*round, transfer, buffer->data() + offset, offset, length);
    }
  }
}

void Daemon::FoldIntoRoundLocked(Round& round, uint64_t transfer, const uint8_t* data,
                                 uint64_t offset, uint32_t length) {
  if (!round.failed.empty() || round.complete || round.bytes < 0) return;
  // Summed packet by packet into the round's sum (aggregator::PacketPool);
  // a packet of the grid is final once all `size` pushes covered it. The
  // sum is kept under mu_: a 32 KiB add takes microseconds.
  const size_t ready_before = round.ready.size();
  absl::Status added = pool_.Add(
      round.pool_id, transfer, offset,
      absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(data), length), &round.ready);
  if (!added.ok()) {
    auto self = rounds_.find({ServerKey(round.job_id, round.server), round.round});
    if (self != rounds_.end()) {
      FailRoundLocked(self->second, absl::StrCat("packet [", offset, ", +", length, ") of push ",
                                                 transfer, ": ", added.message()));
    }
    return;
  }
  const bool any_ready = round.ready.size() > ready_before;
  if (!any_ready) return;
  // Workers' gets stream the new chunks at once (Mercury PS).
  for (const auto& stream : round.streams) {
    for (size_t i = ready_before; i < round.ready.size(); ++i) {
      const uint64_t begin = uint64_t{round.ready[i]} * kRoundChunkBytes;
      QueueReplyLocked(*stream, begin,
                       std::min<uint64_t>(begin + kRoundChunkBytes, round.bytes));
    }
  }
  cv_.notify_all();
  if (round.ready.size() == round.packets) {
    round.complete = true;
    auto self = rounds_.find({ServerKey(round.job_id, round.server), round.round});
    if (self != rounds_.end()) DeliverRoundLocked(self->second);
  }
}

void Daemon::DeliverRoundLocked(const std::shared_ptr<Round>& round) {
  auto server = servers_.find(ServerKey(round->job_id, round->server));
  if (server == servers_.end() || server->second.app == nullptr) {
    FailRoundLocked(round, absl::StrCat("server '", round->server, "' is not connected"));
    return;
  }
  // Its own id space: acks for rounds never collide with transfer ids.
  const uint64_t delivery = (uint64_t{1} << 63) | next_local_id_++;
  round_deliveries_[delivery] = round;
  v1::LocalMessage message;
  v1::LocalUpdate* update = message.mutable_update();
  update->set_transfer_id(delivery);
  update->set_worker(absl::StrCat("round of ", round->size));
  update->set_version(round->round);
  update->set_bytes(round->bytes);
  update->set_sequence(static_cast<uint64_t>(round->round) + 1);
  update->set_count(round->size);
  (void)pool_.UnregisterTransfer(round->pool_id);  // summed; the sum stays in round->sum
  absl::Status sent = server->second.app->channel->Send(message, round->sum->fd());
  if (!sent.ok()) {
    round_deliveries_.erase(delivery);
    FailRoundLocked(round, absl::StrCat("cannot hand round ", round->round, " to server '",
                                        round->server, "': ", sent.message()));
    return;
  }
  ++stats_.deliveries;
  ++stats_.rounds;
}

void Daemon::FailRoundLocked(const std::shared_ptr<Round>& round, const std::string& reason) {
  if (!round->failed.empty() || round->reported) return;
  round->failed = reason;
  round->reported = true;
  (void)pool_.UnregisterTransfer(round->pool_id);
  MLF_LOG(WARNING) << "round " << round->round << " of server '" << round->server
                   << "' failed: " << reason;
  for (const auto& [member, contributions] : round->members) {
    reporter_->ReportFailure(member, absl::StrCat("round ", round->round, " failed: ", reason));
  }
  cv_.notify_all();
}

absl::Status Daemon::ServeRoundGet(const std::shared_ptr<tcp::socket>& socket, const PacketHeader& request,
                                   const std::string& server, int64_t round_number) {
  const std::string key = ServerKey(request.job, server);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(config_.round_wait_s));
  std::shared_ptr<Round> round;
  std::string error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto endpoint = servers_.find(key);
    if (endpoint == servers_.end() || endpoint->second.app == nullptr) {
      error = absl::StrCat("server '", server, "' is not connected to ", config_.host,
                           "'s daemon");
    } else {
      // The round begins when its first member is announced; a get may come
      // first (the worker pushed and asked at once).
      // A round rounds_kept or more behind the newest is gone for good.
      auto gone = [&] {
        auto newest = rounds_.lower_bound({key, std::numeric_limits<int64_t>::max()});
        if (newest == rounds_.begin()) return false;
        --newest;
        return newest->first.first == key &&
               newest->first.second - round_number >= config_.rounds_kept;
      };
      const bool begun = cv_.wait_until(lock, deadline, [&] {
        auto it = rounds_.find({key, round_number});
        return stopping_.load() || gone() ||
               (it != rounds_.end() && (it->second->bytes >= 0 || !it->second->failed.empty()));
      });
      auto it = rounds_.find({key, round_number});
      if (stopping_.load()) {
        error = "the daemon is stopping";
      } else if (it == rounds_.end() && gone()) {
        error = absl::StrCat("round ", round_number, " of server '", server,
                             "' is gone: this worker is ", config_.rounds_kept,
                             " or more rounds behind (see --rounds_kept)");
      } else if (!begun || it == rounds_.end()) {
        error = absl::StrCat("round ", round_number, " of server '", server,
                             "' did not begin within ", config_.round_wait_s,
                             " s (see --round_wait_s): did every worker push?");
      } else if (!it->second->failed.empty()) {
        error = absl::StrCat("round ", round_number, " failed: ", it->second->failed);
      } else {
        round = it->second;
      }
    }
  }
  // Reply header as for a model get: offset = bytes; payload = 8-byte
  // version (the round's result is version round + 1) + error text.
  const uint64_t version = static_cast<uint64_t>(round_number + 1);
  std::string payload(8, '\0');
  for (int i = 0; i < 8; ++i) payload[i] = static_cast<char>(version >> (8 * i));
  payload += error;
  PacketHeader reply;
  reply.kind = PacketKind::kGetReply;
  reply.job = request.job;
  reply.transfer = request.transfer;
  reply.offset = round ? static_cast<uint64_t>(round->bytes) : 0;
  RETURN_IF_ERROR(transport::WritePacket(*send_watchdog_, socket->native_handle(), reply, payload.data(), payload.size()));
  if (!round) return absl::OkStatus();
  // The sum streams chunk by chunk as FoldIntoRoundLocked completes them.
  std::shared_ptr<ReplyStream> stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t payload_bytes = static_cast<uint64_t>(config_.payload_bytes);
    size_t packets = 0;
    for (size_t chunk = 0; chunk < round->packets; ++chunk) {
      const uint64_t begin = chunk * kRoundChunkBytes;
      const uint64_t end = std::min<uint64_t>(begin + kRoundChunkBytes, round->bytes);
      packets += (end - begin + payload_bytes - 1) / payload_bytes;
    }
    stream = OpenReplyLocked(socket, request, round->sum, packets);
    for (uint32_t chunk : round->ready) {
      const uint64_t begin = uint64_t{chunk} * kRoundChunkBytes;
      QueueReplyLocked(*stream, begin, std::min<uint64_t>(begin + kRoundChunkBytes, round->bytes));
    }
    round->streams.push_back(stream);
  }
  absl::Status streamed = AwaitReply(
      stream,
      [&] {
        if (!round->failed.empty()) {
          return absl::StrCat("round ", round_number, " failed: ", round->failed);
        }
        return std::string();
      },
      deadline);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& streams = round->streams;
    streams.erase(std::remove(streams.begin(), streams.end(), stream), streams.end());
  }
  if (streamed.ok() || !stream->error.empty()) return streamed;
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
  return transport::WritePacket(*send_watchdog_, socket->native_handle(), abort, reason.data(), reason.size());
}

}  // namespace mlfabric
