// The systems compared by the simulator (paper §7), each run on the same
// seeded cluster (same N-trace, same stragglers, same data draws):
//
//   mlfabric-a[-TAU]  MLfabric asynchronous (§5): pushes batched every
//                     batch_interval_s into a core::Batch, planned by the REAL
//                     core planner "mlfabric" (ordering, delay bound TAU,
//                     drops, aggregation over the aggregator hosts) and
//                     executed per plan on reserved rate segments; the server
//                     applies in the plan's commit order. A plan takes effect
//                     once the planner is done with it (its CPU time, one
//                     batch at a time; SimConfig::instant_planning: at the
//                     cut). Workers are
//                     pipelined: push, then at once get the freshest model
//                     (max_outstanding_pushes bounds unresolved pushes);
//                     gets wait at the server while it still sends the
//                     previous batch and are then answered together through
//                     the core's model distribution (§10.3, get_batching).
//   mlfabric-s        MLfabric synchronous (§6): the same loop with
//                     core::Mode::kSync batches; a round ends when all N
//                     gradients are in; the mean is applied.
//   async             vanilla asynchronous PS: every update is pushed as soon
//                     as computed, fair-sharing the server's downlink, applied
//                     on arrival (FIFO); the model is pulled at the same time
//                     (pipelined, same bound as MLfabric-A).
//   rr-sync           ring all-reduce: waits for the slowest worker, then
//                     2(N-1) steps of M/N bytes, each step ends when its
//                     slowest ring link is done.
//   tr-sync           binary-tree reduce then broadcast of M bytes per edge,
//                     after the slowest worker (NCCL-style collective start).
//
//   SystemSpec spec = ParseSystem("mlfabric-a-30").value();
//   absl::StatusOr<SystemResult> r = RunSystem(config, spec);
//
// A run ends when the test accuracy first reaches config.target_accuracy or
// at config.max_sim_s. Deterministic given config.seed, except the wall-clock
// fields (wall_s, planner_ms_*), as long as MLfabric's planning time is not
// measured: with config.instant_planning or a deterministic PlanningTimeFn.
// By default MLfabric-A/S charge the planner's measured CPU time to simulated
// time, and then every field may vary a little from run to run.
// Thread safety: RunSystem is reentrant.
#ifndef MLFABRIC_EVAL_SIM_SYSTEMS_H_
#define MLFABRIC_EVAL_SIM_SYSTEMS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "eval/sim/fluid_sim.h"
#include "eval/sim/sim_config.h"

namespace mlfabric::sim {

enum class SystemKind { kMlfabricA, kMlfabricS, kAsync, kRingSync, kTreeSync };

struct SystemSpec {
  std::string name;
  SystemKind kind = SystemKind::kMlfabricA;
  int64_t tau_max = 0;  // mlfabric-a only; 0: config.tau_max
};

// "mlfabric-a", "mlfabric-a-<tau>", "mlfabric-s", "async", "rr-sync", "tr-sync".
absl::StatusOr<SystemSpec> ParseSystem(const std::string& name);

struct SystemResult {
  std::string system;
  bool reached_target = false;
  double time_to_target_s = -1;  // simulated seconds; -1 when not reached
  double sim_end_s = 0;
  double final_accuracy = 0;
  // Gradients: every computed gradient is pushed; it is applied (alone, in an
  // aggregate or in a synchronous mean), dropped, or still in flight.
  int64_t pushed = 0;
  int64_t applied = 0;
  int64_t dropped = 0;
  int64_t in_flight = 0;
  int64_t model_versions = 0;    // server model updates (sync: rounds)
  double gradients_per_s = 0;    // applied / sim_end_s
  double rounds_per_s = 0;       // applied / N / sim_end_s ("iterations/s")
  double mean_round_s = 0;       // rr-sync / tr-sync: mean duration of a completed round
  // Staleness of applied asynchronous gradients: server version at apply
  // minus the version the gradient was computed from.
  std::map<int64_t, int64_t> delay_histogram;
  double mean_delay = 0;
  int64_t max_delay = 0;
  int64_t delay_bound_violations = 0;  // applied with delay > tau (mlfabric-a)
  std::map<std::string, int64_t> drop_reasons;
  int64_t aggregates = 0;         // aggregate transfers executed (MLfabric)
  // Asynchronous PS systems: mean simulated seconds from a worker's get
  // request to the model's arrival, and from push to apply (applied only).
  double mean_get_s = 0;
  double mean_push_to_apply_s = 0;
  // MLfabric model distribution (§10.3): batches planned, mean requesting
  // machines per batch, and copies sent by the server itself (direct sends
  // plus one per distributor used).
  int64_t get_batches = 0;
  double get_batch_mean_machines = 0;
  int64_t get_server_sends = 0;
  // Planned rate segments with from_s >= to_s (MLfabric systems).
  int64_t empty_segments = 0;
  std::vector<std::pair<double, double>> accuracy_curve;  // (sim s, accuracy), ~1 per s
  int64_t planner_calls = 0;
  double planner_mean_batch = 0;
  double planner_ms_mean = 0;     // wall clock, not deterministic
  double planner_ms_max = 0;
  // MLfabric-A/S push batches: planning time per batch as the planning-time
  // source gave it (by default the CPU time of the planner call; measured
  // with config.instant_planning too, though not charged then), and the
  // plans that were late: a batch tick came while they were being planned,
  // so that tick cut no batch (always 0 with config.instant_planning), a
  // plan still being planned when the run ends included.
  double planning_ms_mean = 0;
  double planning_ms_p99 = 0;
  double planning_ms_max = 0;
  int64_t late_plans = 0;
  // The mean plan lead of those batches (SimConfig::plan_lead_ms).
  double plan_lead_ms_mean = 0;
  FluidStats fluid;
  double wall_s = 0;              // wall clock, not deterministic
};

// Called about once per simulated eval point (for progress output).
using ProgressFn = std::function<void(const std::string& system, double sim_s, double accuracy)>;

// An MLfabric-A/S push batch handed to the planner: what a planning-time
// source is told about it.
struct PlanningSample {
  int64_t batch = 0;      // the run's batches counted from 0
  double cut_s = 0;       // simulated time of the cut, when its planning starts
  int updates = 0;        // updates in the batch
  double measured_s = 0;  // CPU seconds the real planner call took here
};
// Simulated seconds a batch's planning takes (>= 0). nullptr: measured_s.
// Tests inject a fake planner clock through it.
using PlanningTimeFn = std::function<double(const PlanningSample&)>;

absl::StatusOr<SystemResult> RunSystem(const SimConfig& config, const SystemSpec& spec,
                                       const ProgressFn& progress = nullptr,
                                       const PlanningTimeFn& planning_time = nullptr);

}  // namespace mlfabric::sim

#endif  // MLFABRIC_EVAL_SIM_SYSTEMS_H_
