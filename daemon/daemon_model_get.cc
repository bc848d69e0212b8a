// Daemon: Model gets: reply streams through the priority packet queue, serving gets and round gets, and fetching a model from a server's daemon.
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

bool Daemon::ConsumeUnscheduled(uint32_t bytes, double now, double* next_s) {
  std::lock_guard<std::mutex> lock(unscheduled_mu_);
  if (!unscheduled_budget_.has_value()) return true;
  if (unscheduled_budget_->TryConsume(bytes, now)) return true;
  *next_s = unscheduled_budget_->NextSendTime(bytes, now);
  return false;
}

std::shared_ptr<Daemon::ReplyStream> Daemon::OpenReplyLocked(
    const std::shared_ptr<tcp::socket>& socket, const PacketHeader& request,
    std::shared_ptr<SharedBuffer> buffer, size_t total_packets) {
  auto stream = std::make_shared<ReplyStream>();
  stream->id = (uint64_t{1} << 62) | next_local_id_++;
  stream->socket = socket;
  stream->job_id = request.job;
  stream->request = request.transfer;
  stream->priority = request.priority;
  stream->buffer = std::move(buffer);
  stream->total_packets = total_packets;
  if (!packet_queue_.policy().HasJob(request.job)) {
    (void)packet_queue_.AddJob(request.job, static_cast<double>(request.job));
  }
  replies_[stream->id] = stream;
  return stream;
}

void Daemon::QueueReplyLocked(ReplyStream& stream, uint64_t begin, uint64_t end) {
  daemon::TensorRef ref;
  ref.job_id = stream.job_id;
  ref.transfer_id = stream.id;
  ref.tensor_priority = stream.priority;
  auto split = daemon::SplitTensor(
      ref,
      absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(stream.buffer->data() + begin),
                                  end - begin),
      static_cast<uint32_t>(config_.payload_bytes));
  if (!split.ok()) {  // cannot happen for a non-empty range; fail the stream, not the daemon
    stream.error = absl::StrCat("cannot packetise the reply: ", split.status().message());
    cv_.notify_all();
    return;
  }
  for (const daemon::PacketDescriptor& packet : *split) {
    (void)packet_queue_.Push(packet);  // the job was registered when the stream opened
    ++stream.queued;
  }
  cv_.notify_all();  // the sender loop
}

absl::Status Daemon::AwaitReply(const std::shared_ptr<ReplyStream>& stream,
                                const std::function<std::string()>& failed,
                                std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  std::string why;
  const bool ended = cv_.wait_until(lock, deadline, [&] {
    if (stream->sent == stream->total_packets || !stream->error.empty() || stopping_.load()) {
      return true;
    }
    why = failed();
    return !why.empty();
  });
  // Nothing more of it goes out; a packet being written is finished first,
  // so the caller may write to the socket again.
  packet_queue_.RemoveTransfer(stream->id);
  replies_.erase(stream->id);
  cv_.wait(lock, [&] { return !stream->writing; });
  if (!stream->error.empty()) return absl::UnavailableError(stream->error);
  if (stream->sent == stream->total_packets) return absl::OkStatus();
  if (stopping_.load()) return absl::UnavailableError("the daemon is stopping");
  if (!why.empty()) return absl::AbortedError(why);
  if (!ended) return absl::DeadlineExceededError("the reply was not complete in time");
  return absl::OkStatus();
}

