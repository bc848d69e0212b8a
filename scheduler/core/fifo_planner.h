// FifoPlanner: the vanilla asynchronous parameter server's schedule, kept as
// the baseline the MLfabric planner is measured against (§7, "vanilla async
// PS"). Updates are committed in arrival order, one transfer at a time on the
// server's downlink, each at the slowest rate its path ever offers; nothing
// is dropped, aggregated or replicated.
//
// Thread safety: stateless; PlanBatch may run concurrently.
#ifndef MLFABRIC_SCHEDULER_CORE_FIFO_PLANNER_H_
#define MLFABRIC_SCHEDULER_CORE_FIFO_PLANNER_H_

#include "scheduler/core/planner.h"

namespace mlfabric::core {

class FifoPlanner final : public Planner {
 public:
  absl::StatusOr<Plan> PlanBatch(const Batch& batch) const override;
  std::string Name() const override { return "fifo"; }
  bool UsesReservations() const override { return false; }
};

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_FIFO_PLANNER_H_
