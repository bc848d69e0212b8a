// The planner interface: what the scheduler service calls once per server
// per batch (docs/architecture.md §3 step 2). Implementations are pure: the batch holds
// every input (time, network, randomness seed), the plan is the only output.
//
//   std::unique_ptr<Planner> planner = MakePlanner("fifo").value();
//   absl::StatusOr<Plan> plan = planner->PlanBatch(batch);
//
// Thread safety: PlanBatch is const and reentrant; one planner may serve
// several servers' batches in parallel.
#ifndef MLFABRIC_SCHEDULER_CORE_PLANNER_H_
#define MLFABRIC_SCHEDULER_CORE_PLANNER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "scheduler/core/types.h"

namespace mlfabric::core {

class Planner {
 public:
  virtual ~Planner() = default;
  virtual absl::StatusOr<Plan> PlanBatch(const Batch& batch) const = 0;
  virtual std::string Name() const = 0;
  // Whether plans are made against the network left after the reservations
  // of transfers still in flight (§5.1: "the network model ... minus
  // reservations still in force"). The FIFO baseline ignores them, as a
  // vanilla parameter server does, and gets no replica transfers (§5.3).
  virtual bool UsesReservations() const { return true; }
};

// Checks the parts of a batch every planner relies on: unique update ids,
// positive sizes, every worker and the server present in `hosts`, positive
// capacities. The error names the offending field.
absl::Status ValidateBatch(const Batch& batch);

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_PLANNER_H_
