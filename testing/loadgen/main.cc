// mlfabric-loadgen: one real mlfabric-scheduler driven by many emulated
// daemons (load_generator.h) over real gRPC, with no data plane: how long a
// batch cycle takes, how much CPU and memory the scheduler uses and how many
// control-plane messages it carries at 1000 workers (issue 18 item 3).
//
//   bazel run -c opt //testing/loadgen:mlfabric-loadgen -- --workers=1000 --duration_s=600
//
// It starts the scheduler itself (a private directory under /tmp, removed
// afterwards; --scheduler_flag=--KEY=VALUE passes flags on), prints a
// progress line every --progress_s and a summary at the end, and exits 1 if
// the run lost, duplicated or refused anything (LoadReport::Consistent).
// --help lists the flags.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/secrets.h"
#include "nlohmann/json.hpp"
#include "launch/cluster.h"
#include "testing/http_client.h"
#include "testing/loadgen/load_generator.h"

namespace mlfabric::testing {
namespace {

using launch::Cluster;
using launch::ClusterOptions;

constexpr char kUsage[] = R"(mlfabric-loadgen: drive a real mlfabric-scheduler with emulated daemons

  --workers=N              workers (default 1000)
  --workers_per_host=N     workers per emulated host (default 1: a host each)
  --servers=N              parameter servers, each on its own host (default 1)
  --period_ms=MS           a worker's compute time between get and push (default 100)
  --update_mb=MB           update and model size (default 100)
  --link_gbps=G            every host's NIC, each direction (default 10)
  --aggregators=N          the job names the first N worker hosts as aggregators (default 0)
  --tau_max=N              the job's delay bound (default 30)
  --planner=NAME           mlfabric or fifo (default mlfabric)
  --batch_interval_ms=MS   the scheduler's batch interval (default 100)
  --duration_s=S           how long the workers push (default 60)
  --drain_s=S              how long to wait for the last outcomes (default 60)
  --progress_s=S           a progress line this often (default 10)
  --driver_threads=N       threads making the emulated daemons' calls (default 8)
  --scheduler_flag=FLAG    passed to mlfabric-scheduler (comma-separated for several)
  --json=PATH              also write the summary as JSON here
)";

struct ProcSample {
  double cpu_s = 0;     // user + system
  double rss_mb = 0;
  double hwm_mb = 0;    // peak resident
};

ProcSample SampleProcess(pid_t pid) {
  ProcSample sample;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (std::getline(stat, line)) {
    // Fields after the command name, which is in parentheses.
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::vector<std::string> fields;
    std::string field;
    while (rest >> field) fields.push_back(field);
    if (fields.size() > 12) {
      const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
      sample.cpu_s = (std::stod(fields[11]) + std::stod(fields[12])) / ticks;
    }
  }
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) sample.rss_mb = std::stod(line.substr(6)) / 1024;
    if (line.rfind("VmHWM:", 0) == 0) sample.hwm_mb = std::stod(line.substr(6)) / 1024;
  }
  return sample;
}

double Quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  const size_t rank = std::min(values.size() - 1, static_cast<size_t>(q * values.size()));
  std::nth_element(values.begin(), values.begin() + rank, values.end());
  return values[rank];
}

// Collects the scheduler's batch cycles (GET /api/v1/cycles) that started
// after the last one it saw, so that the whole run's cycles are counted
// once however long it runs (the endpoint keeps the last 1,024).
class CycleCollector {
 public:
  explicit CycleCollector(int admin_port) : admin_port_(admin_port) {}
  // New cycles' total times (ms), also kept for the run's figures.
  std::vector<double> Poll() {
    std::vector<double> fresh;
    HttpResult r = Http(admin_port_, "GET", "/api/v1/cycles");
    if (r.status != 200) return fresh;
    const nlohmann::json body = nlohmann::json::parse(r.body, nullptr, false);
    if (body.is_discarded()) return fresh;
    for (const auto& cycle : body.value("cycles", nlohmann::json::array())) {
      const double start_s = cycle.value("start_s", 0.0);
      if (start_s <= last_start_s_) continue;
      last_start_s_ = start_s;
      fresh.push_back(cycle.value("total_ms", 0.0));
      updates_.push_back(cycle.value("updates", 0.0));
    }
    all_.insert(all_.end(), fresh.begin(), fresh.end());
    return fresh;
  }
  const std::vector<double>& all() const { return all_; }
  const std::vector<double>& updates() const { return updates_; }

 private:
  const int admin_port_;
  double last_start_s_ = -1e300;
  std::vector<double> all_;
  std::vector<double> updates_;
};

