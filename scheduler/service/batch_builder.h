// The batch builder: turns one server's pending updates and the cluster's
// view of the network into the core::Batch the planner takes (docs/architecture.md §3
// step 2). Pure: the live scheduler service and the simulator (eval/sim)
// build their batches with it, so both plan exactly the same inputs.
//
//   BatchInputs in;
//   in.mode = core::Mode::kAsync; in.tau_max = 30;
//   in.model_version = server.model_version; in.unapplied = server.in_flight;
//   in.updates = {...}; in.aggregator_candidates = {"w5"};
//   in.host_link = [&](const std::string& host) { return LinkOf(host); };
//   core::Batch batch = BuildBatch(in);
//
// Thread safety: stateless; safe to call concurrently.
#ifndef MLFABRIC_SCHEDULER_SERVICE_BATCH_BUILDER_H_
#define MLFABRIC_SCHEDULER_SERVICE_BATCH_BUILDER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/core/types.h"

namespace mlfabric {

struct PendingUpdate {
  core::UpdateRequest request;
  // Updates are summed in the network only with others of the same nonzero
  // element type (the aggregators' kernels sum floating point,
  // aggregator/reduce.h); 0 = cannot be summed (opaque bytes, integers).
  int element_type = 0;
};

struct BatchInputs {
  double now_s = 0;
  core::Mode mode = core::Mode::kAsync;
  int64_t tau_max = 0;
  int64_t model_version = 0;  // the server's version now
  int64_t unapplied = 0;      // updates planned in earlier batches, not yet applied
  // A synchronous round's batch: only members of one round may share an aggregate.
  bool synchronous_round = false;
  std::string server_host;
  uint64_t seed = 1;
  bool streaming_aggregation = true;  // core::Batch::streaming_aggregation
  std::vector<PendingUpdate> updates;  // in arrival order
  // Hosts that may aggregate this batch, already known to be usable.
  std::vector<std::string> aggregator_candidates;
  std::optional<core::ReplicaSpec> replica;
  // Capacity and residual profiles of `host` (required).
  std::function<core::HostLink(const std::string& host)> host_link;
};

// v_init of §5.1: the version at which this batch's first update can commit.
// Asynchronous updates planned earlier commit first, so they count; a
// synchronous round commits as one version (§6), and its members are all
// computed from model_version, so nothing in flight shifts it.
int64_t InitialVersion(core::Mode mode, int64_t model_version, int64_t unapplied);

// The batch: updates in arrival order, aggregators only when every update
// can be summed with every other (one element type, one size, one round),
// the replica spec as given, and a HostLink for every host involved
// (server, sources, aggregators, replica and the sources of its punted
// copies), in name order.
core::Batch BuildBatch(const BatchInputs& inputs);

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_BATCH_BUILDER_H_