absl::Status Daemon::ServeGetRequest(const std::shared_ptr<tcp::socket>& socket,
                                     const PacketHeader& request,
                                     const std::string& server) {
  const std::string key = ServerKey(request.job, server);
  std::string error;
  std::shared_ptr<SharedBuffer> model;
  int64_t version = 0;
  std::optional<daemon::GetBatcher::Ticket> ticket;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto connected = [&] {
      auto found = servers_.find(key);
      return found != servers_.end() && found->second.app != nullptr;
    };
    // The scheduler resolves a server as soon as it registered there, which
    // is a moment before its daemon records the application (after the
    // RegisterEntity reply): a get arriving in between waits briefly
    // instead of failing.
    cv_.wait_for(lock, std::chrono::duration<double>(internal::kServerConnectWaitS),
                 [&] { return connected() || stopping_.load(); });
    if (!connected()) {
      error = absl::StrCat("server '", server, "' is not connected to ", config_.host,
                           "'s daemon");
    } else {
      // One snapshot per batch of gets (§10.3, daemon/engine/get_batcher.h).
      ticket = gets_.Join(key);
      MLF_LOG(DEBUG) << "get " << request.transfer << " of server '" << server
                     << "' joins model batch " << ticket->batch
                     << (ticket->ask ? " (takes its snapshot)" : "");
      if (ticket->ask) {
        // The previous batch's replies leave first; gets arriving meanwhile
        // join this batch.
        cv_.wait_for(lock, std::chrono::duration<double>(config_.get_batch_wait_s), [&] {
          return gets_.MayAsk(ticket->batch) || stopping_.load();
        });
        auto it = servers_.find(key);
        if (gets_.Result(ticket->batch).has_value()) {
          // Ended meanwhile (the server went away).
        } else if (it == servers_.end() || it->second.app == nullptr) {
          gets_.FailKey(key, absl::StrCat("server '", server, "' disconnected"));
        } else {
          v1::LocalMessage ask;
          ask.mutable_model_request()->set_request_id(ticket->batch);
          auto app = it->second.app;
          lock.unlock();
          absl::Status sent = app->channel->Send(ask);
          lock.lock();
          if (!sent.ok()) {
            gets_.Answer(ticket->batch,
                         {0, nullptr,
                          absl::StrCat("cannot reach server '", server, "': ", sent.message())});
            cv_.notify_all();
          }
        }
      }
      if (!cv_.wait_for(lock, std::chrono::duration<double>(config_.get_timeout_s), [&] {
            return gets_.Result(ticket->batch).has_value() || stopping_.load();
          })) {
        // The whole batch gives up together.
        gets_.Answer(ticket->batch, {0, nullptr,
                                     absl::StrCat("server '", server, "' did not answer within ",
                                                  config_.get_timeout_s, " s")});
        cv_.notify_all();
      }
      if (std::optional<daemon::GetBatcher::Snapshot> snapshot = gets_.Result(ticket->batch)) {
        error = snapshot->error;
        version = snapshot->version;
        model = snapshot->model;
      } else {
        error = "the daemon is stopping";
      }
    }
  }
  // However the reply ends, this get has left its batch (the next batch may
  // take its snapshot once every get of this one has).
  auto leave = [&] {
    if (!ticket.has_value()) return;
    std::lock_guard<std::mutex> lock(mu_);
    gets_.Leave(ticket->batch);
    cv_.notify_all();
  };
  // Reply header: offset = model bytes; payload = 8-byte version + error text.
  std::string payload(8, '\0');
  for (int i = 0; i < 8; ++i) payload[i] = static_cast<char>(static_cast<uint64_t>(version) >> (8 * i));
  payload += error;
  PacketHeader reply;
  reply.kind = PacketKind::kGetReply;
  reply.job = request.job;
  reply.transfer = request.transfer;
  reply.offset = error.empty() && model ? model->size() : 0;
  if (auto status =
          transport::WritePacket(*send_watchdog_, socket->native_handle(), reply, payload.data(), payload.size());
      !status.ok()) {
    leave();
    return status;
  }
  if (!error.empty() || !model || model->size() == 0) {
    leave();
    return absl::OkStatus();
  }
  // The model's packets go out through the priority queue (ReplyStream).
  std::shared_ptr<ReplyStream> stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t payload_bytes = static_cast<size_t>(config_.payload_bytes);
    stream = OpenReplyLocked(socket, request, model,
                             (model->size() + payload_bytes - 1) / payload_bytes);
    QueueReplyLocked(*stream, 0, model->size());
  }
  absl::Status streamed = AwaitReply(
      stream, [] { return std::string(); }, std::chrono::steady_clock::time_point::max());
  leave();
  return streamed;
}

