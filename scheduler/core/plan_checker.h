// Checks a plan against the invariants anyone can check from outside
// (docs/architecture.md §4) plus the ones the MLfabric planner promises:
//  - no link's reserved rate exceeds its available bandwidth at any time
//    (host uplinks/downlinks and explicit topology links; a same-host
//    transfer crosses none, network.h);
//  - (async) each ordered update's 1-based position i <= v(g) + tau_max - v_init;
//  - commits: one per ordered update, positions 1..n, times non-decreasing,
//    never before the update (or its aggregate) has arrived;
//  - every input update appears exactly once in `order` or `dropped`;
//  - bytes moved by each transfer equal its size, and sizes match the
//    update (aggregates: their largest constituent; for a model split
//    across servers, §10.2, their largest constituent part for the host
//    they go to, and an update's transfers to an aggregator carry its
//    parts one each);
//  - every part of every ordered update reaches its host exactly once,
//    directly or in one aggregate (a constituent arrives with the latest
//    aggregate naming it), and a dropped update's none;
//  - order preserved through aggregation: an aggregate's constituents are
//    consecutive in `order` and commit together;
//  - replica commits are a prefix of `order`, committed by the last server
//    commit, and the §5.3 divergence bound holds at that time.
//
//   std::vector<std::string> problems = CheckPlan(batch, plan);
//   // empty when the plan is sound
//
// Thread safety: pure function.
#ifndef MLFABRIC_SCHEDULER_CORE_PLAN_CHECKER_H_
#define MLFABRIC_SCHEDULER_CORE_PLAN_CHECKER_H_

#include <string>
#include <vector>

#include "scheduler/core/types.h"

namespace mlfabric::core {

struct CheckOptions {
  bool check_deadlines = true;    // FIFO does not promise deadlines
  bool check_replica = true;
  double relative_tolerance = 1e-6;
};

std::vector<std::string> CheckPlan(const Batch& batch, const Plan& plan,
                                   const CheckOptions& options = {});

}  // namespace mlfabric::core

#endif  // MLFABRIC_SCHEDULER_CORE_PLAN_CHECKER_H_
