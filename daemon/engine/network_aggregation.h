// NetworkAggregation: this host's part in in-network aggregation
// (mlfabric.md §5.2, with Mercury's immediate aggregation): the scheduler
// names this host an aggregator of some pushes; each constituent's packets
// are summed as they arrive (from the data plane, or from a push of this
// host summed without a socket), and a packet of the aggregate leaves, at
// the aggregate's scheduled start, as soon as every constituent covered it.
//
//   NetworkAggregation aggregation(payload_bytes, &table, &incoming, &send, &reporter);
//   aggregation.StartLocked(task);                     // a kAggregate command
//   aggregation.FoldPacketLocked(agg, transfer, total, data, offset, length);
//   aggregation.FinishLocked(transfer);                // its last byte came
//
// Failures (a constituent of the wrong size, a bad packet, a send that
// cannot be scheduled) fail the aggregate, reported to the scheduler, and
// touch nothing else. A dropped aggregate (the scheduler cancelled it)
// forgets the constituents it still waited for.
//
// Thread safety: the `...Locked` methods require the receive side's lock
// (receive_lock.h); the AggregationTable and the SendScheduler take their
// own locks under it.
#ifndef MLFABRIC_DAEMON_ENGINE_NETWORK_AGGREGATION_H_
#define MLFABRIC_DAEMON_ENGINE_NETWORK_AGGREGATION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "daemon/control/completion_reporter.h"
#include "daemon/engine/aggregation_table.h"
#include "daemon/engine/send_scheduler.h"
#include "daemon/engine/incoming_transfers.h"
#include "daemon/engine/receive_lock.h"
#include "ipc/local_ipc.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

class NetworkAggregation {
 public:
  NetworkAggregation(uint32_t payload_bytes, AggregationTable* table, IncomingTransfers* incoming,
                     SendScheduler* send, CompletionReporter* reporter);
  NetworkAggregation(const NetworkAggregation&) = delete;
  NetworkAggregation& operator=(const NetworkAggregation&) = delete;

  // The aggregate `transfer` is a constituent of here, if any.
  std::optional<uint64_t> AggregateOf(uint64_t transfer) const;
  bool Active(uint64_t aggregate) const;
  // The job an aggregate here belongs to.
  std::optional<uint32_t> JobOf(uint64_t aggregate) const;

  // A kAggregate command: the aggregate's buffer and its gated send; the
  // constituents that (partly) arrived before it are summed now.
  void StartLocked(const v1::AggregateTask& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // A packet [offset, +length) of constituent `transfer` (of `total`
  // bytes) arrived at `data`: summed, and the aggregate's packets that
  // became complete queued. False if the aggregate failed.
  bool FoldPacketLocked(uint64_t aggregate, uint64_t transfer, uint64_t total,
                        const uint8_t* data, uint64_t offset, uint32_t length)
                            ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // `transfer` arrived whole: true if it is a constituent here (its bytes
  // are in the sum and its receive buffer is recycled).
  bool FinishLocked(uint64_t transfer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // A push of this host whose schedule names this host and one of its
  // aggregates (a streaming chain's member): summed here, as if it had
  // arrived whole.
  void AcceptLocalLocked(const v1::SendTransfer& send, std::shared_ptr<SharedBuffer> buffer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // The scheduler cancelled the aggregate (`Drop`), or it cannot be
  // completed here (`Fail`, reported to the scheduler).
  void DropLocked(uint64_t aggregate, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  void FailLocked(uint64_t aggregate, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);

  // Aggregates completed and forwarded.
  int64_t completed() const { return completed_.load(); }

 private:
  bool FoldRangeLocked(uint64_t aggregate, uint64_t transfer, const uint8_t* data,
                       uint64_t offset, uint32_t length)
                           ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);

  const uint32_t payload_bytes_;
  AggregationTable* const table_;
  IncomingTransfers* const incoming_ ABSL_PT_GUARDED_BY(receive_side);
  SendScheduler* const send_;
  CompletionReporter* const reporter_;
  std::atomic<int64_t> completed_{0};
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_NETWORK_AGGREGATION_H_
