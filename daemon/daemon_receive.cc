// Daemon: The data plane's receive side: data sessions, CRC-checked packets summed into rounds and aggregates or reassembled for delivery.
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

// ------------------------------------------------------------ data plane

void Daemon::DataAcceptLoop() {
  while (!stopping_.load()) {
    auto socket = std::make_shared<tcp::socket>(io_);
    boost::system::error_code error;
    data_acceptor_->accept(*socket, error);
    if (error) {
      if (!stopping_.load()) MLF_LOG(ERROR) << "data accept failed: " << error.message();
      return;
    }
    socket->set_option(tcp::no_delay(true), error);
    std::lock_guard<std::mutex> lock(mu_);
    std::thread([this, socket] { DataSessionLoop(socket); }).detach();
  }
}

absl::Status Daemon::AcceptDataLocked(const PacketHeader& header, const uint8_t* dst,
                                      std::set<uint64_t>* begun) {
  stats_.bytes_received += header.length;
  auto it = incoming_.find(header.transfer);
  if (it == incoming_.end()) return absl::OkStatus();  // cancelled meanwhile
  if (it->second.first_packet_s < 0) it->second.first_packet_s = clock_->NowSeconds();
  it->second.received += header.length;
  if (it->second.received > it->second.total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer ", header.transfer, " received more than its ", it->second.total, " bytes"));
  }
  // Mercury PS: a member of a synchronous round is summed packet by
  // packet as it arrives (mercury.md §IV, Key idea 3).
  const bool round_member = rounds_.RoundOf(header.transfer).has_value();
  const std::optional<uint64_t> aggregate =
      round_member ? std::nullopt : aggregations_.AggregateOf(header.transfer);
  if (round_member) {
    daemon::RoundTable::Effects fx;
    rounds_.Fold(header.transfer, dst, header.offset, header.length, &fx);
    ApplyRoundEffectsLocked(fx);
  } else if (aggregate.has_value()) {
    // A constituent of this host's aggregate (§5.2), summed packet by packet.
    const int64_t aggregate_bytes = aggregations_.Bytes(*aggregate).value_or(-1);
    if (it->second.total != static_cast<uint64_t>(aggregate_bytes)) {
      FailAggregationLocked(*aggregate, absl::StrCat("constituent ", header.transfer, " has ",
                                                     it->second.total, " bytes, the aggregate ",
                                                     aggregate_bytes));
      return absl::OkStatus();
    }
    if (!FoldIntoAggregateLocked(*aggregate, header.transfer, dst, header.offset,
                                 header.length)) {
      return absl::OkStatus();
    }
  } else {
    it->second.unfolded.emplace_back(header.offset, header.length);
  }
  if (it->second.received < it->second.total) return absl::OkStatus();
  begun->erase(header.transfer);
  // Machine-readable arrival trace (CLOCK_MONOTONIC, comparable across
  // the daemons of one machine): the preemption test and benchmark
  // read it at --log_level debug.
  MLF_LOG(DEBUG) << "received transfer " << header.transfer << " bytes " << it->second.total
                 << " priority " << header.priority << " first_packet_s "
                 << absl::StrFormat("%.6f", it->second.first_packet_s) << " complete_s "
                 << absl::StrFormat("%.6f", clock_->NowSeconds());
  if (round_member) {  // summed already; nothing to deliver
    RecycleIncomingLocked(it);
    return absl::OkStatus();
  }
  if (FoldLocked(header.transfer)) return absl::OkStatus();
  for (const auto& [job_id, server] : delivery_.EndpointsExpecting(header.transfer)) {
    TryDeliverLocked(job_id, server);
  }
  return absl::OkStatus();
}

void Daemon::RecycleIncomingLocked(std::map<uint64_t, Incoming>::iterator incoming) {
  std::shared_ptr<SharedBuffer> buffer = std::move(incoming->second.buffer);
  incoming_.erase(incoming);
  buffer_pool_.Recycle(std::move(buffer));  // kept only if nobody else holds it
}

