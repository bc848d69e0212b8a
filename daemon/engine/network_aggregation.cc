#include "daemon/engine/network_aggregation.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mlfabric::daemon {

NetworkAggregation::NetworkAggregation(uint32_t payload_bytes, AggregationTable* table,
                                       IncomingTransfers* incoming, SendScheduler* send,
                                       CompletionReporter* reporter)
    : payload_bytes_(payload_bytes),
      table_(table),
      incoming_(incoming),
      send_(send),
      reporter_(reporter) {}

std::optional<uint64_t> NetworkAggregation::AggregateOf(uint64_t transfer) const {
  return table_->AggregateOf(transfer);
}

bool NetworkAggregation::Active(uint64_t aggregate) const { return table_->Active(aggregate); }

std::optional<uint32_t> NetworkAggregation::JobOf(uint64_t aggregate) const {
  return table_->JobOf(aggregate);
}

void NetworkAggregation::StartLocked(const v1::AggregateTask& task) {
  absl::StatusOr<std::shared_ptr<SharedBuffer>> buffer = table_->Start(task);
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
    (void)table_->Remove(task.aggregate_id());
    reporter_->ReportFailure(task.aggregate_id(), std::string(scheduled.message()));
    return;
  }
  // Constituents may have (partly) arrived before the task did.
  for (int i = 0; i < task.constituents_size(); ++i) {
    const uint64_t constituent = task.constituents(i);
    Incoming* incoming = incoming_->Find(constituent);
    if (incoming == nullptr) continue;
    if (std::string mismatch = incoming_->JobMismatch(constituent, task.job_id());
        !mismatch.empty()) {
      FailLocked(task.aggregate_id(), mismatch);
      return;
    }
    if (incoming->total != static_cast<uint64_t>(task.bytes())) {
      FailLocked(task.aggregate_id(), absl::StrCat("constituent ", constituent, " has ",
                                                   incoming->total, " bytes, the aggregate ",
                                                   task.bytes()));
      return;
    }
    const auto ranges = std::move(incoming->unfolded);
    incoming->unfolded.clear();
    const bool complete = incoming->received == incoming->total;
    {
      // Held while its ranges are summed, and let go before FinishLocked
      // recycles it (a buffer someone holds is not reused).
      const std::shared_ptr<SharedBuffer> data = incoming->buffer;
      for (const auto& [offset, length] : ranges) {
        if (!FoldRangeLocked(task.aggregate_id(), constituent, data->data() + offset, offset,
                             length)) {
          return;
        }
      }
    }
    if (complete) FinishLocked(constituent);
  }
}

bool NetworkAggregation::FoldPacketLocked(uint64_t aggregate, uint64_t transfer, uint64_t total,
                                          const uint8_t* data, uint64_t offset,
                                          uint32_t length) {
  const int64_t aggregate_bytes = table_->Bytes(aggregate).value_or(-1);
  if (total != static_cast<uint64_t>(aggregate_bytes)) {
    FailLocked(aggregate, absl::StrCat("constituent ", transfer, " has ", total,
                                       " bytes, the aggregate ", aggregate_bytes));
    return false;
  }
  return FoldRangeLocked(aggregate, transfer, data, offset, length);
}

bool NetworkAggregation::FoldRangeLocked(uint64_t aggregate, uint64_t transfer,
                                         const uint8_t* data, uint64_t offset, uint32_t length) {
  std::vector<uint32_t> ready;
  absl::Status added = table_->Fold(aggregate, transfer, data, offset, length, &ready);
  if (!added.ok()) {
    FailLocked(aggregate, std::string(added.message()));
    return false;
  }
  send_->QueueAggregatePackets(aggregate, ready);
  return true;
}

bool NetworkAggregation::FinishLocked(uint64_t transfer) {
  const AggregationTable::Finish finish = table_->FinishConstituent(transfer);
  if (finish.kind == AggregationTable::Finish::kNotMember) return false;
  // Its bytes are in the sum: its receive buffer can take the next transfer.
  incoming_->Recycle(transfer);
  if (finish.kind == AggregationTable::Finish::kComplete) {
    completed_.fetch_add(1);
    MLF_LOG(INFO) << "aggregate " << finish.aggregate << ": summed " << finish.folded
                  << " updates packet by packet, forwarding to " << finish.dst_host;
  }
  return true;
}

void NetworkAggregation::AcceptLocalLocked(const v1::SendTransfer& send,
                                           std::shared_ptr<SharedBuffer> buffer) {
  if (static_cast<int64_t>(buffer->size()) != send.bytes()) {
    reporter_->ReportFailure(send.transfer_id(), absl::StrCat("schedule says ", send.bytes(),
                                                              " bytes, the data has ",
                                                              buffer->size()));
    return;
  }
  const std::optional<uint64_t> aggregate = table_->AggregateOf(send.transfer_id());
  if (aggregate.has_value()) {
    // As a constituent arriving over the data plane is checked.
    const int64_t aggregate_bytes = table_->Bytes(*aggregate).value_or(-1);
    std::string mismatch;
    if (send.bytes() != aggregate_bytes) {
      mismatch = absl::StrCat("constituent ", send.transfer_id(), " has ", send.bytes(),
                              " bytes, the aggregate ", aggregate_bytes);
    } else if (table_->JobOf(*aggregate) != send.job_id()) {
      mismatch = absl::StrCat("constituent ", send.transfer_id(), " is job ", send.job_id(),
                              "'s, the aggregate job ", table_->JobOf(*aggregate).value_or(0),
                              "'s");
    }
    if (!mismatch.empty()) {
      FailLocked(*aggregate, mismatch);
      return;
    }
  }
  // As if it had arrived whole.
  Incoming& incoming = incoming_->Add(send.transfer_id(), send.job_id(), buffer->size(), buffer);
  incoming.received = buffer->size();
  std::vector<std::pair<uint64_t, uint32_t>> ranges;
  for (uint64_t offset = 0; offset < buffer->size(); offset += payload_bytes_) {
    ranges.emplace_back(
        offset, static_cast<uint32_t>(std::min<uint64_t>(payload_bytes_, buffer->size() - offset)));
  }
  if (!aggregate.has_value()) {
    incoming.unfolded = std::move(ranges);
    return;
  }
  for (const auto& [offset, length] : ranges) {
    if (!FoldRangeLocked(*aggregate, send.transfer_id(), buffer->data() + offset, offset,
                         length)) {
      return;
    }
  }
  FinishLocked(send.transfer_id());
}

void NetworkAggregation::FailLocked(uint64_t aggregate, const std::string& reason) {
  DropLocked(aggregate, reason);
  reporter_->ReportFailure(aggregate, absl::StrCat("aggregation failed: ", reason));
}

void NetworkAggregation::DropLocked(uint64_t aggregate, const std::string& reason) {
  const std::optional<std::vector<uint64_t>> waited = table_->Remove(aggregate);
  if (!waited.has_value()) return;
  MLF_LOG(INFO) << "dropping aggregation " << aggregate << ": " << reason;
  for (uint64_t constituent : *waited) incoming_->Erase(constituent);
  send_->Cancel(aggregate, reason);
}

}  // namespace mlfabric::daemon
