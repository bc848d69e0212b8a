#include "eval/sim/experiments.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "scheduler/core/planner_factory.h"

namespace mlfabric::sim {

nlohmann::json ResultToJson(const SystemResult& r) {
  nlohmann::json j;
  j["system"] = r.system;
  j["reached_target"] = r.reached_target;
  j["time_to_target_s"] = r.time_to_target_s;
  j["sim_end_s"] = r.sim_end_s;
  j["final_accuracy"] = r.final_accuracy;
  j["pushed"] = r.pushed;
  j["applied"] = r.applied;
  j["dropped"] = r.dropped;
  j["in_flight"] = r.in_flight;
  j["model_versions"] = r.model_versions;
  j["gradients_per_s"] = r.gradients_per_s;
  j["rounds_per_s"] = r.rounds_per_s;
  j["mean_round_s"] = r.mean_round_s;
  nlohmann::json hist = nlohmann::json::object();
  for (const auto& [d, n] : r.delay_histogram) hist[std::to_string(d)] = n;
  j["delay_histogram"] = hist;
  j["mean_delay"] = r.mean_delay;
  j["max_delay"] = r.max_delay;
  j["delay_bound_violations"] = r.delay_bound_violations;
  j["drop_reasons"] = r.drop_reasons;
  j["aggregates"] = r.aggregates;
  j["mean_get_s"] = r.mean_get_s;
  j["mean_push_to_apply_s"] = r.mean_push_to_apply_s;
  j["get_batches"] = r.get_batches;
  j["get_batch_mean_machines"] = r.get_batch_mean_machines;
  j["get_server_sends"] = r.get_server_sends;
  j["empty_segments"] = r.empty_segments;
  j["accuracy_curve"] = r.accuracy_curve;
  j["planner_calls"] = r.planner_calls;
  j["planner_mean_batch"] = r.planner_mean_batch;
  j["planner_ms_mean"] = r.planner_ms_mean;
  j["planner_ms_max"] = r.planner_ms_max;
  j["planning_ms_mean"] = r.planning_ms_mean;
  j["planning_ms_p99"] = r.planning_ms_p99;
  j["planning_ms_max"] = r.planning_ms_max;
  j["late_plans"] = r.late_plans;
  j["plan_lead_ms_mean"] = r.plan_lead_ms_mean;
  j["fluid"] = {{"events", r.fluid.events},
                {"flows_started", r.fluid.flows_started},
                {"flows_completed", r.fluid.flows_completed},
                {"max_link_load", r.fluid.max_link_load},
                {"reserved_flows_late", r.fluid.reserved_flows_late},
                {"intra_host_copies", r.fluid.intra_host_copies}};
  j["wall_s"] = r.wall_s;
  return j;
}

nlohmann::json ConfigToJson(const SimConfig& c) {
  return {{"workers", c.workers},
          {"compute", c.compute.name},
          {"network", c.network.name},
          {"trace_period_s", c.trace_period_s},
          {"server_follows_trace", c.server_follows_trace},
          {"model_bytes", c.model_bytes},
          {"compute_s", c.compute_s},
          {"batch_interval_s", c.batch_interval_s},
          {"monitor_lag_s", c.monitor_lag_s},
          {"tau_max", c.tau_max},
          {"aggregators", c.aggregators},
          {"aggregators_resolved", MakeLayout(c).aggregators},
          {"aggregators_on_workers", c.aggregators_on_workers},
          {"distributors", c.distributors},
          {"workers_per_host", c.workers_per_host},
          {"intra_host_bps", c.intra_host_bps},
          {"max_outstanding_pushes", c.max_outstanding_pushes},
          {"get_batching",
           c.get_batching == SimConfig::GetBatching::kServer ? "server" : "tick"},
          {"server_bps", c.server_bps},
          {"servers", c.servers},
          {"instant_planning", c.instant_planning},
          {"plan_lead_ms", c.plan_lead_ms},
          {"seed", c.seed},
          {"max_sim_s", c.max_sim_s},
          {"target_accuracy", c.target_accuracy},
          {"lr", c.sgd.lr}};
}

std::string SummaryTable(const std::vector<SystemResult>& results) {
  std::ostringstream out;
  // plan_ms / p99 / max: planning time per push batch (CPU time of the
  // planner call unless injected); late: plans a batch tick overran.
  out << absl::StrFormat(
      "%-16s %10s %8s %9s %8s %8s %8s %8s %9s %7s %6s %7s %6s %8s %8s %8s %5s %6s %6s\n", "system",
      "tta_s", "acc", "sim_s", "rounds/s", "pushed", "applied", "dropped", "inflight", "delay~",
      "dmax", "batch~", "aggs", "plan_ms", "p99", "max", "late", "lead", "get_s");
  for (const SystemResult& r : results) {
    const std::string tta =
        r.reached_target ? absl::StrFormat("%.2f", r.time_to_target_s) : std::string("not");
    out << absl::StrFormat(
        "%-16s %10s %8.3f %9.2f %8.2f %8d %8d %8d %9d %7.1f %6d %7.1f %6d %8.2f %8.2f %8.2f "
        "%5d %6.1f %6.2f\n",
        r.system, tta, r.final_accuracy, r.sim_end_s, r.rounds_per_s, r.pushed, r.applied,
        r.dropped, r.in_flight, r.mean_delay, r.max_delay, r.planner_mean_batch, r.aggregates,
        r.planning_ms_mean, r.planning_ms_p99, r.planning_ms_max, r.late_plans,
        r.plan_lead_ms_mean, r.mean_get_s);
  }
  return out.str();
}

absl::StatusOr<std::vector<Table2Cell>> RunTable2(const SimConfig& base,
                                                  const std::string& mlfabric_system,
                                                  const ProgressFn& progress) {
  absl::StatusOr<SystemSpec> mlf = ParseSystem(mlfabric_system);
  if (!mlf.ok()) return mlf.status();
  const SystemSpec rr = ParseSystem("rr-sync").value();
  std::vector<Table2Cell> cells;
  for (int c = 0; c < 3; ++c) {
    for (int n = 0; n < 3; ++n) {
      SimConfig config = base;
      config.compute = ComputeSettingByName(absl::StrCat("C", c + 1)).value();
      config.network = NetworkSettingByName(absl::StrCat("N", n + 1)).value();
      Table2Cell cell;
      cell.compute = config.compute.name;
      cell.network = config.network.name;
      cell.paper = kPaperTable2[c][n];
      absl::StatusOr<SystemResult> a = RunSystem(config, *mlf, progress);
      if (!a.ok()) return a.status();
      absl::StatusOr<SystemResult> b = RunSystem(config, rr, progress);
      if (!b.ok()) return b.status();
      cell.mlfabric = *std::move(a);
      cell.rr_sync = *std::move(b);
      if (cell.mlfabric.reached_target && cell.rr_sync.reached_target) {
        cell.speedup = cell.rr_sync.time_to_target_s / cell.mlfabric.time_to_target_s;
      }
      cells.push_back(std::move(cell));
    }
  }
  return cells;
}

std::string Table2Report(const std::vector<Table2Cell>& cells) {
  std::ostringstream out;
  out << absl::StrFormat("%-6s %10s %10s %9s %7s %9s %7s %6s %9s %9s  %s\n", "cell",
                         "mlf_tta_s", "rr_tta_s", "speedup", "paper", "mlf_drop%", "batch~",
                         "get_s", "mlf_rnd/s", "rr_rnd/s", "reading");
  int agree = 0;
  for (const Table2Cell& c : cells) {
    const double drop_pct =
        c.mlfabric.pushed > 0 ? 100.0 * c.mlfabric.dropped / c.mlfabric.pushed : 0;
    std::string reading;
    if (c.speedup == 0) {
      reading = "a system missed the target: no speedup";
    } else if (c.speedup >= 1 && std::abs(c.speedup - c.paper) <= 0.25 * c.paper) {
      reading = "agrees (within 25% of the paper)";
      ++agree;
    } else if (c.speedup >= 1) {
      reading = c.speedup > c.paper ? "MLfabric wins, by more than the paper"
                                    : "MLfabric wins, by less than the paper";
    } else {
      reading = "DISAGREES: RR-Sync is faster here";
    }
    auto tta = [](const SystemResult& r) {
      return r.reached_target ? absl::StrFormat("%.2f", r.time_to_target_s) : std::string("not");
    };
    out << absl::StrFormat("%-6s %10s %10s %9.2f %7.2f %9.1f %7.1f %6.2f %9.2f %9.2f  %s\n",
                           c.compute + "-" + c.network, tta(c.mlfabric), tta(c.rr_sync),
                           c.speedup, c.paper, drop_pct, c.mlfabric.planner_mean_batch,
                           c.mlfabric.mean_get_s, c.mlfabric.rounds_per_s,
                           c.rr_sync.rounds_per_s, reading);
  }
  out << absl::StrFormat("%d of %zu cells within 25%% of the paper's Table 2\n", agree,
                         cells.size());
  return out.str();
}

nlohmann::json Table2ToJson(const std::vector<Table2Cell>& cells) {
  nlohmann::json j = nlohmann::json::array();
  for (const Table2Cell& c : cells) {
    j.push_back({{"compute", c.compute},
                 {"network", c.network},
                 {"speedup", c.speedup},
                 {"paper", c.paper},
                 {"mlfabric", ResultToJson(c.mlfabric)},
                 {"rr_sync", ResultToJson(c.rr_sync)}});
  }
  return j;
}

absl::StatusOr<std::vector<CalibrationRow>> RunCalibration(const SimConfig& base,
                                                           const ProgressFn& progress) {
  auto run = [&](const std::string& compute, const std::string& network,
                 const std::string& system) -> absl::StatusOr<SystemResult> {
    SimConfig config = base;
    absl::StatusOr<ComputeSetting> c = ComputeSettingByName(compute);
    if (!c.ok()) return c.status();
    absl::StatusOr<NetworkSetting> n = NetworkSettingByName(network);
    if (!n.ok()) return n.status();
    config.compute = *c;
    config.network = *n;
    absl::StatusOr<SystemSpec> spec = ParseSystem(system);
    if (!spec.ok()) return spec.status();
    return RunSystem(config, *spec, progress);
  };
  // Seconds per synchronous round; per-worker seconds per asynchronous iteration.
  auto round_s = [](const SystemResult& r) { return r.mean_round_s; };
  auto iteration_s = [&base](const SystemResult& r) {
    return r.pushed > 0 ? r.sim_end_s * base.workers / static_cast<double>(r.pushed) : 0.0;
  };
  absl::StatusOr<SystemResult> ring_ideal = run("C0", "N0", "rr-sync");
  if (!ring_ideal.ok()) return ring_ideal.status();
  absl::StatusOr<SystemResult> ring_c2n1 = run("C2", "N1", "rr-sync");
  if (!ring_c2n1.ok()) return ring_c2n1.status();
  absl::StatusOr<SystemResult> mlf_n2 = run("C1", "N2", "mlfabric-a-30");
  if (!mlf_n2.ok()) return mlf_n2.status();
  absl::StatusOr<SystemResult> mlf_n1 = run("C1", "N1", "mlfabric-a-30");
  if (!mlf_n1.ok()) return mlf_n1.status();
  std::vector<CalibrationRow> rows;
  rows.push_back({"RR-Sync communication per round, C0-N0", "§2", "ms", 160,
                  1000 * (round_s(*ring_ideal) - base.compute_s)});
  rows.push_back({"RR-Sync round, C0-N0 (paper: 100 ms compute + 160 ms)", "§2", "ms", 260,
                  1000 * round_s(*ring_ideal)});
  rows.push_back({"RR-Sync round C2-N1 / round C0-N0", "§2", "x", 8,
                  round_s(*ring_ideal) > 0 ? round_s(*ring_c2n1) / round_s(*ring_ideal) : 0});
  rows.push_back({"MLfabric-A-30 per-worker iteration, C1-N2", "§7.1", "ms", 1300,
                  1000 * iteration_s(*mlf_n2)});
  rows.push_back({"MLfabric-A-30 dropped updates, C1-N1", "§7.1", "%", 30,
                  mlf_n1->pushed > 0 ? 100.0 * mlf_n1->dropped / mlf_n1->pushed : 0});
  return rows;
}

std::string CalibrationReport(const std::vector<CalibrationRow>& rows) {
  std::ostringstream out;
  out << absl::StrFormat("%-56s %5s %9s %9s %7s\n", "quantity", "paper", "paper_val", "sim_val",
                         "unit");
  for (const CalibrationRow& r : rows) {
    out << absl::StrFormat("%-56s %5s %9.1f %9.1f %7s\n", r.quantity, r.section, r.paper, r.sim,
                           r.unit);
  }
  return out.str();
}

nlohmann::json CalibrationToJson(const std::vector<CalibrationRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const CalibrationRow& r : rows) {
    j.push_back({{"quantity", r.quantity}, {"section", r.section}, {"unit", r.unit},
                 {"paper", r.paper}, {"sim", r.sim}});
  }
  return j;
}

