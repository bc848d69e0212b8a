#include "scheduler/core/mlfabric_planner.h"

namespace mlfabric::core {

absl::StatusOr<Plan> MlfabricPlanner::PlanBatch(const Batch& batch) const {
  if (auto status = ValidateBatch(batch); !status.ok()) return status;
  return absl::UnimplementedError("mlfabric planner: not implemented yet");
}

}  // namespace mlfabric::core
