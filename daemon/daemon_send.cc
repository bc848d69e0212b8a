// Daemon: The send side: scheduled transfers released at their start and paced, in-network aggregation (§5.2), the sender loop and peer connections.
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

void Daemon::ScheduleSendLocked(const v1::SendTransfer& send) {
  // A replica copy (§5.3) sends the bytes of another push of this host.
  const uint64_t source = send.source_transfer_id() != 0 ? send.source_transfer_id()
                                                         : send.transfer_id();
  auto push = pushes_.find(source);
  // A member of an aggregation on this host (the scheduler sends the task
  // first) is summed here; anything else for this host (a push to a server
  // on it) goes through the data plane like any transfer.
  if (push != pushes_.end() && send.dst_host() == config_.host &&
      aggregations_.AggregateOf(send.transfer_id()).has_value()) {
    AcceptLocalLocked(send, push->second.buffer);
    return;
  }
  if (push != pushes_.end()) {
    ScheduleOutgoingLocked(send, push->second.buffer, push->second.tensors,
                           push->second.checksums);
    return;
  }
  auto held = replica_holds_.find(source);
  if (held != replica_holds_.end() && send.source_transfer_id() != 0) {
    ScheduleOutgoingLocked(send, held->second.buffer, held->second.tensors,
                           held->second.checksums);
    replica_holds_.erase(held);  // the outgoing transfer keeps the bytes alive
    return;
  }
  reporter_->ReportFailure(send.transfer_id(),
                     absl::StrCat("no pushed data on ", config_.host, " for push ", source));
}

void Daemon::AcceptLocalLocked(const v1::SendTransfer& send,
                               std::shared_ptr<SharedBuffer> buffer) {
  if (static_cast<int64_t>(buffer->size()) != send.bytes()) {
    reporter_->ReportFailure(send.transfer_id(), absl::StrCat("schedule says ", send.bytes(),
                                                              " bytes, the data has ",
                                                              buffer->size()));
    return;
  }
  // As if it had arrived whole.
  Incoming& incoming = incoming_[send.transfer_id()];
  incoming.job_id = send.job_id();
  incoming.total = incoming.received = buffer->size();
  incoming.buffer = buffer;
  const uint64_t grid = static_cast<uint64_t>(config_.payload_bytes);
  std::vector<std::pair<uint64_t, uint32_t>> ranges;
  for (uint64_t offset = 0; offset < buffer->size(); offset += grid) {
    ranges.emplace_back(offset, static_cast<uint32_t>(std::min<uint64_t>(grid, buffer->size() - offset)));
  }
  const std::optional<uint64_t> aggregate = aggregations_.AggregateOf(send.transfer_id());
  if (!aggregate.has_value()) {
    incoming.unfolded = std::move(ranges);
    return;
  }
  for (const auto& [offset, length] : ranges) {
    if (!FoldIntoAggregateLocked(*aggregate, send.transfer_id(), buffer->data() + offset, offset,
                                 length)) {
      return;
    }
  }
  FoldLocked(send.transfer_id());
}

void Daemon::ScheduleOutgoingLocked(const v1::SendTransfer& send,
                                    std::shared_ptr<SharedBuffer> buffer,
                                    std::vector<v1::TensorInfo> tensors,
                                    std::shared_ptr<const daemon::PacketChecksums> checksums) {
  if (static_cast<int64_t>(buffer->size()) != send.bytes()) {
    reporter_->ReportFailure(send.transfer_id(), absl::StrCat("schedule says ", send.bytes(),
                                                        " bytes, the data has ", buffer->size()));
    return;
  }
  std::vector<daemon::RateSegment> segments;
  for (const auto& segment : send.segments()) {
    segments.push_back({segment.from_s(), segment.to_s(), segment.rate_bps()});
  }
  if (segments.empty()) {
    // An unpaced transfer: everything may go from its start time on.
    segments.push_back({send.start_s(), send.start_s() + 1e-3, 1e13});
  }
  daemon::PacerOptions options;
  options.burst_bytes = 2.0 * static_cast<double>(config_.payload_bytes);
  auto pacer = daemon::TransferPacer::Create(std::move(segments), clock_offset_s_, options);
  if (!pacer.ok()) {
    reporter_->ReportFailure(send.transfer_id(),
                       absl::StrCat("unusable rate segments: ", pacer.status().message()));
    return;
  }
  Outgoing& outgoing = outgoing_[send.transfer_id()];
  outgoing.send = send;
  outgoing.buffer = std::move(buffer);
  outgoing.tensors = std::move(tensors);
  outgoing.checksums = std::move(checksums);
  outgoing.pacer.emplace(std::move(*pacer));
  release_at_.emplace(outgoing.pacer->start_local_s(), send.transfer_id());
  cv_.notify_all();
}

