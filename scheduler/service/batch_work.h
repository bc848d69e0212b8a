// BatchWork: one server's batch on its way through a batch cycle — cut from
// the cluster state under the service's lock, planned outside it (in
// parallel with other servers' batches, PlanInParallel), then dispatched
// under the lock again (PlanDispatcher).
//
// Thread safety: PlanInParallel gives each item to exactly one thread.
#ifndef MLFABRIC_SCHEDULER_SERVICE_BATCH_WORK_H_
#define MLFABRIC_SCHEDULER_SERVICE_BATCH_WORK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/core/planner.h"
#include "scheduler/core/types.h"

namespace mlfabric {

struct BatchWork {
  uint64_t batch_id = 0;
  std::string job;
  std::string server;
  int64_t priority_class = 0;
  int32_t round_size = 0;  // > 0: a synchronous-round server's batch
  core::Batch batch;
  // Filled by the planning thread.
  absl::StatusOr<core::Plan> plan = absl::UnknownError("not planned");
  double compute_ms = 0;
  int worker_thread = 0;
};

// Plans every item with `planner` on up to `threads` threads (the calling
// thread is one of them), urgent priority classes first: with fewer threads
// than batches they are planned first. Sorts *work by priority class
// (stable), so dispatching in order also serves them first.
void PlanInParallel(const core::Planner& planner, int threads, std::vector<BatchWork>* work);

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_BATCH_WORK_H_
