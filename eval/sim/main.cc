// mlfabric-sim: the discrete-event simulator at scale (docs/architecture.md §9).
//
//   bazel run -c opt //eval/sim:mlfabric-sim -- --workers=30 --compute=C1 --network=N1
//       --systems=mlfabric-a-30,async,rr-sync --json_out=/tmp/run.json
//   bazel run -c opt //eval/sim:mlfabric-sim -- --table2      (C1-C3 x N1-N3 vs paper Table 2)
//   bazel run -c opt //eval/sim:mlfabric-sim -- --overhead    (§7.4 planner ms per batch)
//
// Prints a summary table; progress goes to stderr every ~2 s of wall time.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "eval/sim/experiments.h"
#include "eval/sim/sim_config.h"
#include "eval/sim/systems.h"

namespace mlfabric::sim {
namespace {

constexpr char kHelp[] = R"(mlfabric-sim: discrete-event simulator of MLfabric and its baselines (paper §7)

Flags (also JSON keys of --config=FILE; unknown keys are rejected):
  --workers=N            workers (default 30, up to 1000)
  --compute=C1|C2|C3     straggler setting (C0: none)          default C1
  --network=N1|N2|N3     NIC background setting (N0: all 10G)  default N1
  --systems=LIST         comma list of mlfabric-a, mlfabric-a-<tau>, mlfabric-s,
                         async, rr-sync, tr-sync    default mlfabric-a-30,async,rr-sync
  --target_accuracy=X    test accuracy that ends a run         default 0.70
  --seed=S               seed of traces, stragglers and data   default 1
  --max_sim_s=T          simulated seconds at most per system  default 600
  --tau_max=K            delay bound of plain "mlfabric-a"     default 30
  --aggregators=K        aggregators/distributors k (-1: every worker machine) default -1
  --aggregators_on_workers=B  aggregators co-hosted on worker machines (§7)  default true;
                         false: k extra idle hosts (old setting, -1 means 4)
  --distributors=K       model distributors k° (§10.3): the first K aggregator
                         hosts; -1: all of them; 0: every copy from the server
                         (faster with many --servers: docs/results.md §5.4)
                                                                 default -1
  --workers_per_host=W   workers sharing one machine/NIC (§7: 30 on 15)  default 2
  --intra_host_bps=R     copy rate between workers of one machine  default 8e10
  --max_outstanding_pushes=P  unresolved pushes per async worker before its
                         get is held (0: unbounded)              default 2
  --get_batching=server|tick  when model gets are planned (§10.3): server =
                         requests wait at the server while its uplink still sends
                         the previous distribution, then form one batch; tick =
                         every 100 ms tick plans its new requests at once (old)
                                                                 default server
  --get_deadline_slack=X  > 0: a get batch may end X times later than the
                         fastest plan if that saves server copies
                                                                 default 0
  --aggregation=A        streaming: update batches may stream through
                         chains of workers, each adding its own;
                         alg3: the paper's Alg. 3 alone       default streaming
  --lr=X                 synchronous step size (async: lr/N)   default 0.3
  --class_separation=X   std of the class means (task difficulty)  default 0.5
  --conditioning=X       largest / smallest feature scale          default 30
  --model_bytes=B        update and model size                 default 100000000
  --compute_s=T          compute time per iteration            default 0.1
  --server_bps=R         server NIC (not traced)               default 1e10
  --servers=S            model shards, each a server on its own NIC (§10.2;
                         MLfabric-A/S only)                    default 1
  --batch_interval_s=T   MLfabric batching period                default 0.1
  --instant_planning     MLfabric-A/S plans take effect at their batch's cut
                         (the earlier simulator). Default false: each plan takes
                         effect at its cut plus the CPU time the real planner
                         took for it, one batch at a time, so a plan slower than
                         the interval delays the next cut (§7.4's overhead
                         charged). Either way the summary shows planning ms per
                         batch (plan_ms, p99, max) and late plans (late)
  --plan_lead_ms=L       with planning charged, plan each batch for its cut plus
                         L ms, when it will take effect (the live scheduler's
                         plan_lead_ms); -1 = the longest of the last 20 batches'
                         planning times; 0 = for the cut   default 0
  --monitor_lag_s=T      monitor lag seen by the planner       default 0.2
  --json_out=FILE        write all results as JSON
  --table2               run the C1-C3 x N1-N3 grid of MLfabric-A vs RR-Sync
  --table2_system=NAME   the MLfabric system of the grid       default mlfabric-a-30
  --calibration          the simulator against the paper's §2/§7.1 figures (ring
                         time, RR-Sync slowdown, MLfabric-A iteration time, drops)
  --overhead             §7.4 scheduler overhead for |U| in --overhead_sizes
  --overhead_sizes=LIST  default 10,30,100,250,500,1000
  --quiet                no progress output
)";

struct CliConfig {
  SimConfig sim;
  std::vector<std::string> systems = {"mlfabric-a-30", "async", "rr-sync"};
  std::string json_out;
  bool table2 = false;
  std::string table2_system = "mlfabric-a-30";
  bool overhead = false;
  bool calibration = false;
  std::vector<std::string> overhead_sizes = {"10", "30", "100", "250", "500", "1000"};
  bool quiet = false;
};