void Daemon::StartAggregationLocked(const v1::AggregateTask& task) {
  // Packet by packet (§5.2 with Mercury's immediate aggregation): each
  // constituent's packets are summed as they arrive, and a packet of the
  // aggregate leaves as soon as every constituent covered it and the
  // aggregate's scheduled start has come.
  absl::StatusOr<std::shared_ptr<SharedBuffer>> buffer = aggregations_.Start(task);
  if (!buffer.ok()) {
    reporter_->ReportFailure(task.aggregate_id(), std::string(buffer.status().message()));
    return;
  }
  v1::SendTransfer send;
  send.set_transfer_id(task.aggregate_id());
  send.set_job_id(task.job_id());
  send.set_dst_host(task.dst_host());
  send.set_dst_address(task.dst_address());
  send.set_start_s(task.start_s());
  *send.mutable_segments() = task.segments();
  send.set_bytes(task.bytes());
  ScheduleOutgoingLocked(send, *buffer, {});
  auto outgoing = outgoing_.find(task.aggregate_id());
  if (outgoing == outgoing_.end()) {  // refused (reported)
    (void)aggregations_.Remove(task.aggregate_id());
    return;
  }
  outgoing->second.gated = true;
  // Constituents may have (partly) arrived before the task did.
  for (int i = 0; i < task.constituents_size(); ++i) {
    const uint64_t constituent = task.constituents(i);
    auto incoming = incoming_.find(constituent);
    if (incoming == incoming_.end()) continue;
    if (incoming->second.total != static_cast<uint64_t>(task.bytes())) {
      FailAggregationLocked(task.aggregate_id(),
                            absl::StrCat("constituent ", constituent, " has ",
                                         incoming->second.total, " bytes, the aggregate ",
                                         task.bytes()));
      return;
    }
    const auto ranges = std::move(incoming->second.unfolded);
    incoming->second.unfolded.clear();
    const std::shared_ptr<SharedBuffer> data = incoming->second.buffer;
    const bool complete = incoming->second.received == incoming->second.total;
    for (const auto& [offset, length] : ranges) {
      if (!FoldIntoAggregateLocked(task.aggregate_id(), constituent, data->data() + offset,
                                   offset, length)) {
        return;
      }
    }
    if (complete) FoldLocked(constituent);
  }
}

bool Daemon::FoldIntoAggregateLocked(uint64_t aggregate_id, uint64_t transfer,
                                     const uint8_t* data, uint64_t offset, uint32_t length) {
  std::vector<uint32_t> ready;
  absl::Status added = aggregations_.Fold(aggregate_id, transfer, data, offset, length, &ready);
  if (!added.ok()) {
    FailAggregationLocked(aggregate_id, std::string(added.message()));
    return false;
  }
  auto outgoing = outgoing_.find(aggregate_id);
  if (outgoing != outgoing_.end() && outgoing->second.released) {
    for (uint32_t index : ready) QueueAggregatePacketLocked(outgoing->second, index);
  }
  return true;
}

void Daemon::QueueAggregatePacketLocked(Outgoing& outgoing, uint32_t index) {
  const uint64_t grid = static_cast<uint64_t>(config_.payload_bytes);
  const uint64_t offset = uint64_t{index} * grid;
  daemon::PacketDescriptor packet;
  packet.job_id = outgoing.send.job_id();
  packet.transfer_id = outgoing.send.transfer_id();
  packet.offset_bytes = offset;
  packet.length_bytes = static_cast<uint32_t>(std::min<uint64_t>(grid, outgoing.buffer->size() - offset));
  packet.payload = reinterpret_cast<const std::byte*>(outgoing.buffer->data() + offset);
  (void)packet_queue_.Push(packet);  // the job is registered at release
  cv_.notify_all();
}

