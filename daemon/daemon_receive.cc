// Daemon: the data plane's receive side, as the DataSessionHandler of its
// sessions (transport/data_session): CRC-checked packets summed into rounds
// and aggregates or reassembled for delivery, and get requests dispatched.
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
#include "daemon/transport/data_session.h"
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
    data_sessions_.insert(socket);
    // Detached: a finished session is reclaimed at once; Stop() shuts the
    // sessions' sockets down and waits until none is left.
    std::thread([this, socket] { DataSessionLoop(socket); }).detach();
  }
}

absl::Status Daemon::AcceptDataLocked(const PacketHeader& header, const uint8_t* dst,
                                      bool* complete) {
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
  *complete = true;
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
  boost::system::error_code ignored;
  const auto peer = socket->remote_endpoint(ignored);
  const std::string peer_name = absl::StrCat(peer.address().to_string(), ":", peer.port());
  MLF_LOG(DEBUG) << "data session from " << peer_name;
  transport::DataSession session(socket->native_handle(), peer_name,
                                 static_cast<uint64_t>(kMaxTransferBytes), &data_keys_);
  session.Run(*this, stopping_);
  std::lock_guard<std::mutex> lock(mu_);
  socket->close(ignored);
  data_sessions_.erase(socket);
  cv_.notify_all();  // Stop() waits for the last session
}

absl::Status Daemon::Begin(const PacketHeader& header) {
  std::shared_ptr<SharedBuffer> pooled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (incoming_.count(header.transfer)) {
      return absl::AlreadyExistsError(absl::StrCat("transfer ", header.transfer, " begun twice"));
    }
    pooled = buffer_pool_.Take(header.offset);
  }
  MLF_LOG(DEBUG) << "transfer " << header.transfer << " of " << header.offset
                 << " bytes: " << (pooled ? "reusing a pooled" : "new") << " receive buffer";
  if (pooled == nullptr) {
    auto buffer = SharedBuffer::Create(header.offset);
    if (!buffer.ok()) return buffer.status();
    pooled = std::make_shared<SharedBuffer>(std::move(*buffer));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (incoming_.count(header.transfer)) {
    return absl::AlreadyExistsError(absl::StrCat("transfer ", header.transfer, " begun twice"));
  }
  // A session may carry only the jobs it proved (transport/data_auth.h);
  // a transfer this host already expects must come as its own job's.
  // (One expected later is checked where it joins: JobMismatchLocked.)
  if (std::optional<uint32_t> expected = ExpectedJobLocked(header.transfer);
      expected.has_value() && *expected != header.job) {
    return absl::PermissionDeniedError(absl::StrCat("transfer ", header.transfer, " is job ",
                                                    *expected, "'s; the packet says job ",
                                                    header.job));
  }
  Incoming& incoming = incoming_[header.transfer];
  incoming.job_id = header.job;
  incoming.total = header.offset;
  incoming.buffer = std::move(pooled);
  return absl::OkStatus();
}

std::optional<uint32_t> Daemon::ExpectedJobLocked(uint64_t transfer) const {
  if (auto round = rounds_.RoundOf(transfer)) {
    return static_cast<uint32_t>(std::strtoul(round->first.c_str(), nullptr, 10));  // "job/server"
  }
  if (auto aggregate = aggregations_.AggregateOf(transfer)) return aggregations_.JobOf(*aggregate);
  const auto endpoints = delivery_.EndpointsExpecting(transfer);
  if (!endpoints.empty()) return endpoints.front().first;
  return std::nullopt;
}

std::string Daemon::JobMismatchLocked(uint64_t transfer, uint32_t job) const {
  auto incoming = incoming_.find(transfer);
  if (incoming == incoming_.end() || incoming->second.job_id == job) return "";
  MLF_LOG(WARNING) << "transfer " << transfer << " arrived as job " << incoming->second.job_id
                   << "'s data but is job " << job << "'s: refused";
  return absl::StrCat("transfer ", transfer, " arrived as job ", incoming->second.job_id,
                      "'s data but is job ", job, "'s");
}

std::shared_ptr<SharedBuffer> Daemon::BufferFor(const PacketHeader& header) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = incoming_.find(header.transfer);
  return it == incoming_.end() ? nullptr : it->second.buffer;
}

absl::Status Daemon::Arrived(const PacketHeader& header, std::shared_ptr<SharedBuffer> buffer,
                             bool* complete) {
  const uint8_t* dst = buffer->data() + header.offset;
  std::lock_guard<std::mutex> lock(mu_);
  // Let go of the buffer first: a buffer is recycled only if nobody else
  // holds it, by the server's acknowledgement (the moment the lock is
  // free) or, for a summed round or aggregate member, inside
  // AcceptDataLocked. While the transfer is in incoming_ it holds the
  // buffer, so `dst` stays valid; once it is not, AcceptDataLocked does
  // not touch `dst`.
  buffer.reset();
  return AcceptDataLocked(header, dst, complete);
}

void Daemon::Authenticated(const std::string& peer, const transport::SessionAuth& auth) {
  MLF_LOG(INFO) << "authenticated the data session of " << auth.initiator << " at " << peer
                << (auth.sealed ? ", payloads encrypted" : "");
}

absl::Status Daemon::GetRequest(int fd, const PacketHeader& header,
                                const v1::DataGetRequest& body) {
  // A distributor's copy (a model batch or a round's sum) forwarded.
  if (body.relay_batch() != 0) return fetcher_->ServeRelay(fd, header, body);
  // offset = round + 1 asks for a synchronous round's sum; 0 = the model
  // (the session checked the range).
  if (header.offset > 0) {
    return ServeRoundGet(fd, header, body, static_cast<int64_t>(header.offset - 1));
  }
  return model_server_->Serve(fd, header, body);
}

void Daemon::Aborted(const PacketHeader& header, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  incoming_.erase(header.transfer);
  reporter_->ReportFailure(header.transfer, absl::StrCat("sender aborted: ", reason));
}

void Daemon::Ended(const std::string& peer, const std::set<uint64_t>& unfinished,
                   const std::string& close_reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!close_reason.empty()) {
    ++stats_.malformed_sessions;
    MLF_LOG(WARNING) << "closing data session from " << peer << ": " << close_reason;
  }
  for (uint64_t transfer : unfinished) {
    if (incoming_.erase(transfer)) {
      reporter_->ReportFailure(transfer,
                               absl::StrCat("data session from ", peer, " ended mid-transfer",
                                            close_reason.empty() ? "" : ": " + close_reason));
    }
  }
}

}  // namespace mlfabric
