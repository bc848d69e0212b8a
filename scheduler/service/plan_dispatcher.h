// PlanDispatcher: carries a planned batch out (docs/architecture.md §3 step 3). For
// each update in commit order it sends the source daemon its SendTransfer
// and the server's daemon (or the aggregator's) what to expect at which
// commit position; it opens each in-network aggregate (§5.2) the first time
// one of its constituents comes up, sends replica copies in the replica's
// commit order (§5.3), ends the planner's drops with their reasons, and
// records the batch for the admin history. Updates that ended while the
// batch was being planned are skipped; a plan that cannot be carried out
// (planner error, server down, aggregator down) fails what it concerns
// with the reason.
//
//   PlanDispatcher dispatcher(config, &state, &history);
//   dispatcher.Apply(work, planner.Name());
//
// Thread safety: none; called under the scheduler service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_PLAN_DISPATCHER_H_
#define MLFABRIC_SCHEDULER_SERVICE_PLAN_DISPATCHER_H_

#include <string>

#include "scheduler/service/admin_history.h"
#include "scheduler/service/batch_work.h"
#include "scheduler/service/cluster_state.h"

namespace mlfabric {

class PlanDispatcher {
 public:
  PlanDispatcher(const SchedulerConfig& config, ClusterState* state, AdminHistory* history);

  void Apply(const BatchWork& work, const std::string& planner_name);

 private:
  class Run;  // one Apply's working state (internal)

  const SchedulerConfig& config_;
  ClusterState* state_;
  AdminHistory* history_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_PLAN_DISPATCHER_H_