// The command line's settings (kUsage).
struct LoadFlags {
  int64_t workers = 1000, workers_per_host = 1, servers = 1, aggregators = 0, tau_max = 30,
          driver_threads = 8;
  double period_ms = 100, update_mb = 100, link_gbps = 10, batch_interval_ms = 100,
         duration_s = 60, drain_s = 60, progress_s = 10;
  std::string planner = "mlfabric", json_path;
  std::vector<std::string> scheduler_flags;
};

absl::Status ReadFlags(ConfigReader& reader, LoadFlags* f) {
  reader.Int("workers", &f->workers, 1, 100000);
  reader.Int("workers_per_host", &f->workers_per_host, 1, 100000);
  reader.Int("servers", &f->servers, 1, 1000);
  reader.Int("aggregators", &f->aggregators, 0, 100000);
  reader.Int("tau_max", &f->tau_max, 0, 1000000);
  reader.Int("driver_threads", &f->driver_threads, 1, 256);
  reader.Double("period_ms", &f->period_ms, 1, 600000);
  reader.Double("update_mb", &f->update_mb, 1e-6, 100000);
  reader.Double("link_gbps", &f->link_gbps, 1e-3, 10000);
  reader.Double("batch_interval_ms", &f->batch_interval_ms, 1, 60000);
  reader.Double("duration_s", &f->duration_s, 0.1, 86400);
  reader.Double("drain_s", &f->drain_s, 1, 3600);
  reader.Double("progress_s", &f->progress_s, 0.5, 3600);
  reader.Enum("planner", &f->planner, {"mlfabric", "fifo"});
  reader.String("json", &f->json_path);
  std::string extra;
  reader.String("scheduler_flag", &extra);
  if (!extra.empty()) f->scheduler_flags = absl::StrSplit(extra, ',');
  return reader.Finish();
}

// Writes the job "load" (and its aggregators, the first worker hosts) to
// the scheduler's config and starts the scheduler.
absl::Status StartScheduler(Cluster& cluster, const LoadFlags& f, int worker_hosts,
                            const std::string& token) {
  nlohmann::json job = {{"name", "load"}, {"token", token}, {"mode", "async"},
                        {"tau_max", f.tau_max}};
  if (f.aggregators > 0) {
    nlohmann::json names = nlohmann::json::array();
    for (int64_t i = 0; i < std::min<int64_t>(f.aggregators, worker_hosts); ++i) {
      char name[16];
      std::snprintf(name, sizeof(name), "h%04d", static_cast<int>(i));
      names.push_back(name);
    }
    job["aggregators"] = names;
  }
  const std::string config_path = cluster.dir() + "/load.json";
  {
    std::ofstream(config_path) << nlohmann::json{{"jobs", {job}}}.dump(2);
  }
  std::vector<std::string> flags = {"--config=" + config_path, "--planner=" + f.planner,
                                    absl::StrCat("--batch_interval_ms=", f.batch_interval_ms)};
  flags.insert(flags.end(), f.scheduler_flags.begin(), f.scheduler_flags.end());
  return cluster.Start(flags);
}

LoadOptions MakeLoadOptions(Cluster& cluster, const LoadFlags& f, const std::string& token) {
  std::string secret;
  {
    std::ifstream file(cluster.dir() + "/cluster.secret");
    std::getline(file, secret);
  }
  LoadOptions options;
  options.scheduler_address = cluster.scheduler_address();
  options.cluster_secret = secret;
  options.job = "load";
  options.job_token = token;
  options.workers = static_cast<int>(f.workers);
  options.workers_per_host = static_cast<int>(f.workers_per_host);
  options.servers = static_cast<int>(f.servers);
  options.period_s = f.period_ms / 1e3;
  options.update_bytes = static_cast<int64_t>(f.update_mb * 1e6);
  options.link_bps = f.link_gbps * 1e9;
  options.driver_threads = static_cast<int>(f.driver_threads);
  return options;
}

// The load for duration_s, with a progress line every progress_s; returns
// the time it ran. `rss_series` gets the scheduler's RSS at each line.
double RunLoad(LoadGenerator& load, CycleCollector& cycles, pid_t scheduler_pid,
               const LoadFlags& f, const ProcSample& first, std::vector<double>* rss_series) {
  ProcSample last = first;
  LoadReport previous = load.Snapshot();
  const auto begin = std::chrono::steady_clock::now();
  double elapsed_s = 0;
  while (elapsed_s < f.duration_s) {
    const double step_s = std::min(f.progress_s, f.duration_s - elapsed_s);
    std::this_thread::sleep_for(std::chrono::duration<double>(step_s));
    elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    const std::vector<double> fresh = cycles.Poll();
    const ProcSample now = SampleProcess(scheduler_pid);
    const LoadReport r = load.Snapshot();
    const double dt = step_s;
    rss_series->push_back(now.rss_mb);
    std::printf("t=%5.0fs pushes/s %6.0f outcomes/s %6.0f (applied %4.0f) gets/s %6.0f "
                "ctl msgs/s %6.0f | cycles %3zu p50 %6.1f ms p99 %6.1f ms | scheduler CPU "
                "%3.0f%% RSS %5.0f MB\n",
                elapsed_s, (r.pushes - previous.pushes) / dt,
                ((r.applied + r.dropped + r.failed) -
                 (previous.applied + previous.dropped + previous.failed)) / dt,
                (r.applied - previous.applied) / dt, (r.gets_answered - previous.gets_answered) / dt,
                ((r.rpcs + r.commands) - (previous.rpcs + previous.commands)) / dt, fresh.size(),
                Quantile(fresh, 0.5), Quantile(fresh, 0.99), 100 * (now.cpu_s - last.cpu_s) / dt,
                now.rss_mb);
    std::fflush(stdout);
    previous = r;
    last = now;
  }
  return elapsed_s;
}

