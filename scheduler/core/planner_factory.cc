#include "scheduler/core/planner_factory.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/core/fifo_planner.h"
#include "scheduler/core/mlfabric_planner.h"

namespace mlfabric::core {

std::vector<std::string> KnownPlannerNames() { return {"fifo", "mlfabric"}; }

absl::StatusOr<std::unique_ptr<Planner>> MakePlanner(const std::string& name) {
  if (name == "fifo") return std::unique_ptr<Planner>(new FifoPlanner());
  if (name == "mlfabric") return std::unique_ptr<Planner>(new MlfabricPlanner());
  return absl::InvalidArgumentError(absl::StrCat("unknown planner '", name, "'; known planners: ",
                                                 absl::StrJoin(KnownPlannerNames(), ", ")));
}

}  // namespace mlfabric::core
