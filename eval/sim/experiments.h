// Experiments on top of the simulator: the summary of one run of several
// systems, the paper's Table 2 grid (speedup in time to accuracy of
// MLfabric-A over RR-Sync for C1-C3 x N1-N3, §7.1) and the scheduler
// overhead of §7.4 (milliseconds per batch of |U| updates, measured by
// calling the real core planner on this machine).
//
//   std::vector<SystemResult> results = ...;   // from RunSystem
//   std::cout << SummaryTable(results);
//   auto grid = RunTable2(config, "mlfabric-a-30", progress).value();
//   std::cout << Table2Report(grid);
//
// Thread safety: all functions are reentrant.
#ifndef MLFABRIC_EVAL_SIM_EXPERIMENTS_H_
#define MLFABRIC_EVAL_SIM_EXPERIMENTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "eval/sim/sim_config.h"
#include "eval/sim/systems.h"
#include "nlohmann/json.hpp"

namespace mlfabric::sim {

nlohmann::json ResultToJson(const SystemResult& result);
nlohmann::json ConfigToJson(const SimConfig& config);
std::string SummaryTable(const std::vector<SystemResult>& results);

// Paper Table 2 (§7.1): speedup of MLfabric-A over RR-Sync; rows C1..C3,
// columns N1..N3.
inline constexpr double kPaperTable2[3][3] = {
    {1.74, 1.23, 1.42}, {2.96, 2.0, 2.32}, {1.90, 1.33, 1.42}};

struct Table2Cell {
  std::string compute;
  std::string network;
  SystemResult mlfabric;
  SystemResult rr_sync;
  double speedup = 0;  // rr_sync tta / mlfabric tta; 0 when either missed the target
  double paper = 0;
};

// Runs `mlfabric_system` and rr-sync on the 3x3 grid with `base` otherwise.
absl::StatusOr<std::vector<Table2Cell>> RunTable2(const SimConfig& base,
                                                  const std::string& mlfabric_system,
                                                  const ProgressFn& progress = nullptr);
std::string Table2Report(const std::vector<Table2Cell>& cells);
nlohmann::json Table2ToJson(const std::vector<Table2Cell>& cells);

struct OverheadRow {
  int updates = 0;  // |U|
  int hosts = 0;    // |U| / 2 worker hosts (§7.4)
  int repetitions = 0;
  double ms_mean = 0;
  double ms_max = 0;
  int dropped_mean = 0;
};

// §7.4: batches of |U| updates with deadlines from Uniform(1, 2|U|) over
// |U|/2 worker hosts, a congestion-free core, one server and `aggregators`
// aggregator hosts; NIC rates drawn from {1, 2.5, 3.3, 5, 10} Gbit/s.
absl::StatusOr<std::vector<OverheadRow>> MeasureOverhead(const std::vector<int>& sizes,
                                                         int aggregators, uint64_t seed);
std::string OverheadReport(const std::vector<OverheadRow>& rows);

}  // namespace mlfabric::sim

#endif  // MLFABRIC_EVAL_SIM_EXPERIMENTS_H_