// The run's figures, for the summary and --json.
struct Summary {
  double elapsed_s = 0, register_s = 0;
  double p50 = 0, p99 = 0, max_ms = 0, mean_updates = 0, msgs_per_s = 0, cpu_pct = 0;
  int64_t over = 0;  // cycles longer than the batch interval
  std::vector<double> rss_series;
};

Summary Summarize(const LoadFlags& f, const CycleCollector& cycles, const LoadReport& under_load,
                  const ProcSample& first, const ProcSample& loaded, double elapsed_s) {
  Summary s;
  s.elapsed_s = elapsed_s;
  const std::vector<double>& all = cycles.all();
  s.p50 = Quantile(all, 0.5);
  s.p99 = Quantile(all, 0.99);
  s.max_ms = all.empty() ? 0 : *std::max_element(all.begin(), all.end());
  s.over = std::count_if(all.begin(), all.end(),
                         [&](double ms) { return ms > f.batch_interval_ms; });
  s.mean_updates =
      cycles.updates().empty()
          ? 0
          : std::accumulate(cycles.updates().begin(), cycles.updates().end(), 0.0) /
                static_cast<double>(cycles.updates().size());
  s.msgs_per_s = (under_load.rpcs + under_load.commands) / under_load.elapsed_s;
  s.cpu_pct = 100 * (loaded.cpu_s - first.cpu_s) / elapsed_s;
  return s;
}

void PrintSummary(const LoadFlags& f, const Summary& s, const LoadReport& report,
                  const LoadReport& under_load, size_t cycles, const ProcSample& end) {
  const double elapsed_s = s.elapsed_s;
  rusage self{};
  ::getrusage(RUSAGE_SELF, &self);
  const double self_cpu_s = self.ru_utime.tv_sec + self.ru_utime.tv_usec / 1e6 +
                            self.ru_stime.tv_sec + self.ru_stime.tv_usec / 1e6;
  std::printf("\nsummary (%.0f s of load, %lld workers):\n", elapsed_s,
              static_cast<long long>(f.workers));
  std::printf("  pushes %lld (%.0f/s): applied %lld, dropped %lld, failed %lld, open %lld\n",
              static_cast<long long>(report.pushes), under_load.pushes / elapsed_s,
              static_cast<long long>(report.applied), static_cast<long long>(report.dropped),
              static_cast<long long>(report.failed),
              static_cast<long long>(report.without_outcome));
  for (const auto& [reason, count] : report.reasons) {
    std::printf("    %-40s %lld\n", reason.c_str(), static_cast<long long>(count));
  }
  std::printf("  gets %lld answered of %lld in %lld distributions\n",
              static_cast<long long>(report.gets_answered), static_cast<long long>(report.gets),
              static_cast<long long>(report.distributions));
  std::printf("  batch cycles %zu (%.0f updates each on average): p50 %.1f ms, p99 %.1f ms, "
              "max %.1f ms, %lld longer than the %.0f ms interval\n",
              cycles, s.mean_updates, s.p50, s.p99, s.max_ms, static_cast<long long>(s.over),
              f.batch_interval_ms);
  std::printf("  control-plane messages %.0f/s (unary calls and stream commands)\n", s.msgs_per_s);
  std::printf("  scheduler CPU %.0f%% of one core under load; RSS %.0f MB after %.0f s, %.0f MB "
              "at the end; peak %.0f MB\n",
              s.cpu_pct, s.rss_series.empty() ? 0.0 : s.rss_series.front(),
              std::min(f.progress_s, elapsed_s), end.rss_mb, end.hwm_mb);
  std::printf("  this load generator: %.0f%% of one core\n",
              100 * self_cpu_s / (elapsed_s + s.register_s));
}

