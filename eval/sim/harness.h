// The simulator's common harness (internal to //eval/sim:systems): the
// simulated cluster, the real model at the server, accuracy sampling on a
// fixed grid and the result, shared by every simulated system (systems.cc:
// MLfabric-A/S; baselines.cc: vanilla async PS, ring and tree all-reduce).
// Thread safety: one harness runs on one thread.
#ifndef MLFABRIC_EVAL_SIM_HARNESS_H_
#define MLFABRIC_EVAL_SIM_HARNESS_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <set>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "eval/sim/sgd_task.h"
#include "eval/sim/systems.h"

namespace mlfabric::sim::internal {

using Snapshot = std::shared_ptr<const Weights>;
using WallClock = std::chrono::steady_clock;

// What every system shares: the simulated cluster, the real model at the
// server, accuracy sampling on a fixed grid, and the result.
class Harness {
 public:
  // `ps`: the layout has a parameter server (and maybe dedicated
  // aggregators); all-reduce systems use the worker machines only.
  Harness(const SimConfig& config, const SystemSpec& spec, bool ps, const ProgressFn& progress)
      : config_(config),
        spec_(spec),
        layout_(MakeLayout(config)),
        trace_(config, ps ? layout_.server : -1),
        sim_(ps ? layout_.hosts : layout_.machines, &trace_),
        task_(config.sgd, config.seed),
        server_model_(task_.InitialWeights()),
        progress_(progress) {
    result_.system = spec.name;
    sim_.set_intra_host_bps(config.intra_host_bps);
  }
  virtual ~Harness() = default;

  absl::StatusOr<SystemResult> Run() {
    const auto started = WallClock::now();
    if (absl::Status s = Start(); !s.ok()) return s;
    ScheduleEval(0);
    sim_.Run([this] { return reached_ || !status_.ok(); }, config_.max_sim_s);
    if (!status_.ok()) return status_;
    result_.sim_end_s = sim_.now();
    result_.final_accuracy = last_accuracy_;
    result_.model_versions = server_version_;
    result_.in_flight = InFlight();
    if (result_.sim_end_s > 0) {
      result_.gradients_per_s = result_.applied / result_.sim_end_s;
      result_.rounds_per_s = result_.gradients_per_s / config_.workers;
    }
    int64_t delay_count = 0;
    double delay_sum = 0;
    for (const auto& [delay, count] : result_.delay_histogram) {
      delay_count += count;
      delay_sum += static_cast<double>(delay) * count;
      result_.max_delay = std::max(result_.max_delay, delay);
    }
    if (delay_count > 0) result_.mean_delay = delay_sum / delay_count;
    if (result_.accuracy_curve.empty() || result_.accuracy_curve.back().first < sim_.now()) {
      result_.accuracy_curve.push_back({sim_.now(), last_accuracy_});
    }
    Finish();
    result_.fluid = sim_.stats();
    result_.wall_s = std::chrono::duration<double>(WallClock::now() - started).count();
    return result_;
  }

 protected:
  virtual absl::Status Start() = 0;
  // Gradients pushed and neither applied nor dropped, counted from the
  // system's own state (not from the counters).
  virtual int64_t InFlight() const = 0;
  // Fills the system's own summary fields of result_ at the end of a run.
  virtual void Finish() {}

  void Fail(absl::Status status) {
    if (status_.ok()) status_ = std::move(status);
  }

  void NoteGet(double requested_s) {
    get_sum_s_ += sim_.now() - requested_s;
    result_.mean_get_s = get_sum_s_ / ++get_count_;
  }
  void NotePushApplied(double pushed_s) {
    push_sum_s_ += sim_.now() - pushed_s;
    result_.mean_push_to_apply_s = push_sum_s_ / ++push_count_;
  }

  void RecordDelay(int64_t delay) {
    ++result_.delay_histogram[delay];
    const int64_t bound = spec_.kind == SystemKind::kMlfabricA ? tau_max() : 0;
    if (bound > 0 && delay > bound) ++result_.delay_bound_violations;
  }

  int64_t tau_max() const { return spec_.tau_max > 0 ? spec_.tau_max : config_.tau_max; }
  double model_bits() const { return 8.0 * static_cast<double>(config_.model_bytes); }
  Snapshot TakeSnapshot() const { return std::make_shared<const Weights>(server_model_); }

  const SimConfig& config_;
  SystemSpec spec_;
  HostLayout layout_;
  NetworkTrace trace_;
  FluidSim sim_;
  SgdTask task_;
  Weights server_model_;
  int64_t server_version_ = 0;
  SystemResult result_;

 private:
  void ScheduleEval(int64_t k) {
    sim_.At(k * config_.eval_interval_s, [this, k] {
      if (evaluated_version_ != server_version_) {
        last_accuracy_ = task_.TestAccuracy(server_model_);
        evaluated_version_ = server_version_;
      }
      const double now = sim_.now();
      if (now >= next_curve_point_s_) {
        result_.accuracy_curve.push_back({now, last_accuracy_});
        next_curve_point_s_ = now + 1.0;
      }
      if (progress_) progress_(spec_.name, now, last_accuracy_);
      if (last_accuracy_ >= config_.target_accuracy) {
        reached_ = true;
        result_.reached_target = true;
        result_.time_to_target_s = now;
        return;
      }
      ScheduleEval(k + 1);
    });
  }

  ProgressFn progress_;
  double get_sum_s_ = 0, push_sum_s_ = 0;
  int64_t get_count_ = 0, push_count_ = 0;
  absl::Status status_;
  bool reached_ = false;
  double last_accuracy_ = 0;
  int64_t evaluated_version_ = -1;
  double next_curve_point_s_ = 0;
};

// The baselines (baselines.cc).
std::unique_ptr<Harness> MakeAsyncPs(const SimConfig& config, const SystemSpec& spec,
                                     const ProgressFn& progress);
std::unique_ptr<Harness> MakeAllReduce(const SimConfig& config, const SystemSpec& spec,
                                       const ProgressFn& progress);

}  // namespace mlfabric::sim::internal

#endif  // MLFABRIC_EVAL_SIM_HARNESS_H_
