// A Batch resolved against its Network: host names turned into indices,
// sizes into bits, deadlines computed (eq. 9). The planning stages
// (ordering, aggregation, replication) share these types; `PlannedTransfer`
// is a transfer in host indices, turned into the contract's `Transfer` only
// when the plan is assembled.
//
// Thread safety: plain values.
#ifndef MLFABRIC_SCHEDULER_CORE_PREPARED_BATCH_H_
#define MLFABRIC_SCHEDULER_CORE_PREPARED_BATCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/core/network.h"
#include "scheduler/core/types.h"

namespace mlfabric::core {

// Knobs that change how the core computes. All but `sampled_split_from`
// leave the plan unchanged.
struct PlannerOptions {
  // Run the straightforward reference implementation of every algorithm
  // (full scans, network copies, no pruning). Plans are identical.
  bool reference = false;
  // Threads the optimised Alg. 3 may use for its split points (§7.4: "lines
  // 21-23 can be parallelised"). Threads are started and joined inside the
  // call; 1 means none are started.
  int threads = 1;
  // A thread is only worth its start and network copy for at least this
  // many split points that survive the bounds (tests lower it to exercise
  // the threaded path on small batches).
  int min_splits_per_thread = 64;
  // Longest streaming chain (aggregation.h, AggregateChains), in hosts.
  // The fluid model does not charge a hop's packet latency, so chains are
  // kept short enough for that to stay small against a transfer.
  int max_chain_hops = 8;
  // Sharded batches (§10.2) of at least this many ordered updates (and at
  // least 32) are aggregated on a sample of Alg. 3's split points instead
  // of every one: every 16th, those of least bound, the last quarter, and
  // those within a 16th of the batch of the best of these (our departure,
  // aggregation.h). 0 tries every split point, as Alg. 3 does; `reference`
  // always does.
  int sampled_split_from = 64;
};

// One component of an update: `bytes` to `dst_host`.
struct PreparedPart {
  int dst_host = -1;
  int64_t bytes = 0;
  double bits = 0;
};

struct PreparedUpdate {
  int index = -1;  // into Batch::updates
  int worker = -1;
  std::vector<PreparedPart> parts;  // parts[0] goes to the batch's server
  int64_t deadline = 0;             // dl(g) = v(g) + tau_max - v_init (eq. 9)
  double norm = 0;
};

struct PreparedBatch {
  double now_s = 0;
  int server = -1;
  bool multi_server = false;  // some update has shards (§10.2)
  std::vector<PreparedUpdate> updates;  // same indices as Batch::updates
};

// Fails (naming the field) when a shard names an unknown host.
absl::StatusOr<PreparedBatch> PrepareBatch(const Batch& batch, const Network& net);

// A transfer in host indices.
struct PlannedTransfer {
  int update = -1;  // index into Batch::updates; -1 for an aggregate
  int src = -1;
  int dst = -1;
  TransferKind kind = TransferKind::kDirect;
  int64_t bytes = 0;
  double start_s = 0;
  double end_s = 0;
  std::vector<RateSegment> segments;
};

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_PREPARED_BATCH_H_