bool Daemon::FoldLocked(uint64_t transfer_id) {
  const daemon::AggregationTable::Finish finish = aggregations_.FinishConstituent(transfer_id);
  if (finish.kind == daemon::AggregationTable::Finish::kNotMember) return false;
  // Its bytes are in the sum: its receive buffer can take the next transfer.
  if (auto incoming = incoming_.find(transfer_id); incoming != incoming_.end()) {
    RecycleIncomingLocked(incoming);
  }
  if (finish.kind == daemon::AggregationTable::Finish::kComplete) {
    ++stats_.aggregates;
    MLF_LOG(INFO) << "aggregate " << finish.aggregate << ": summed " << finish.folded
                  << " updates packet by packet, forwarding to " << finish.dst_host;
  }
  return true;
}

void Daemon::FailAggregationLocked(uint64_t aggregate_id, const std::string& reason) {
  DropAggregationLocked(aggregate_id, reason);
  reporter_->ReportFailure(aggregate_id, absl::StrCat("aggregation failed: ", reason));
}

void Daemon::DropAggregationLocked(uint64_t aggregate_id, const std::string& reason) {
  const std::optional<std::vector<uint64_t>> waited = aggregations_.Remove(aggregate_id);
  if (!waited.has_value()) return;
  MLF_LOG(INFO) << "dropping aggregation " << aggregate_id << ": " << reason;
  for (uint64_t constituent : *waited) incoming_.erase(constituent);
  auto outgoing = outgoing_.find(aggregate_id);
  if (outgoing == outgoing_.end()) return;
  packet_queue_.RemoveTransfer(aggregate_id);
  // Part of it may be at the next hop already: tell it to drop the rest.
  if (outgoing->second.begun) aborts_.emplace_back(outgoing->second.send, reason);
  outgoing_.erase(outgoing);
  cv_.notify_all();
}

void Daemon::ReleaseLocked(uint64_t transfer_id) {
  auto it = outgoing_.find(transfer_id);
  if (it == outgoing_.end()) return;
  Outgoing& outgoing = it->second;
  const uint32_t job = outgoing.send.job_id();
  // Rank by the scheduler's job id (config order), so that TLs-One/RR rank
  // co-located jobs the same way on every daemon, whatever order their
  // traffic first reached each one.
  if (!packet_queue_.policy().HasJob(job)) {
    (void)packet_queue_.AddJob(job, static_cast<double>(job));
  }
  if (outgoing.gated) {
    // An aggregate: its packets enter the queue as the pool completes them
    // (those complete by now at once), in the order they complete.
    outgoing.released = true;
    const uint64_t grid = static_cast<uint64_t>(config_.payload_bytes);
    outgoing.packets_left = static_cast<size_t>((outgoing.buffer->size() + grid - 1) / grid);
    if (!aggregations_.Active(transfer_id)) {  // every constituent is in
      for (uint32_t i = 0; i < outgoing.packets_left; ++i) QueueAggregatePacketLocked(outgoing, i);
      return;
    }
    for (uint32_t index : aggregations_.ReadyPackets(transfer_id)) {
      QueueAggregatePacketLocked(outgoing, index);
    }
    return;
  }
  // Tensor layout: consecutive regions in tensor order. Within a released
  // transfer the queue sends the most urgent tensor first (Mercury §IV).
  std::vector<v1::TensorInfo> tensors = outgoing.tensors;
  if (tensors.empty()) {
    v1::TensorInfo whole;
    whole.set_bytes(outgoing.buffer->size());
    tensors.push_back(whole);
  }
  uint64_t offset = 0;
  size_t packets = 0;
  for (const v1::TensorInfo& tensor : tensors) {
    daemon::TensorRef ref;
    ref.job_id = job;
    ref.transfer_id = transfer_id;
    ref.tensor_id = tensor.tensor_id();
    ref.tensor_priority = static_cast<daemon::TensorPriority>(std::max(0, tensor.priority()));
    auto split = daemon::SplitTensor(
        ref,
        absl::Span<const std::byte>(
            reinterpret_cast<const std::byte*>(outgoing.buffer->data() + offset), tensor.bytes()),
        static_cast<uint32_t>(config_.payload_bytes));
    offset += tensor.bytes();
    if (!split.ok()) {
      packet_queue_.RemoveTransfer(transfer_id);
      reporter_->ReportFailure(transfer_id, absl::StrCat("cannot packetise: ", split.status().message()));
      outgoing_.erase(it);
      return;
    }
    for (const daemon::PacketDescriptor& packet : *split) {
      (void)packet_queue_.Push(packet);  // the job is registered above
      ++packets;
    }
  }
  outgoing.packets_left = packets;
}