void WriteJson(const LoadFlags& f, const Summary& s, const LoadReport& report, size_t cycles,
               const ProcSample& end) {
  nlohmann::json out = {{"workers", f.workers},
                        {"hosts", report.hosts},
                        {"servers", f.servers},
                        {"duration_s", s.elapsed_s},
                        {"pushes", report.pushes},
                        {"applied", report.applied},
                        {"dropped", report.dropped},
                        {"failed", report.failed},
                        {"reasons", report.reasons},
                        {"gets", report.gets},
                        {"cycles", cycles},
                        {"cycle_p50_ms", s.p50},
                        {"cycle_p99_ms", s.p99},
                        {"cycle_max_ms", s.max_ms},
                        {"cycles_over_interval", s.over},
                        {"messages_per_s", s.msgs_per_s},
                        {"scheduler_cpu_pct", s.cpu_pct},
                        {"rss_mb_series", s.rss_series},
                        {"peak_rss_mb", end.hwm_mb},
                        {"consistent", report.Consistent()}};
  std::ofstream(f.json_path) << out.dump(2) << "\n";
}

int Main(int argc, char** argv) {
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) {
    std::cerr << "mlfabric-loadgen: " << cl.status().message() << "\n" << kUsage;
    return 2;
  }
  if (cl->help) {
    std::cout << kUsage;
    return 0;
  }
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  LoadFlags f;
  if (absl::Status status = ReadFlags(reader, &f); !status.ok()) {
    std::cerr << "mlfabric-loadgen: " << status.message() << "\n" << kUsage;
    return 2;
  }

  ClusterOptions cluster_options;
  cluster_options.admin = true;  // the batch cycles come from GET /api/v1/cycles
  auto cluster = Cluster::Create(cluster_options);
  if (!cluster.ok()) {
    std::cerr << "mlfabric-loadgen: " << cluster.status().message() << "\n";
    return 1;
  }
  const int worker_hosts =
      static_cast<int>((f.workers + f.workers_per_host - 1) / f.workers_per_host);
  const std::string token = RandomHex(16);
  if (absl::Status started = StartScheduler(**cluster, f, worker_hosts, token); !started.ok()) {
    std::cerr << "mlfabric-loadgen: " << started.message() << "\n";
    return 1;
  }
  const LoadOptions options = MakeLoadOptions(**cluster, f, token);
  const pid_t scheduler_pid = (*cluster)->scheduler().pid();
  std::printf("mlfabric-loadgen: %lld workers on %d hosts, %lld server(s), %.0f ms compute, "
              "%.1f MB updates, %.1f Gbit/s NICs, planner %s, %.0f ms batches, %.0f s; "
              "scheduler pid %d, admin port %d, %u CPUs\n",
              static_cast<long long>(f.workers), worker_hosts, static_cast<long long>(f.servers),
              f.period_ms, f.update_mb, f.link_gbps, f.planner.c_str(), f.batch_interval_ms,
              f.duration_s, static_cast<int>(scheduler_pid), (*cluster)->admin_port(),
              std::thread::hardware_concurrency());
  std::fflush(stdout);

  LoadGenerator load(options);
  const auto registering = std::chrono::steady_clock::now();
  if (absl::Status started = load.Start(); !started.ok()) {
    std::cerr << "mlfabric-loadgen: " << started.message() << "\n";
    return 1;
  }
  const double register_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - registering).count();
  std::printf("registered %lld hosts and %lld entities in %.2f s\n",
              static_cast<long long>(worker_hosts + f.servers),
              static_cast<long long>(f.workers + f.servers), register_s);
  std::fflush(stdout);

  CycleCollector cycles((*cluster)->admin_port());
  cycles.Poll();  // registration's cycles are not the load's
  const ProcSample first = SampleProcess(scheduler_pid);
  std::vector<double> rss_series;
  const double elapsed_s = RunLoad(load, cycles, scheduler_pid, f, first, &rss_series);
  const LoadReport under_load = load.Snapshot();
  const ProcSample loaded = SampleProcess(scheduler_pid);
  cycles.Poll();
  LoadReport report = load.Drain(f.drain_s);
  const ProcSample end = SampleProcess(scheduler_pid);

  Summary summary = Summarize(f, cycles, under_load, first, loaded, elapsed_s);
  summary.register_s = register_s;
  summary.rss_series = std::move(rss_series);
  PrintSummary(f, summary, report, under_load, cycles.all().size(), end);
  if (!f.json_path.empty()) WriteJson(f, summary, report, cycles.all().size(), end);
  if (!report.Consistent()) {
    std::printf("INCONSISTENT:\n");
    for (const std::string& problem : report.Problems()) std::printf("  %s\n", problem.c_str());
    return 1;
  }
  std::printf("consistent: every push ended once, every get answered, no stream broke\n");
  return 0;
}

}  // namespace
}  // namespace mlfabric::testing

int main(int argc, char** argv) { return mlfabric::testing::Main(argc, argv); }
