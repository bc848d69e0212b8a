// MlfabricPlanner: the paper's scheduler for one server's batch (§5):
// ordering (Alg. 2) -> aggregation (Alg. 3) -> replication (§5.3); for a
// synchronous batch (§6) aggregation runs over the input list instead of an
// order (no deadlines) and the objective is the time until all are in.
//
//   MlfabricPlanner planner;
//   absl::StatusOr<Plan> plan = planner.PlanBatch(batch);
//
// Commit times are honest: the server applies in order, so an update commits
// at max(its arrival, the previous commit). `Plan::compute_ms` is left at 0:
// the core owns no clock; callers (service, CLI) time the call.
//
// Thread safety: immutable after construction; PlanBatch may run
// concurrently for several servers. With `options.threads > 1` a call starts
// and joins its own threads (Alg. 3's split points).
#ifndef MLFABRIC_SCHEDULER_CORE_MLFABRIC_PLANNER_H_
#define MLFABRIC_SCHEDULER_CORE_MLFABRIC_PLANNER_H_

#include "scheduler/core/planner.h"
#include "scheduler/core/prepared_batch.h"

namespace mlfabric::core {

class MlfabricPlanner final : public Planner {
 public:
  explicit MlfabricPlanner(PlannerOptions options = {}) : options_(options) {}
  absl::StatusOr<Plan> PlanBatch(const Batch& batch) const override;
  std::string Name() const override { return "mlfabric"; }

 private:
  PlannerOptions options_;
};

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_MLFABRIC_PLANNER_H_