void Daemon::DataSessionLoop(std::shared_ptr<tcp::socket> socket) {
  std::set<uint64_t> begun;  // transfers this session announced
  boost::system::error_code ignored;
  const auto peer = socket->remote_endpoint(ignored);
  const std::string peer_name = absl::StrCat(peer.address().to_string(), ":", peer.port());
  MLF_LOG(DEBUG) << "data session from " << peer_name;
  std::string close_reason;
  transport::FrameReader reader(socket->native_handle());
  while (!stopping_.load()) {
    auto header = reader.ReadHeader();
    if (!header.ok()) {
      if (header.status().code() != absl::StatusCode::kUnavailable) {
        close_reason = std::string(header.status().message());
      }
      break;
    }
    if (header->kind == PacketKind::kBegin) {
      if (header->length != 0 || header->offset == 0 ||
          header->offset > static_cast<uint64_t>(kMaxTransferBytes)) {
        close_reason = absl::StrCat("begin of transfer ", header->transfer, " has bad size ",
                                    header->offset);
        break;
      }
      std::shared_ptr<SharedBuffer> pooled;
      {
        std::lock_guard<std::mutex> lock(mu_);
        pooled = buffer_pool_.Take(header->offset);
      }
      MLF_LOG(DEBUG) << "transfer " << header->transfer << " of " << header->offset
                     << " bytes: " << (pooled ? "reusing a pooled" : "new") << " receive buffer";
      if (pooled == nullptr) {
        auto buffer = SharedBuffer::Create(header->offset);
        if (!buffer.ok()) {
          close_reason = std::string(buffer.status().message());
          break;
        }
        pooled = std::make_shared<SharedBuffer>(std::move(*buffer));
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (incoming_.count(header->transfer)) {
        close_reason = absl::StrCat("transfer ", header->transfer, " begun twice");
        break;
      }
      Incoming& incoming = incoming_[header->transfer];
      incoming.job_id = header->job;
      incoming.total = header->offset;
      incoming.buffer = std::move(pooled);
      begun.insert(header->transfer);
      continue;
    }
    if (header->kind == PacketKind::kData) {
      std::shared_ptr<SharedBuffer> buffer;
      uint64_t total = 0;
      bool discard = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = incoming_.find(header->transfer);
        if (!begun.count(header->transfer)) {
          close_reason = absl::StrCat("data for unknown transfer ", header->transfer);
          break;
        }
        if (it == incoming_.end()) {
          // Begun on this session and cancelled since (the scheduler's
          // cancel can overtake packets in flight): skip the payload.
          discard = true;
        } else {
          buffer = it->second.buffer;
          total = it->second.total;
        }
      }
      if (discard) {
        std::vector<uint8_t> skipped(header->length);
        if (auto status = reader.ReadPayload(skipped.data(), skipped.size()); !status.ok()) {
          close_reason = std::string(status.message());
          break;
        }
        continue;
      }
      if (header->offset > total || header->length > total - header->offset) {
        close_reason = absl::StrCat("packet [", header->offset, ", +", header->length,
                                    ") is outside transfer ", header->transfer, " of ", total,
                                    " bytes");
        break;
      }
      // Zero-copy receive: the payload lands in the transfer's shared buffer.
      uint8_t* dst = buffer->data() + header->offset;
      if (auto status = reader.ReadPayload(dst, header->length); !status.ok()) {
        close_reason = std::string(status.message());
        break;
      }
      if (auto status = transport::VerifyPayload(*header, dst); !status.ok()) {
        close_reason = std::string(status.message());
        break;
      }
      absl::Status accepted;
      {
        std::lock_guard<std::mutex> lock(mu_);
        // Let go of the buffer first: a buffer is recycled only if nobody
        // else holds it, by the server's acknowledgement (the moment the
        // lock is free) or, for a summed round or aggregate member, inside
        // AcceptDataLocked. While the transfer is in incoming_ it holds the
        // buffer, so `dst` stays valid; once it is not, AcceptDataLocked
        // does not touch `dst`.
        buffer.reset();
        accepted = AcceptDataLocked(*header, dst, &begun);
      }
      if (!accepted.ok()) {
        close_reason = std::string(accepted.message());
        break;
      }
      continue;
    }
    // Control packets carry small payloads.
    std::string payload(header->length, '\0');
    if (auto status = reader.ReadPayload(payload.data(), payload.size()); !status.ok()) {
      close_reason = std::string(status.message());
      break;
    }
    if (auto status = transport::VerifyPayload(*header, payload.data()); !status.ok()) {
      close_reason = std::string(status.message());
      break;
    }
    if (header->kind == PacketKind::kGetRequest) {
      v1::DataGetRequest body;
      if (!body.ParseFromString(payload) || body.server().empty()) {
        close_reason = "get request: malformed body (no server named)";
        break;
      }
      // A distributor's copy (a model batch or a round's sum) forwarded.
      if (body.relay_batch() != 0) {
        if (auto status = ServeRelayGet(socket, *header, body); !status.ok()) {
          close_reason = std::string(status.message());
          break;
        }
        continue;
      }
      // offset = round + 1 asks for a synchronous round's sum; 0 = the model.
      if (header->offset > 0) {
        if (header->offset > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          close_reason = absl::StrCat("get request names round ", header->offset - 1,
                                      ", out of range");
          break;
        }
        if (auto status = ServeRoundGet(socket, *header, body,
                                        static_cast<int64_t>(header->offset - 1));
            !status.ok()) {
          close_reason = std::string(status.message());
          break;
        }
        continue;
      }
      if (auto status = ServeGetRequest(socket, *header, body); !status.ok()) {
        close_reason = std::string(status.message());
        break;
      }
      continue;
    }
    if (header->kind == PacketKind::kAbort) {
      std::lock_guard<std::mutex> lock(mu_);
      if (begun.erase(header->transfer)) {
        incoming_.erase(header->transfer);
        reporter_->ReportFailure(header->transfer, absl::StrCat("sender aborted: ", payload));
      }
      continue;
    }
    close_reason = absl::StrCat("unexpected packet kind ", static_cast<int>(header->kind));
    break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!close_reason.empty()) {
    ++stats_.malformed_sessions;
    MLF_LOG(WARNING) << "closing data session from " << peer_name << ": " << close_reason;
  }
  for (uint64_t transfer : begun) {
    if (incoming_.erase(transfer)) {
      reporter_->ReportFailure(transfer,
                         absl::StrCat("data session from ", peer_name, " ended mid-transfer",
                                      close_reason.empty() ? "" : ": " + close_reason));
    }
  }
  socket->close(ignored);
}

}  // namespace mlfabric