absl::StatusOr<std::vector<OverheadRow>> MeasureOverhead(const std::vector<int>& sizes,
                                                         int aggregators, uint64_t seed) {
  absl::StatusOr<std::unique_ptr<core::Planner>> planner = core::MakePlanner("mlfabric");
  if (!planner.ok()) return planner.status();
  std::vector<OverheadRow> rows;
  for (int size : sizes) {
    if (size < 2) return absl::InvalidArgumentError("overhead: |U| must be >= 2");
    OverheadRow row;
    row.updates = size;
    row.hosts = std::max(1, size / 2);
    // Enough repetitions for a stable mean and minimum, bounded in time.
    row.repetitions = size <= 30 ? 50 : size <= 100 ? 10 : 5;
    double total_ms = 0;
    int64_t dropped = 0;
    for (int rep = 0; rep < row.repetitions; ++rep) {
      core::Batch batch;
      batch.now_s = 0;
      batch.mode = core::Mode::kAsync;
      batch.tau_max = 1;  // dl(g) = v(g) + 1 - 0: v drawn so that dl ~ Uniform(1, 2|U|)
      batch.v_init = 0;
      batch.server = "s";
      batch.seed = MixSeed(seed, size, rep);
      auto rate = [&](uint64_t a, uint64_t b) {
        const uint64_t k = MixSeed(seed, 0x6f7665ULL, size, rep * 100000 + a, b) % kRatesGbps.size();
        return kRatesGbps[k] * 1e9;
      };
      batch.hosts.push_back({"s", 10e9, 10e9, {}, {}});
      for (int a = 0; a < aggregators; ++a) {
        const std::string name = absl::StrCat("a", a);
        batch.aggregators.push_back(name);
        batch.hosts.push_back({name, rate(1000000 + a, 1), rate(1000000 + a, 2), {}, {}});
      }
      for (int h = 0; h < row.hosts; ++h) {
        batch.hosts.push_back({absl::StrCat("w", h), rate(h, 1), rate(h, 2), {}, {}});
      }
      for (int u = 0; u < size; ++u) {
        const int64_t deadline =
            1 + static_cast<int64_t>(MixSeed(seed, 0x646cULL, size, rep, u) % (2 * size));
        batch.updates.push_back({absl::StrCat("u", u), absl::StrCat("w", u % row.hosts),
                                 100'000'000, deadline - 1, 1.0, {}});
      }
      const auto started = std::chrono::steady_clock::now();
      absl::StatusOr<core::Plan> plan = (*planner)->PlanBatch(batch);
      const double ms = std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - started)
                            .count();
      if (!plan.ok()) return plan.status();
      total_ms += ms;
      row.ms_max = std::max(row.ms_max, ms);
      row.ms_min = rep == 0 ? ms : std::min(row.ms_min, ms);
      dropped += static_cast<int64_t>(plan->dropped.size());
    }
    row.ms_mean = total_ms / row.repetitions;
    row.dropped_mean = static_cast<int>(dropped / row.repetitions);
    rows.push_back(row);
  }
  return rows;
}

std::string OverheadReport(const std::vector<OverheadRow>& rows) {
  std::ostringstream out;
  out << absl::StrFormat("%6s %6s %5s %12s %12s %12s %10s %s\n", "|U|", "hosts", "reps",
                         "ms_min", "ms_mean", "ms_max", "dropped", "paper §7.4");
  for (const OverheadRow& r : rows) {
    std::string paper = "-";
    if (r.updates == 100) paper = "30 ms";
    if (r.updates == 500) paper = "440 ms";
    if (r.updates == 1000) paper = "1460 ms";
    if (r.updates <= 10) paper = "< 5 ms (30 workers, |U| < 10)";
    out << absl::StrFormat("%6d %6d %5d %12.3f %12.3f %12.3f %10d %s\n", r.updates, r.hosts,
                           r.repetitions, r.ms_min, r.ms_mean, r.ms_max, r.dropped_mean, paper);
  }
  return out.str();
}

}  // namespace mlfabric::sim
