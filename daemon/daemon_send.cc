// Daemon: what the send side is handed: pushes and replica copies scheduled
// (daemon::SendScheduler releases, paces and sends them), streaming-chain
// members summed here, and in-network aggregation (§5.2).
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
  std::optional<daemon::PushTable::Push> push = pushes_.Find(source);
  // A member of an aggregation on this host (the scheduler sends the task
  // first) is summed here; anything else for this host (a push to a server
  // on it) goes through the data plane like any transfer.
  if (push.has_value() && send.dst_host() == config_.host &&
      aggregations_.AggregateOf(send.transfer_id()).has_value()) {
    AcceptLocalLocked(send, push->buffer);
    return;
  }
  if (push.has_value() && send.part()) {
    // A part of a push to a server group (§10.2): its own transfer, of the
    // bytes its shard holds. Copied, so that the part's packets are framed
    // and checksummed as a transfer of their own.
    const uint64_t size = push->buffer->size();
    if (send.part_offset() < 0 || send.bytes() <= 0 ||
        static_cast<uint64_t>(send.part_offset()) + static_cast<uint64_t>(send.bytes()) > size) {
      reporter_->ReportFailure(send.transfer_id(),
                               absl::StrCat("part [", send.part_offset(), ", +", send.bytes(),
                                            ") lies outside push ", source, " (", size, " bytes)"));
      return;
    }
    absl::StatusOr<SharedBuffer> slice = SharedBuffer::Create(static_cast<size_t>(send.bytes()));
    if (!slice.ok()) {
      reporter_->ReportFailure(send.transfer_id(), std::string(slice.status().message()));
      return;
    }
    std::memcpy(slice->data(), push->buffer->data() + send.part_offset(),
                static_cast<size_t>(send.bytes()));
    ScheduleOutgoingLocked(send, std::make_shared<SharedBuffer>(std::move(*slice)), {}, nullptr);
    return;
  }
  if (push.has_value()) {
    ScheduleOutgoingLocked(send, push->buffer, push->tensors, push->checksums);
    return;
  }
  if (send.source_transfer_id() != 0) {
    // The outgoing transfer keeps the held bytes alive.
    if (std::optional<daemon::PushTable::Push> held = pushes_.TakeHeld(source)) {
      ScheduleOutgoingLocked(send, held->buffer, held->tensors, held->checksums);
      return;
    }
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
  absl::Status scheduled =
      send_->Schedule(send, std::move(buffer), std::move(tensors), std::move(checksums));
  if (!scheduled.ok()) reporter_->ReportFailure(send.transfer_id(), std::string(scheduled.message()));
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
  if (absl::Status scheduled = send_->Schedule(send, *buffer, {}, nullptr, /*gated=*/true);
      !scheduled.ok()) {
    (void)aggregations_.Remove(task.aggregate_id());
    reporter_->ReportFailure(task.aggregate_id(), std::string(scheduled.message()));
    return;
  }
  // Constituents may have (partly) arrived before the task did.
  for (int i = 0; i < task.constituents_size(); ++i) {
    const uint64_t constituent = task.constituents(i);
    auto incoming = incoming_.find(constituent);
    if (incoming == incoming_.end()) continue;
    if (std::string mismatch = JobMismatchLocked(constituent, task.job_id()); !mismatch.empty()) {
      FailAggregationLocked(task.aggregate_id(), mismatch);
      return;
    }
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
  send_->QueueAggregatePackets(aggregate_id, ready);
  return true;
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
  send_->Cancel(aggregate_id, reason);
}

}  // namespace mlfabric