absl::Status Daemon::FetchModel(const std::string& job, const std::string& server,
                                int64_t* version, std::shared_ptr<SharedBuffer>* model,
                                int64_t round, uint32_t priority) {
  v1::ResolveServerRequest resolve;
  resolve.set_job(job);
  resolve.set_server(server);
  v1::ResolveServerReply where;
  absl::Status status = scheduler_->ResolveServer(resolve, &where);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("get: ", daemon::RpcErrorText(status)));
  }
  auto endpoint = transport::ParseEndpoint(where.data_address());
  if (!endpoint.ok()) return endpoint.status();
  // A connection left by an earlier get to that daemon is reused (its
  // session there is waiting for the next request); a new one otherwise.
  std::unique_ptr<tcp::socket> connection;
  {
    std::lock_guard<std::mutex> lock(idle_gets_mu_);
    auto idle = idle_get_connections_.find(where.data_address());
    if (idle != idle_get_connections_.end()) {
      connection = std::move(idle->second);
      idle_get_connections_.erase(idle);
    }
  }
  const bool reused = connection != nullptr;
  auto connect = [&]() -> absl::Status {
    connection = std::make_unique<tcp::socket>(io_);
    boost::system::error_code error;
    connection->connect(*endpoint, error);
    if (error) {
      return absl::UnavailableError(absl::StrCat("get: cannot reach ", where.host(), " at ",
                                                 where.data_address(), ": ", error.message()));
    }
    connection->set_option(tcp::no_delay(true), error);
    return absl::OkStatus();
  };
  if (!reused) RETURN_IF_ERROR(connect());
  PacketHeader request;
  request.kind = PacketKind::kGetRequest;
  request.job = where.job_id();
  request.priority = static_cast<uint16_t>(std::min<uint32_t>(priority, 65535));
  // A synchronous-round server answers a worker that pushed round r with
  // that round's sum, streamed as its chunks complete (Mercury PS).
  if (where.round_size() > 0 && round >= 0) request.offset = static_cast<uint64_t>(round) + 1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.transfer = next_local_id_++;
  }
  absl::Status sent =
      transport::WritePacket(*send_watchdog_, connection->native_handle(), request, server.data(), server.size());
  std::optional<transport::FrameReader> reader;
  absl::StatusOr<PacketHeader> reply = absl::UnavailableError("not sent");
  if (sent.ok()) {
    reader.emplace(connection->native_handle());
    reply = reader->ReadHeader();
  }
  if (reused && (!sent.ok() || !reply.ok())) {
    // The far end had closed the kept connection (its daemon restarted):
    // once more on a new one.
    RETURN_IF_ERROR(connect());
    sent = transport::WritePacket(*send_watchdog_, connection->native_handle(), request, server.data(),
                       server.size());
    if (sent.ok()) {
      reader.emplace(connection->native_handle());
      reply = reader->ReadHeader();
    }
  }
  if (!sent.ok()) return sent;
  if (!reply.ok()) return absl::UnavailableError(absl::StrCat("get: ", reply.status().message()));
  if (reply->kind != PacketKind::kGetReply || reply->transfer != request.transfer ||
      reply->length < 8) {
    return absl::DataLossError("get: malformed reply from the server's daemon");
  }
  std::string payload(reply->length, '\0');
  if (auto read = reader->ReadPayload(payload.data(), payload.size()); !read.ok()) return read;
  if (auto crc = transport::VerifyPayload(*reply, payload.data()); !crc.ok()) return crc;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(payload[i])) << (8 * i);
  if (payload.size() > 8) return absl::UnavailableError(payload.substr(8));
  if (reply->offset > static_cast<uint64_t>(kMaxTransferBytes)) {
    return absl::DataLossError("get: model size out of range");
  }
  auto buffer = SharedBuffer::Create(reply->offset);
  if (!buffer.ok()) return buffer.status();
  uint64_t received = 0;
  while (received < reply->offset) {
    auto data = reader->ReadHeader();
    if (!data.ok()) {
      return absl::UnavailableError(absl::StrCat("get: model transfer cut: ", data.status().message()));
    }
    if (data->kind == PacketKind::kAbort && data->length <= transport::kMaxControlBytes) {
      std::string reason(data->length, '\0');
      if (auto read = reader->ReadPayload(reason.data(), reason.size()); !read.ok()) return read;
      return absl::AbortedError(reason);
    }
    if (data->kind != PacketKind::kData || data->offset > reply->offset ||
        data->length > reply->offset - data->offset) {
      return absl::DataLossError("get: malformed model packet");
    }
    uint8_t* dst = buffer->data() + data->offset;
    if (auto read = reader->ReadPayload(dst, data->length); !read.ok()) return read;
    if (auto crc = transport::VerifyPayload(*data, dst); !crc.ok()) return crc;
    received += data->length;
  }
  *version = static_cast<int64_t>(v);
  *model = std::make_shared<SharedBuffer>(std::move(*buffer));
  {
    std::lock_guard<std::mutex> lock(idle_gets_mu_);
    if (idle_get_connections_.count(where.data_address()) < kMaxIdleGetConnections) {
      idle_get_connections_.emplace(where.data_address(), std::move(connection));
    }
  }
  return absl::OkStatus();
}

}  // namespace mlfabric