absl::StatusOr<CliConfig> LoadCli(const CommandLine& cl) {
  ASSIGN_OR_RETURN(ConfigReader reader, ConfigReader::FromCommandLine(cl));
  CliConfig c;
  int64_t workers = c.sim.workers, aggregators = c.sim.aggregators;
  int64_t distributors = c.sim.distributors;
  int64_t workers_per_host = c.sim.workers_per_host;
  int64_t servers = c.sim.servers;
  int64_t max_outstanding = c.sim.max_outstanding_pushes;
  int64_t seed = static_cast<int64_t>(c.sim.seed), model_bytes = c.sim.model_bytes;
  std::string compute = "C1", network = "N1", get_batching = "server";
  reader.Int("workers", &workers, 2, 1000);
  reader.Enum("compute", &compute, {"C0", "C1", "C2", "C3"});
  reader.Enum("network", &network, {"N0", "N1", "N2", "N3"});
  reader.StringList("systems", &c.systems);
  reader.Double("target_accuracy", &c.sim.target_accuracy, 0.01, 1.0);
  reader.Int("seed", &seed, 0, INT64_MAX);
  reader.Double("max_sim_s", &c.sim.max_sim_s, 0.001, 1e7);
  reader.Int("tau_max", &c.sim.tau_max, 1, 1000000);
  reader.Int("aggregators", &aggregators, -1, 1000);
  reader.Bool("aggregators_on_workers", &c.sim.aggregators_on_workers);
  reader.Int("distributors", &distributors, -1, 1000);
  reader.Int("workers_per_host", &workers_per_host, 1, 1000);
  reader.Double("intra_host_bps", &c.sim.intra_host_bps, 1e6, 1e15);
  reader.Int("max_outstanding_pushes", &max_outstanding, 0, 1000000);
  reader.Enum("get_batching", &get_batching, {"server", "tick"});
  reader.Double("get_deadline_slack", &c.sim.get_deadline_slack, 0, 1e6);
  std::string aggregation = "streaming";
  reader.Enum("aggregation", &aggregation, {"streaming", "alg3"});
  reader.Double("lr", &c.sim.sgd.lr, 1e-9, 1e3);
  reader.Double("class_separation", &c.sim.sgd.class_separation, 0, 100);
  reader.Double("conditioning", &c.sim.sgd.conditioning, 1, 1e6);
  reader.Int("model_bytes", &model_bytes, 1, int64_t{1} << 40);
  reader.Double("compute_s", &c.sim.compute_s, 1e-6, 1e4);
  reader.Double("server_bps", &c.sim.server_bps, 1e6, 1e13);
  reader.Int("servers", &servers, 1, 1000);
  reader.Double("batch_interval_s", &c.sim.batch_interval_s, 1e-4, 1e3);
  reader.Bool("instant_planning", &c.sim.instant_planning);
  reader.Double("plan_lead_ms", &c.sim.plan_lead_ms, -1, 60000);
  reader.Double("monitor_lag_s", &c.sim.monitor_lag_s, 0, 1e4);
  reader.String("json_out", &c.json_out);
  reader.Bool("table2", &c.table2);
  reader.String("table2_system", &c.table2_system);
  reader.Bool("overhead", &c.overhead);
  reader.Bool("calibration", &c.calibration);
  reader.StringList("overhead_sizes", &c.overhead_sizes);
  reader.Bool("quiet", &c.quiet);
  RETURN_IF_ERROR(reader.Finish());
  c.sim.workers = static_cast<int>(workers);
  c.sim.aggregators = static_cast<int>(aggregators);
  c.sim.distributors = static_cast<int>(distributors);
  c.sim.workers_per_host = static_cast<int>(workers_per_host);
  c.sim.servers = static_cast<int>(servers);
  c.sim.max_outstanding_pushes = static_cast<int>(max_outstanding);
  c.sim.seed = static_cast<uint64_t>(seed);
  c.sim.model_bytes = model_bytes;
  c.sim.streaming_aggregation = aggregation == "streaming";
  c.sim.get_batching = get_batching == "server" ? SimConfig::GetBatching::kServer
                                                : SimConfig::GetBatching::kTick;
  ASSIGN_OR_RETURN(c.sim.compute, ComputeSettingByName(compute));
  ASSIGN_OR_RETURN(c.sim.network, NetworkSettingByName(network));
  RETURN_IF_ERROR(ValidateConfig(c.sim));
  for (const std::string& s : c.systems) RETURN_IF_ERROR(ParseSystem(s).status());
  return c;
}

ProgressFn MakeProgress(bool quiet) {
  if (quiet) return nullptr;
  auto last = std::make_shared<std::chrono::steady_clock::time_point>(
      std::chrono::steady_clock::now());
  return [last](const std::string& system, double sim_s, double accuracy) {
    const auto now = std::chrono::steady_clock::now();
    if (now - *last < std::chrono::seconds(2)) return;
    *last = now;
    std::fprintf(stderr, "  [%s] simulated %.1f s, test accuracy %.3f\n", system.c_str(), sim_s,
                 accuracy);
  };
}

