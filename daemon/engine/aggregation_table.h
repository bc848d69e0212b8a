// AggregationTable: the in-network aggregations this host carries out
// (mlfabric.md §5.2), summed packet by packet as constituents arrive
// (Mercury's immediate aggregation, mercury.md §IV-A key idea 3).
//
// The scheduler sends an AggregateTask: sum the constituents (transfers
// that other hosts send here) with their weights into one aggregate, which
// leaves for `dst_host` as its own transfer. The table owns each
// aggregation's sum buffer and its packet pool entry; the daemon owns the
// sockets, the outgoing aggregate transfer and the receive buffers, and
// acts on what the table returns:
//
//   auto sum = table.Start(task);            // error: report the aggregate failed
//   ...                                      // a packet of a constituent arrives:
//   if (auto aggregate = table.AggregateOf(transfer)) {
//     std::vector<uint32_t> ready;           // grid packets now final, to send
//     absl::Status s = table.Fold(*aggregate, transfer, data, offset, length, &ready);
//     if (!s.ok()) { table.Remove(*aggregate); report the aggregate failed: s }
//   }
//   ...                                      // the constituent is complete:
//   if (table.FinishConstituent(transfer).kind == Finish::kComplete) { all summed }
//
// Grid packets are `packet_bytes` long (the last may be shorter), so
// packet i of the aggregate is [i * packet_bytes, min(+packet_bytes, bytes)).
// Only float32 and float64 aggregate (weighted sums); other types are
// refused at Start with an error naming the type.
//
// Thread safety: every method may be called from any thread (own lock). The
// lock is a leaf: the table calls nothing outside itself while holding it,
// so callers may hold their own locks around any call.
#ifndef MLFABRIC_DAEMON_ENGINE_AGGREGATION_TABLE_H_
#define MLFABRIC_DAEMON_ENGINE_AGGREGATION_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "aggregator/packet_pool.h"
#include "common/mutex.h"
#include "ipc/local_ipc.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

class AggregationTable {
 public:
  // `packet_bytes`: the grid aggregates are released on (the daemon's
  // payload size); a positive multiple of 8.
  explicit AggregationTable(uint32_t packet_bytes) : packet_bytes_(packet_bytes) {}

  // Begins aggregate task.aggregate_id() and returns its zero-filled sum
  // buffer (the bytes the outgoing aggregate sends). InvalidArgument for a
  // type that cannot be summed with weights, a size that is not a positive
  // multiple of the element size, no constituents, or a constituent twice;
  // AlreadyExists if the aggregate is active.
  absl::StatusOr<std::shared_ptr<SharedBuffer>> Start(const v1::AggregateTask& task);

  bool Active(uint64_t aggregate) const;
  // The active aggregate `constituent` is summed into, if any.
  std::optional<uint64_t> AggregateOf(uint64_t constituent) const;
  // The aggregate's size in bytes; nullopt if not active.
  std::optional<int64_t> Bytes(uint64_t aggregate) const;
  // Where the aggregate goes (for logs); empty if not active.
  std::string Destination(uint64_t aggregate) const;
  // The job the aggregate belongs to; nullopt if not active.
  std::optional<uint32_t> JobOf(uint64_t aggregate) const;

  // Sums bytes [offset, offset + length) of `constituent` into `aggregate`
  // and appends the grid packets that became final to `ready` (in the
  // order they completed). Errors leave the sum as it was: NotFound (not
  // active, or not one of its constituents), InvalidArgument (a range
  // outside the aggregate or off element boundaries), AlreadyExists (bytes
  // the constituent sent already). The caller then Removes the aggregate.
  absl::Status Fold(uint64_t aggregate, uint64_t constituent, const uint8_t* data,
                    uint64_t offset, uint32_t length, std::vector<uint32_t>* ready);

  struct Finish {
    enum Kind {
      kNotMember,  // not a constituent of an active aggregate
      kWaiting,    // summed; other constituents are still to come
      kComplete,   // summed and the last: the aggregate is final and no longer active
    };
    Kind kind = kNotMember;
    uint64_t aggregate = 0;
    size_t folded = 0;      // kComplete: constituents summed
    std::string dst_host;   // kComplete: where it goes
  };
  // `constituent` has arrived completely (every byte Folded).
  Finish FinishConstituent(uint64_t constituent);

  // Ends an active aggregate without completing it; returns the
  // constituents it still waited for (their received bytes are of no use
  // now), or nullopt if it was not active.
  std::optional<std::vector<uint64_t>> Remove(uint64_t aggregate);

  // Grid packets final so far, in completion order (empty if not active).
  std::vector<uint32_t> ReadyPackets(uint64_t aggregate) const;
  size_t active() const;

 private:
  struct Aggregation {
    v1::AggregateTask task;
    std::shared_ptr<SharedBuffer> sum;
    std::map<uint64_t, double> waiting;  // constituent -> weight
    size_t folded = 0;
  };

  const uint32_t packet_bytes_;
  mutable Mutex mu_;
  aggregator::PacketPool pool_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Aggregation> aggregations_ ABSL_GUARDED_BY(mu_);  // by aggregate id
  std::map<uint64_t, uint64_t> aggregate_of_ ABSL_GUARDED_BY(mu_);     // constituent -> aggregate
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_AGGREGATION_TABLE_H_