void Daemon::FailOutgoingLocked(const std::string& dst_address, const std::string& reason) {
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    if (it->second.send.dst_address() != dst_address || it->second.packets_left == 0) {
      ++it;
      continue;
    }
    packet_queue_.RemoveTransfer(it->first);
    reporter_->ReportFailure(it->first, absl::StrCat("sending to ", it->second.send.dst_host(),
                                               " failed: ", reason));
    it = outgoing_.erase(it);
  }
}

void Daemon::SenderLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_.load()) {
    while (!aborts_.empty()) {
      const auto [send, reason] = aborts_.front();
      aborts_.erase(aborts_.begin());
      lock.unlock();
      auto socket = PeerSocket(send);
      if (socket.ok()) {
        PacketHeader abort;
        abort.kind = PacketKind::kAbort;
        abort.job = send.job_id();
        abort.transfer = send.transfer_id();
        const std::string text = reason.substr(0, transport::kMaxControlBytes);
        (void)transport::WritePacket(*send_watchdog_, (*socket)->native_handle(), abort, text.data(),
                          static_cast<uint32_t>(text.size()));
      }
      lock.lock();
    }
    const double now = clock_->NowSeconds();
    while (!release_at_.empty() && release_at_.begin()->first <= now) {
      const uint64_t id = release_at_.begin()->second;
      release_at_.erase(release_at_.begin());
      ReleaseLocked(id);
    }
    double wake = release_at_.empty() ? daemon::kNever : release_at_.begin()->first;
    std::optional<daemon::PacketDescriptor> packet = packet_queue_.Peek(now);
    if (packet.has_value()) {
      auto it = outgoing_.find(packet->transfer_id);
      if (it == outgoing_.end()) {
        auto reply = replies_.find(packet->transfer_id);
        if (reply == replies_.end()) {  // failed meanwhile
          packet_queue_.RemoveTransfer(packet->transfer_id);
          continue;
        }
        double next_s = now;
        if (ConsumeUnscheduled(packet->length_bytes, now, &next_s)) {
          packet_queue_.Pop(now);
          const std::shared_ptr<ReplyStream> stream = reply->second;
          stream->writing = true;
          lock.unlock();
          PacketHeader data;
          data.kind = PacketKind::kData;
          data.job = stream->job_id;
          data.transfer = stream->request;
          data.priority = static_cast<uint16_t>(std::min<uint32_t>(stream->priority, 65535));
          const auto* payload = reinterpret_cast<const uint8_t*>(packet->payload);
          data.offset = static_cast<uint64_t>(payload - stream->buffer->data());
          absl::Status status =
              transport::WritePacket(*send_watchdog_, stream->socket->native_handle(), data, payload, packet->length_bytes);
          lock.lock();
          stream->writing = false;
          if (status.ok()) {
            ++stream->sent;
            stats_.bytes_sent += packet->length_bytes;
          } else {
            stream->error = absl::StrCat("sending the get reply failed: ", status.message());
            MLF_LOG(WARNING) << "get reply " << stream->request << " (job " << stream->job_id
                             << ", " << stream->sent << " of " << stream->total_packets
                             << " packets sent): " << status.message();
            packet_queue_.RemoveTransfer(stream->id);
          }
          cv_.notify_all();  // AwaitReply
          continue;
        }
        wake = std::min(wake, next_s);
        packet.reset();
      }
    }
    if (packet.has_value()) {
      auto it = outgoing_.find(packet->transfer_id);
      Outgoing& outgoing = it->second;
      if (outgoing.pacer->TryConsume(packet->length_bytes, now)) {
        packet_queue_.Pop(now);
        const bool begin = !outgoing.begun;
        if (begin) {
          MLF_LOG(DEBUG) << "sending transfer " << packet->transfer_id << " from "
                         << absl::StrFormat("%.6f", now);
          if (outgoing.checksums != nullptr) outgoing.checksums->MarkSending();
        }
        outgoing.begun = true;
        const v1::SendTransfer send = outgoing.send;
        const std::shared_ptr<SharedBuffer> buffer = outgoing.buffer;  // keeps the payload alive
        std::optional<uint32_t> crc;
        if (outgoing.checksums != nullptr) {
          crc = outgoing.checksums->Find(
              static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(packet->payload) -
                                    buffer->data()),
              packet->length_bytes);
        }
        lock.unlock();
        absl::Status status = WriteToPeer(send, begin, *packet, buffer->data(), crc);
        lock.lock();
        if (!status.ok()) {
          MLF_LOG(WARNING) << "transfer " << send.transfer_id() << " to " << send.dst_host()
                           << " failed: " << status.message();
          FailOutgoingLocked(send.dst_address(), std::string(status.message()));
          continue;
        }
        stats_.bytes_sent += packet->length_bytes;
        auto done = outgoing_.find(send.transfer_id());
        if (done != outgoing_.end() && --done->second.packets_left == 0) outgoing_.erase(done);
        continue;
      }
      wake = std::min(wake, outgoing.pacer->NextSendTime(packet->length_bytes, now));
    }
    if (wake == daemon::kNever) {
      cv_.wait(lock);
    } else {
      cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, wake - now)));
    }
  }
}

