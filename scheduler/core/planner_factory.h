// Picks a Planner implementation by name: the one place the scheduler
// service, the `mlfabric-plan` CLI and the benchmarks turn a configured
// planner name into an object (Horovod-style strategy factory).
//
//   absl::StatusOr<std::unique_ptr<Planner>> planner = MakePlanner("mlfabric");
//   if (!planner.ok()) return planner.status();  // unknown name
//   absl::StatusOr<Plan> plan = (*planner)->PlanBatch(batch);
//
// Known names: "fifo" (vanilla async PS baseline) and "mlfabric" (§5:
// ordering -> aggregation -> replication). The returned planners are
// stateless; one instance may serve several servers' batches concurrently.
#ifndef MLFABRIC_SCHEDULER_CORE_PLANNER_FACTORY_H_
#define MLFABRIC_SCHEDULER_CORE_PLANNER_FACTORY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/core/planner.h"

namespace mlfabric::core {

// Returns a new planner called `name`, or InvalidArgument listing the known
// names when `name` is not one of them.
absl::StatusOr<std::unique_ptr<Planner>> MakePlanner(const std::string& name);

// The names MakePlanner accepts, in a stable order (for --help texts).
std::vector<std::string> KnownPlannerNames();

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_PLANNER_FACTORY_H_