absl::Status WriteJson(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return absl::OkStatus();
  std::ofstream out(path);
  if (!out) return absl::InvalidArgumentError(absl::StrCat("json_out: cannot write '", path, "'"));
  out << j.dump(2) << "\n";
  std::fprintf(stderr, "wrote %s\n", path.c_str());
  return absl::OkStatus();
}

absl::Status Main(int argc, char** argv) {
  // Bare boolean flags (`--table2`) become `--table2=true`.
  std::vector<std::string> args(argv, argv + argc);
  for (std::string& a : args) {
    if (a == "--table2" || a == "--overhead" || a == "--calibration" || a == "--quiet" ||
        a == "--instant_planning") {
      a += "=true";
    }
  }
  std::vector<const char*> raw;
  for (const std::string& a : args) raw.push_back(a.c_str());
  ASSIGN_OR_RETURN(CommandLine cl, ParseCommandLine(static_cast<int>(raw.size()), raw.data()));
  if (cl.help) {
    std::cout << kHelp;
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(CliConfig c, LoadCli(cl));
  const ProgressFn progress = MakeProgress(c.quiet);

  if (c.overhead) {
    std::vector<int> sizes;
    for (const std::string& s : c.overhead_sizes) {
      int v = 0;
      if (!absl::SimpleAtoi(s, &v) || v < 2 || v > 5000) {
        return absl::InvalidArgumentError(absl::StrCat("overhead_sizes: bad size '", s, "'"));
      }
      sizes.push_back(v);
    }
    // §7.4's synthetic batches have no cluster layout; -1 keeps the old 4.
    const int k = c.sim.aggregators < 0 ? 4 : c.sim.aggregators;
    std::printf("Scheduler overhead (§7.4): real core planner \"mlfabric\", %d aggregators, "
                "one call per batch, wall clock on this machine\n",
                k);
    ASSIGN_OR_RETURN(std::vector<OverheadRow> rows, MeasureOverhead(sizes, k, c.sim.seed));
    std::cout << OverheadReport(rows);
    nlohmann::json j = nlohmann::json::array();
    for (const OverheadRow& r : rows) {
      j.push_back({{"updates", r.updates}, {"hosts", r.hosts}, {"repetitions", r.repetitions},
                   {"ms_min", r.ms_min}, {"ms_mean", r.ms_mean}, {"ms_max", r.ms_max},
                   {"dropped_mean", r.dropped_mean}});
    }
    return WriteJson(c.json_out, {{"overhead", j}});
  }

  if (c.calibration) {
    std::printf("Calibration against the paper's §2/§7.1 figures: %d workers, target accuracy "
                "%.3f, seed %llu\n",
                c.sim.workers, c.sim.target_accuracy,
                static_cast<unsigned long long>(c.sim.seed));
    ASSIGN_OR_RETURN(std::vector<CalibrationRow> rows, RunCalibration(c.sim, progress));
    std::cout << CalibrationReport(rows);
    return WriteJson(c.json_out,
                     {{"config", ConfigToJson(c.sim)}, {"calibration", CalibrationToJson(rows)}});
  }

  if (c.table2) {
    std::printf("Table 2 grid: %s vs rr-sync, %d workers, target accuracy %.3f, seed %llu\n",
                c.table2_system.c_str(), c.sim.workers, c.sim.target_accuracy,
                static_cast<unsigned long long>(c.sim.seed));
    ASSIGN_OR_RETURN(std::vector<Table2Cell> cells,
                     RunTable2(c.sim, c.table2_system, progress));
    std::cout << Table2Report(cells);
    return WriteJson(c.json_out, {{"config", ConfigToJson(c.sim)}, {"table2", Table2ToJson(cells)}});
  }

  std::printf("%d workers, %s, %s, target accuracy %.3f, seed %llu, %s\n", c.sim.workers,
              c.sim.compute.name.c_str(), c.sim.network.name.c_str(), c.sim.target_accuracy,
              static_cast<unsigned long long>(c.sim.seed),
              c.sim.instant_planning ? "instant planning"
                                     : "planning time charged (planner CPU time)");
  std::vector<SystemResult> results;
  nlohmann::json runs = nlohmann::json::array();
  for (const std::string& name : c.systems) {
    ASSIGN_OR_RETURN(SystemSpec spec, ParseSystem(name));
    if (!c.quiet) std::fprintf(stderr, "running %s ...\n", name.c_str());
    ASSIGN_OR_RETURN(SystemResult r, RunSystem(c.sim, spec, progress));
    runs.push_back(ResultToJson(r));
    results.push_back(std::move(r));
  }
  std::cout << SummaryTable(results);
  return WriteJson(c.json_out, {{"config", ConfigToJson(c.sim)}, {"runs", runs}});
}

}  // namespace
}  // namespace mlfabric::sim

int main(int argc, char** argv) {
  const absl::Status status = mlfabric::sim::Main(argc, argv);
  if (!status.ok()) {
    std::fprintf(stderr, "mlfabric-sim: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
