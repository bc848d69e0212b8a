// MlfabricPlanner: the paper's scheduler for one server's batch (§5):
// ordering (Alg. 2) -> aggregation (Alg. 3) -> replication (§5.3), or for a
// synchronous batch (§6) aggregation over the input list -> replication.
//
//   MlfabricPlanner planner;
//   absl::StatusOr<Plan> plan = planner.PlanBatch(batch);
//
// Thread safety: stateless; PlanBatch may run concurrently for several
// servers.
#ifndef MLFABRIC_SCHEDULER_CORE_MLFABRIC_PLANNER_H_
#define MLFABRIC_SCHEDULER_CORE_MLFABRIC_PLANNER_H_

#include "scheduler/core/planner.h"

namespace mlfabric::core {

class MlfabricPlanner final : public Planner {
 public:
  absl::StatusOr<Plan> PlanBatch(const Batch& batch) const override;
  std::string Name() const override { return "mlfabric"; }
};

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_MLFABRIC_PLANNER_H_