absl::StatusOr<std::shared_ptr<tcp::socket>> Daemon::PeerSocket(const v1::SendTransfer& send) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  auto& peer = peers_[send.dst_address()];
  if (peer == nullptr || !peer->is_open()) {
    auto endpoint = transport::ParseEndpoint(send.dst_address());
    if (!endpoint.ok()) return endpoint.status();
    peer = std::make_shared<tcp::socket>(io_);
    boost::system::error_code error;
    peer->connect(*endpoint, error);
    if (error) {
      peer.reset();
      return absl::UnavailableError(absl::StrCat("cannot connect to ", send.dst_host(), " at ",
                                                 send.dst_address(), ": ", error.message()));
    }
    peer->set_option(tcp::no_delay(true), error);
    // Priorities act only on packets still in the daemon's queue: cap
    // what the kernel holds unsent at about two packets, so an urgent
    // tensor does not wait behind a megabyte of socket buffer (measured in
    // daemon/README.md: unpaced preemption 38 -> 8.7 packet-times).
    const int lowat = 2 * (static_cast<int>(config_.payload_bytes) +
                           static_cast<int>(transport::kHeaderBytes));
    ::setsockopt(peer->native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof(lowat));
  }
  return peer;
}

absl::Status Daemon::WriteToPeer(const v1::SendTransfer& send, bool begin,
                                 const daemon::PacketDescriptor& packet, const uint8_t* base,
                                 std::optional<uint32_t> crc) {
  auto peer_socket = PeerSocket(send);
  if (!peer_socket.ok()) return peer_socket.status();
  std::shared_ptr<tcp::socket> socket = std::move(*peer_socket);
  absl::Status status;
  if (begin) {
    PacketHeader header;
    header.kind = PacketKind::kBegin;
    header.job = send.job_id();
    header.transfer = send.transfer_id();
    header.offset = static_cast<uint64_t>(send.bytes());
    status = transport::WritePacket(*send_watchdog_, socket->native_handle(), header, nullptr, 0);
  }
  if (status.ok()) {
    const auto* payload = reinterpret_cast<const uint8_t*>(packet.payload);
    PacketHeader header;
    header.kind = PacketKind::kData;
    header.job = send.job_id();
    header.transfer = send.transfer_id();
    header.tensor = packet.tensor_id;
    header.priority = static_cast<uint16_t>(std::min<uint32_t>(packet.tensor_priority, 65535));
    header.offset = static_cast<uint64_t>(payload - base);  // offset within the transfer
    status = transport::WritePacket(*send_watchdog_, socket->native_handle(), header, payload, packet.length_bytes, crc);
  }
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(peers_mu_);
    boost::system::error_code ignored;
    socket->close(ignored);
    peers_.erase(send.dst_address());
  }
  return status;
}

}  // namespace mlfabric
