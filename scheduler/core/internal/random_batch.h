// Seeded random batches for property tests and the benchmark (§7.4 setup:
// |U| updates, |U|/2 worker nodes, congestion-free core, deadlines drawn
// from Uniform(1, 2|U|), NIC rates from the §7 set {1, 2.5, 3.3, 5, 10}
// Gbit/s). Deterministic given the options (own SplitMix64 generator).
#ifndef MLFABRIC_SCHEDULER_CORE_INTERNAL_RANDOM_BATCH_H_
#define MLFABRIC_SCHEDULER_CORE_INTERNAL_RANDOM_BATCH_H_

#include <cstdint>

#include "scheduler/core/types.h"

namespace mlfabric::core::internal {

struct RandomBatchOptions {
  int updates = 10;
  int workers = 0;             // 0: max(1, updates / 2)
  int aggregators = 0;         // hosts earmarked as server aggregators
  bool worker_aggregators = false;  // aggregators are workers (co-hosted, §7)
  bool replica = false;        // add a replica with its own aggregators
  int replica_aggregators = 0;
  bool profiles = false;       // time-varying uplink/downlink profiles
  bool sync = false;
  int shards = 0;              // further servers for §10.2 (0: single server)
  // Some updates list their shards in another order or leave the last out
  // (part layouts that differ within a batch).
  bool mixed_shards = false;
  int max_deadline = 0;        // 0: 2 * updates
  // Some hosts lose all capacity for a while or for ever (stress for the
  // "no_bandwidth" and infeasible-split paths).
  bool outages = false;
  // The simulator's sharded batches (eval/sim, 1000 workers, S shards):
  // every part the same size (`max_bytes` / (shards + 1)), and every link
  // already carrying reservations of earlier batches (a residual profile
  // with `busy_points` random steps over the next 0.3 s). Workers are
  // machines: with `workers` < `updates` several updates share an uplink.
  // Busy profiles replace those of `profiles`.
  bool equal_shards = false;
  int busy_points = 0;
  int64_t min_bytes = 1000000;
  int64_t max_bytes = 100000000;
  uint64_t seed = 1;
};

Batch RandomBatch(const RandomBatchOptions& options);

}  // namespace mlfabric::core::internal

#endif  // MLFABRIC_SCHEDULER_CORE_INTERNAL_RANDOM_BATCH_H_
