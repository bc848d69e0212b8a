// mlfabric-loadgen: one real mlfabric-scheduler driven by many emulated
// daemons (load_generator.h) over real gRPC, with no data plane: how long a
// batch cycle takes, how much CPU and memory the scheduler uses and how many
// control-plane messages it carries at 1000 workers.
//
//   bazel run -c opt //testing/loadgen:mlfabric-loadgen -- --workers=1000 --duration_s=600
//   ... -- --workers=1000 --shards=64       # one model in 64 shards (mlfabric.md §10.2)
//   ... -- --jobs=10 --workers=100          # ten independent jobs
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
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

  --workers=N              workers per job (default 1000)
  --jobs=J                 independent jobs, each with --workers workers and its own
                           servers and hosts (default 1)
  --workers_per_host=N     workers per emulated host (default 1: a host each)
  --servers=N              push targets per job: parameter servers, each on its own host,
                           or server groups with --shards (default 1)
  --shards=S               each target is a server group of S shard servers, each on its
                           own host, splitting the model by byte ranges (default 1: no group;
                           the scheduler takes at most 128)
  --period_ms=MS           a worker's compute time between get and push (default 100)
  --update_mb=MB           update and model size (default 100; with --shards > 1 or
                           --jobs > 1: half of what the links can carry, see below)
  --link_gbps=G            every host's NIC, each direction (default 10)
  --aggregators=N          each job names its first N worker hosts as aggregators (default 0)
  --tau_max=N              each job's delay bound (default 30; with --shards > 1 or
                           --jobs > 1: from the workers of a target, see below)
  --planner=NAME           mlfabric or fifo (default mlfabric)
  --batch_interval_ms=MS   the scheduler's batch interval (default 100)
  --duration_s=S           how long the workers push (default 60)
  --drain_s=S              how long to wait for the last outcomes (default 60)
  --progress_s=S           a progress line this often (default 10)
  --driver_threads=N       threads making the emulated daemons' calls (default 8)
  --scheduler_flag=FLAG    passed to mlfabric-scheduler (comma-separated for several)
  --json=PATH              also write the summary as JSON here

With --shards > 1 or --jobs > 1 the defaults make a load the links carry, so
that the scheduler has to plan (not drop) most pushes: --update_mb is half of
link_gbps * period_ms * shards / (8 * workers per target), the size at which a
shard's downlink would be full if every worker pushed once per period, and
--tau_max is 2 * workers per target * (period_ms + batch_interval_ms) / period_ms
(a push waits for about one push of every other worker of its target per
period, for its compute and its wait for a batch). The summary says which values were used.
)";

struct ProcSample {
  double t_s = 0;       // since the load began
  double cpu_s = 0;     // user + system, since the process started
  double rss_mb = 0;
  double hwm_mb = 0;    // peak resident
};

ProcSample SampleProcess(pid_t pid, double t_s) {
  ProcSample sample;
  sample.t_s = t_s;
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

double Max(const std::vector<double>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

// Collects the scheduler's batch cycles (GET /api/v1/cycles) that started
// after the last one it saw, so that the whole run's cycles are counted
// once however long it runs (the endpoint keeps the last 1,024).
class CycleCollector {
 public:
  explicit CycleCollector(int admin_port) : admin_port_(admin_port) {}
  // How many new cycles; their total and planning times (ms) are kept for
  // the run's figures and for recent().
  size_t Poll() {
    size_t fresh = 0;
    HttpResult r = Http(admin_port_, "GET", "/api/v1/cycles");
    if (r.status != 200) return fresh;
    const nlohmann::json body = nlohmann::json::parse(r.body, nullptr, false);
    if (body.is_discarded()) return fresh;
    for (const auto& cycle : body.value("cycles", nlohmann::json::array())) {
      const double start_s = cycle.value("start_s", 0.0);
      if (start_s <= last_start_s_) continue;
      last_start_s_ = start_s;
      ++fresh;
      all_.push_back(cycle.value("total_ms", 0.0));
      plan_.push_back(cycle.value("plan_ms", 0.0));
      parts_.push_back(CycleParts{cycle.value("lock_wait_ms", 0.0), cycle.value("cut_ms", 0.0),
                                  cycle.value("plan_ms", 0.0), cycle.value("dispatch_ms", 0.0),
                                  cycle.value("total_ms", 0.0)});
      updates_.push_back(cycle.value("updates", 0.0));
      batches_.push_back(cycle.value("batches", 0.0));
    }
    return fresh;
  }
  // The last `n` cycles' total or planning times.
  static std::vector<double> Last(const std::vector<double>& v, size_t n) {
    return {v.end() - static_cast<std::ptrdiff_t>(std::min(n, v.size())), v.end()};
  }
  const std::vector<double>& all() const { return all_; }
  const std::vector<double>& plan() const { return plan_; }
  const std::vector<double>& updates() const { return updates_; }
  const std::vector<double>& batches() const { return batches_; }
  // Where a cycle's time went (GET /api/v1/cycles), in ms.
  struct CycleParts {
    double lock_wait = 0, cut = 0, plan = 0, dispatch = 0, total = 0;
  };
  const std::vector<CycleParts>& parts() const { return parts_; }

 private:
  const int admin_port_;
  double last_start_s_ = -1e300;
  std::vector<double> all_;      // each cycle's total time, ms
  std::vector<double> plan_;     // its planners' wall time, ms (batches in parallel)
  std::vector<double> updates_;  // updates planned in it
  std::vector<double> batches_;  // servers (batches) planned in it
  std::vector<CycleParts> parts_;
};

// The command line's settings (kUsage).
struct LoadFlags {
  int64_t workers = 1000, jobs = 1, workers_per_host = 1, servers = 1, shards = 1,
          aggregators = 0, tau_max = 30, driver_threads = 8;
  double period_ms = 100, update_mb = 100, link_gbps = 10, batch_interval_ms = 100,
         duration_s = 60, drain_s = 60, progress_s = 10;
  std::string planner = "mlfabric", json_path;
  std::vector<std::string> scheduler_flags;
};

// With several shards or jobs, the update size and delay bound the user
// did not set are chosen so that the links carry the load (kUsage):
//  - a target's W workers push at most once per period each, and every
//    push puts B/S bytes on each of its S shards' downlinks (and every get
//    the same on their uplinks), so the busiest link carries at most
//    8 * B * W / (S * period_s) bit/s; half the link rate leaves room for
//    the bandwidth reports' dips (up to 20% below the NIC's rate) and for
//    workers whose gets came fast. A worker's own uplink caps B at
//    link_bps * period_s / 8 as well.
//  - a push's delay is the number of pushes its target applied between
//    the worker's get and its own. That time is its compute (one period)
//    plus up to one batch interval before it is planned plus its transfer,
//    and the target applies about W pushes per period when the scheduler
//    keeps up: about W * (period + interval) / period. tau_max is twice
//    that; stale drops beyond it mean the scheduler is behind.
void ChooseDefaults(const std::map<std::string, std::string>& given, LoadFlags* f) {
  if (f->shards == 1 && f->jobs == 1) return;  // the one-server benchmark as it was
  const double per_target = std::ceil(static_cast<double>(f->workers) / f->servers);
  const double link_bytes_per_period = f->link_gbps * 1e9 * f->period_ms / 1e3 / 8;
  if (given.count("update_mb") == 0) {
    const double bytes =
        0.5 * std::min(link_bytes_per_period * f->shards / per_target, link_bytes_per_period);
    f->update_mb = std::floor(bytes / 4) * 4 / 1e6;  // whole float32 elements
  }
  if (given.count("tau_max") == 0) {
    f->tau_max = static_cast<int64_t>(
        std::ceil(2 * per_target * (f->period_ms + f->batch_interval_ms) / f->period_ms));
  }
}

absl::Status ReadFlags(ConfigReader& reader, LoadFlags* f) {
  reader.Int("workers", &f->workers, 1, 100000);
  reader.Int("jobs", &f->jobs, 1, 1000);
  reader.Int("workers_per_host", &f->workers_per_host, 1, 100000);
  reader.Int("servers", &f->servers, 1, 1000);
  reader.Int("shards", &f->shards, 1, 1000);
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

// Job j's name and its hosts' prefix: "load" and none for one job, as
// before; "load<j>" and "j<j>-" for several.
std::string JobName(const LoadFlags& f, int64_t j) {
  return f.jobs == 1 ? "load" : absl::StrCat("load", j);
}
std::string HostPrefix(const LoadFlags& f, int64_t j) {
  return f.jobs == 1 ? "" : absl::StrCat("j", j, "-");
}

// Writes the jobs (each with its aggregators, its first worker hosts) to
// the scheduler's config and starts the scheduler.
absl::Status StartScheduler(Cluster& cluster, const LoadFlags& f, int worker_hosts,
                            const std::vector<std::string>& tokens) {
  nlohmann::json jobs = nlohmann::json::array();
  for (int64_t j = 0; j < f.jobs; ++j) {
    nlohmann::json job = {{"name", JobName(f, j)}, {"token", tokens[j]}, {"mode", "async"},
                          {"tau_max", f.tau_max}};
    if (f.aggregators > 0) {
      nlohmann::json names = nlohmann::json::array();
      for (int64_t i = 0; i < std::min<int64_t>(f.aggregators, worker_hosts); ++i) {
        char name[16];
        std::snprintf(name, sizeof(name), "h%04d", static_cast<int>(i));
        names.push_back(HostPrefix(f, j) + name);
      }
      job["aggregators"] = names;
    }
    jobs.push_back(job);
  }
  const std::string config_path = cluster.dir() + "/load.json";
  {
    std::ofstream(config_path) << nlohmann::json{{"jobs", jobs}}.dump(2);
  }
  std::vector<std::string> flags = {"--config=" + config_path, "--planner=" + f.planner,
                                    absl::StrCat("--batch_interval_ms=", f.batch_interval_ms)};
  flags.insert(flags.end(), f.scheduler_flags.begin(), f.scheduler_flags.end());
  return cluster.Start(flags);
}

LoadOptions MakeLoadOptions(Cluster& cluster, const LoadFlags& f, int64_t job,
                            const std::string& token) {
  std::string secret;
  {
    std::ifstream file(cluster.dir() + "/cluster.secret");
    std::getline(file, secret);
  }
  LoadOptions options;
  options.scheduler_address = cluster.scheduler_address();
  options.cluster_secret = secret;
  options.job = JobName(f, job);
  options.job_token = token;
  options.host_prefix = HostPrefix(f, job);
  options.workers = static_cast<int>(f.workers);
  options.workers_per_host = static_cast<int>(f.workers_per_host);
  options.servers = static_cast<int>(f.servers);
  options.shards = static_cast<int>(f.shards);
  options.period_s = f.period_ms / 1e3;
  options.update_bytes = static_cast<int64_t>(std::llround(f.update_mb * 1e6));
  if (f.shards > 1) options.update_bytes -= options.update_bytes % 4;
  options.link_bps = f.link_gbps * 1e9;
  // The driver threads are shared out among the jobs, at least two each.
  options.driver_threads =
      static_cast<int>(std::max<int64_t>(2, (f.driver_threads + f.jobs - 1) / f.jobs));
  options.seed = 1 + static_cast<uint64_t>(job);
  return options;
}

// Every job's generator; their reports summed.
struct Load {
  std::vector<std::unique_ptr<LoadGenerator>> jobs;
  LoadReport Snapshot() const {
    LoadReport sum;
    for (const auto& job : jobs) sum.Add(job->Snapshot());
    return sum;
  }
  LoadReport Drain(double timeout_s) {
    for (auto& job : jobs) job->StopLoad();
    LoadReport sum;
    for (auto& job : jobs) sum.Add(job->Drain(timeout_s));
    return sum;
  }
};

// What happened between two snapshots: the counts the rates come from.
// (With several jobs, the first ones push while the last ones register.)
LoadReport Since(const LoadReport& now, const LoadReport& before) {
  LoadReport d;
  d.elapsed_s = now.elapsed_s - before.elapsed_s;
  d.pushes = now.pushes - before.pushes;
  d.applied = now.applied - before.applied;
  d.dropped = now.dropped - before.dropped;
  d.failed = now.failed - before.failed;
  d.rpcs = now.rpcs - before.rpcs;
  d.commands = now.commands - before.commands;
  d.gets_answered = now.gets_answered - before.gets_answered;
  return d;
}

// Pushes ended per second since `before`: applied, dropped, failed.
std::string OutcomeRates(const LoadReport& r, const LoadReport& before, double dt) {
  return absl::StrFormat("applied %5.0f dropped %5.0f failed %3.0f",
                         (r.applied - before.applied) / dt, (r.dropped - before.dropped) / dt,
                         (r.failed - before.failed) / dt);
}

// The load for duration_s, with a progress line every progress_s; returns
// the time it ran. `samples` gets the scheduler's CPU and RSS at each line.
double RunLoad(const Load& load, CycleCollector& cycles, pid_t scheduler_pid, const LoadFlags& f,
               ProcSample first, std::vector<ProcSample>* samples) {
  ProcSample last = first;
  LoadReport previous = load.Snapshot();
  const auto begin = std::chrono::steady_clock::now();
  double elapsed_s = 0;
  while (elapsed_s < f.duration_s) {
    const double step_s = std::min(f.progress_s, f.duration_s - elapsed_s);
    std::this_thread::sleep_for(std::chrono::duration<double>(step_s));
    const double before_s = elapsed_s;
    elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    const size_t fresh = cycles.Poll();
    const ProcSample now = SampleProcess(scheduler_pid, elapsed_s);
    const LoadReport r = load.Snapshot();
    const double dt = elapsed_s - before_s;
    samples->push_back(now);
    const std::vector<double> total = CycleCollector::Last(cycles.all(), fresh);
    const std::vector<double> plan = CycleCollector::Last(cycles.plan(), fresh);
    std::printf("t=%5.0fs pushes/s %6.0f: %s | gets/s %6.0f ctl msgs/s %6.0f | cycles %3zu "
                "p50 %6.1f p99 %6.1f ms, planning p50 %6.1f p99 %6.1f ms | scheduler CPU %3.0f%% "
                "RSS %5.0f MB\n",
                elapsed_s, (r.pushes - previous.pushes) / dt, OutcomeRates(r, previous, dt).c_str(),
                (r.gets_answered - previous.gets_answered) / dt,
                ((r.rpcs + r.commands) - (previous.rpcs + previous.commands)) / dt, fresh,
                Quantile(total, 0.5), Quantile(total, 0.99), Quantile(plan, 0.5),
                Quantile(plan, 0.99), 100 * (now.cpu_s - last.cpu_s) / dt, now.rss_mb);
    std::fflush(stdout);
    previous = r;
    last = now;
  }
  return elapsed_s;
}

// The run's figures, for the summary and --json.
struct Summary {
  double elapsed_s = 0, register_s = 0;
  double p50 = 0, p99 = 0, max_ms = 0, plan_p50 = 0, plan_p99 = 0, plan_max = 0;
  double mean_updates = 0, mean_batches = 0, msgs_per_s = 0, cpu_pct = 0;
  int64_t over = 0;  // cycles longer than the batch interval
  // The mean parts of the cycles at or above the p99 (the slowest 1 %).
  CycleCollector::CycleParts slowest;
  size_t slowest_n = 0;
  // The scheduler at the load's start, middle (the progress line nearest
  // half way) and end, and after the drain.
  ProcSample start, middle, end, drained;
  std::vector<double> rss_series;
};

double Mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

Summary Summarize(const LoadFlags& f, const CycleCollector& cycles, const LoadReport& under_load,
                  const std::vector<ProcSample>& samples, double elapsed_s) {
  Summary s;
  s.elapsed_s = elapsed_s;
  const std::vector<double>& all = cycles.all();
  s.p50 = Quantile(all, 0.5);
  s.p99 = Quantile(all, 0.99);
  s.max_ms = Max(all);
  s.plan_p50 = Quantile(cycles.plan(), 0.5);
  s.plan_p99 = Quantile(cycles.plan(), 0.99);
  s.plan_max = Max(cycles.plan());
  for (const CycleCollector::CycleParts& c : cycles.parts()) {
    if (c.total < s.p99) continue;
    ++s.slowest_n;
    s.slowest.lock_wait += c.lock_wait;
    s.slowest.cut += c.cut;
    s.slowest.plan += c.plan;
    s.slowest.dispatch += c.dispatch;
    s.slowest.total += c.total;
  }
  if (s.slowest_n > 0) {
    for (double* part : {&s.slowest.lock_wait, &s.slowest.cut, &s.slowest.plan,
                         &s.slowest.dispatch, &s.slowest.total}) {
      *part /= static_cast<double>(s.slowest_n);
    }
  }
  s.over = std::count_if(all.begin(), all.end(),
                         [&](double ms) { return ms > f.batch_interval_ms; });
  s.mean_updates = Mean(cycles.updates());
  s.mean_batches = Mean(cycles.batches());
  s.msgs_per_s = (under_load.rpcs + under_load.commands) / under_load.elapsed_s;
  s.start = samples.front();
  s.end = samples.back();
  s.middle = *std::min_element(samples.begin(), samples.end(), [&](const auto& a, const auto& b) {
    return std::abs(a.t_s - elapsed_s / 2) < std::abs(b.t_s - elapsed_s / 2);
  });
  s.cpu_pct = 100 * (s.end.cpu_s - s.start.cpu_s) / elapsed_s;
  for (size_t i = 1; i < samples.size(); ++i) s.rss_series.push_back(samples[i].rss_mb);
  return s;
}

// Drop and failure reasons by kind: the text before its first ':' (a
// timeout names its transfer, so each would be a reason of its own), with
// how many and the first example.
struct ReasonKind {
  int64_t count = 0;
  std::string example;
};
std::map<std::string, ReasonKind> ReasonKinds(const std::map<std::string, int64_t>& reasons) {
  std::map<std::string, ReasonKind> kinds;
  for (const auto& [reason, count] : reasons) {
    ReasonKind& kind = kinds[reason.substr(0, reason.find(':'))];
    kind.count += count;
    if (kind.example.empty()) kind.example = reason;
  }
  return kinds;
}

void PrintOutcomes(const LoadFlags& f, const Summary& s, const LoadReport& report,
                   const LoadReport& under_load) {
  const double elapsed_s = s.elapsed_s;
  std::printf("\nsummary (%.0f s of load, %lld job(s) x %lld workers, %lld target(s) x %lld "
              "shard(s) each, %.3f MB updates, tau_max %lld):\n",
              elapsed_s, static_cast<long long>(f.jobs), static_cast<long long>(f.workers),
              static_cast<long long>(f.servers), static_cast<long long>(f.shards), f.update_mb,
              static_cast<long long>(f.tau_max));
  std::printf("  pushes %lld (%.0f/s under load): applied %lld, dropped %lld, failed %lld, "
              "open %lld\n",
              static_cast<long long>(report.pushes), under_load.pushes / elapsed_s,
              static_cast<long long>(report.applied), static_cast<long long>(report.dropped),
              static_cast<long long>(report.failed),
              static_cast<long long>(report.without_outcome));
  const LoadReport none;
  std::printf("  per second under load: %s; applied fraction %.3f\n",
              OutcomeRates(under_load, none, elapsed_s).c_str(),
              report.pushes > 0 ? static_cast<double>(report.applied) / report.pushes : 0.0);
  for (const auto& [kind, reasons] : ReasonKinds(report.reasons)) {
    std::printf("    %-24s %lld (%.1f/s)", kind.c_str(), static_cast<long long>(reasons.count),
                reasons.count / elapsed_s);
    if (reasons.example != kind) std::printf(", e.g. \"%s\"", reasons.example.c_str());
    std::printf("\n");
  }
  std::printf("  gets %lld answered of %lld in %lld distributions\n",
              static_cast<long long>(report.gets_answered), static_cast<long long>(report.gets),
              static_cast<long long>(report.distributions));
}

void PrintSummary(const LoadFlags& f, const Summary& s, const LoadReport& report,
                  const LoadReport& under_load, size_t cycles) {
  PrintOutcomes(f, s, report, under_load);
  rusage self{};
  ::getrusage(RUSAGE_SELF, &self);
  const double self_cpu_s = self.ru_utime.tv_sec + self.ru_utime.tv_usec / 1e6 +
                            self.ru_stime.tv_sec + self.ru_stime.tv_usec / 1e6;
  std::printf("  batch cycles %zu (%.0f updates in %.1f batches each on average): p50 %.1f ms, "
              "p99 %.1f ms, max %.1f ms, %lld longer than the %.0f ms interval\n",
              cycles, s.mean_updates, s.mean_batches, s.p50, s.p99, s.max_ms,
              static_cast<long long>(s.over), f.batch_interval_ms);
  std::printf("  planning per cycle (the scheduler's plan_ms: its batches planned in parallel): "
              "p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
              s.plan_p50, s.plan_p99, s.plan_max);
  const CycleCollector::CycleParts& slow = s.slowest;
  std::printf("  the slowest 1%% of cycles (%zu, mean %.1f ms): waiting for the service's lock "
              "%.1f, cutting %.1f, planning %.1f, queuing commands %.1f, other %.1f ms\n",
              s.slowest_n, slow.total, slow.lock_wait, slow.cut, slow.plan, slow.dispatch,
              slow.total - slow.lock_wait - slow.cut - slow.plan - slow.dispatch);
  std::printf("  control-plane messages %.0f/s (unary calls and stream commands)\n", s.msgs_per_s);
  std::printf("  scheduler CPU %.0f%% of one core under load; CPU s / RSS MB at start %.1f / %.0f, "
              "middle (t=%.0f s) %.1f / %.0f, end %.1f / %.0f, after drain %.1f / %.0f; "
              "peak %.0f MB\n",
              s.cpu_pct, s.start.cpu_s, s.start.rss_mb, s.middle.t_s, s.middle.cpu_s,
              s.middle.rss_mb, s.end.cpu_s, s.end.rss_mb, s.drained.cpu_s, s.drained.rss_mb,
              s.drained.hwm_mb);
  std::printf("  this load generator: %.0f%% of one core\n",
              100 * self_cpu_s / (s.elapsed_s + s.register_s));
}

nlohmann::json SampleJson(const ProcSample& p) {
  return {{"t_s", p.t_s}, {"cpu_s", p.cpu_s}, {"rss_mb", p.rss_mb}};
}

void WriteJson(const LoadFlags& f, const Summary& s, const LoadReport& report,
               const LoadReport& under_load, size_t cycles) {
  const double dt = s.elapsed_s;
  nlohmann::json reasons = nlohmann::json::object();
  for (const auto& [kind, r] : ReasonKinds(report.reasons)) {
    reasons[kind] = {{"count", r.count}, {"example", r.example}};
  }
  nlohmann::json out = {{"workers", f.workers},
                        {"jobs", f.jobs},
                        {"hosts", report.hosts},
                        {"servers", f.servers},
                        {"shards", f.shards},
                        {"update_mb", f.update_mb},
                        {"tau_max", f.tau_max},
                        {"duration_s", s.elapsed_s},
                        {"pushes", report.pushes},
                        {"applied", report.applied},
                        {"dropped", report.dropped},
                        {"failed", report.failed},
                        {"applied_fraction", report.pushes > 0 ? static_cast<double>(report.applied) /
                                                                     report.pushes
                                                               : 0.0},
                        {"applied_per_s", under_load.applied / dt},
                        {"dropped_per_s", under_load.dropped / dt},
                        {"failed_per_s", under_load.failed / dt},
                        {"reasons", reasons},
                        {"gets", report.gets},
                        {"cycles", cycles},
                        {"cycle_p50_ms", s.p50},
                        {"cycle_p99_ms", s.p99},
                        {"cycle_max_ms", s.max_ms},
                        {"plan_p50_ms", s.plan_p50},
                        {"plan_p99_ms", s.plan_p99},
                        {"plan_max_ms", s.plan_max},
                        {"cycles_over_interval", s.over},
                        {"slowest_cycles",
                         {{"count", s.slowest_n},
                          {"total_ms", s.slowest.total},
                          {"lock_wait_ms", s.slowest.lock_wait},
                          {"cut_ms", s.slowest.cut},
                          {"plan_ms", s.slowest.plan},
                          {"dispatch_ms", s.slowest.dispatch}}},
                        {"messages_per_s", s.msgs_per_s},
                        {"scheduler_cpu_pct", s.cpu_pct},
                        {"scheduler_start", SampleJson(s.start)},
                        {"scheduler_middle", SampleJson(s.middle)},
                        {"scheduler_end", SampleJson(s.end)},
                        {"scheduler_drained", SampleJson(s.drained)},
                        {"rss_mb_series", s.rss_series},
                        {"peak_rss_mb", s.drained.hwm_mb},
                        {"consistent", report.Consistent()}};
  std::ofstream(f.json_path) << out.dump(2) << "\n";
}

// Reads the flags; 0 to go on, else the exit code (help printed, or a bad flag).
int ParseFlags(int argc, char** argv, LoadFlags* f) {
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) {
    std::cerr << "mlfabric-loadgen: " << cl.status().message() << "\n" << kUsage;
    return 2;
  }
  if (cl->help) {
    std::cout << kUsage;
    return -1;
  }
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  if (absl::Status status = ReadFlags(reader, f); !status.ok()) {
    std::cerr << "mlfabric-loadgen: " << status.message() << "\n" << kUsage;
    return 2;
  }
  ChooseDefaults(cl->flags, f);
  return 0;
}

// Starts every job's generator (registration included); the time it took.
absl::StatusOr<double> StartLoad(Cluster& cluster, const LoadFlags& f,
                                 const std::vector<std::string>& tokens, Load* load) {
  const auto registering = std::chrono::steady_clock::now();
  for (int64_t j = 0; j < f.jobs; ++j) {
    load->jobs.push_back(
        std::make_unique<LoadGenerator>(MakeLoadOptions(cluster, f, j, tokens[j])));
    if (absl::Status started = load->jobs.back()->Start(); !started.ok()) {
      return absl::Status(started.code(),
                          absl::StrCat("job ", JobName(f, j), ": ", started.message()));
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - registering).count();
}

int Main(int argc, char** argv) {
  LoadFlags f;
  if (int code = ParseFlags(argc, argv, &f); code != 0) return code < 0 ? 0 : code;
  ClusterOptions cluster_options;
  cluster_options.admin = true;  // the batch cycles come from GET /api/v1/cycles
  auto cluster = Cluster::Create(cluster_options);
  if (!cluster.ok()) {
    std::cerr << "mlfabric-loadgen: " << cluster.status().message() << "\n";
    return 1;
  }
  const int worker_hosts =
      static_cast<int>((f.workers + f.workers_per_host - 1) / f.workers_per_host);
  std::vector<std::string> tokens;
  for (int64_t j = 0; j < f.jobs; ++j) tokens.push_back(RandomHex(16));
  if (absl::Status started = StartScheduler(**cluster, f, worker_hosts, tokens); !started.ok()) {
    std::cerr << "mlfabric-loadgen: " << started.message() << "\n";
    return 1;
  }
  const pid_t scheduler_pid = (*cluster)->scheduler().pid();
  std::printf("mlfabric-loadgen: %lld job(s) x %lld workers on %d hosts each, %lld target(s) x "
              "%lld shard(s), %.0f ms compute, %.3f MB updates, tau_max %lld, %.1f Gbit/s NICs, "
              "planner %s, %.0f ms batches, %.0f s; scheduler pid %d, admin port %d, %u CPUs\n",
              static_cast<long long>(f.jobs), static_cast<long long>(f.workers), worker_hosts,
              static_cast<long long>(f.servers), static_cast<long long>(f.shards), f.period_ms,
              f.update_mb, static_cast<long long>(f.tau_max), f.link_gbps, f.planner.c_str(),
              f.batch_interval_ms, f.duration_s, static_cast<int>(scheduler_pid),
              (*cluster)->admin_port(), std::thread::hardware_concurrency());
  std::fflush(stdout);

  Load load;
  absl::StatusOr<double> register_s = StartLoad(**cluster, f, tokens, &load);
  if (!register_s.ok()) {
    std::cerr << "mlfabric-loadgen: " << register_s.status().message() << "\n";
    return 1;
  }
  std::printf("registered %lld hosts and %lld entities in %.2f s\n",
              static_cast<long long>(f.jobs * (worker_hosts + f.servers * f.shards)),
              static_cast<long long>(f.jobs * (f.workers + f.servers * f.shards)), *register_s);
  std::fflush(stdout);

  CycleCollector cycles((*cluster)->admin_port());
  cycles.Poll();  // registration's cycles are not the load's
  std::vector<ProcSample> samples = {SampleProcess(scheduler_pid, 0)};
  const LoadReport at_start = load.Snapshot();
  const double elapsed_s = RunLoad(load, cycles, scheduler_pid, f, samples.front(), &samples);
  const LoadReport under_load = Since(load.Snapshot(), at_start);
  cycles.Poll();
  LoadReport report = load.Drain(f.drain_s);

  Summary summary = Summarize(f, cycles, under_load, samples, elapsed_s);
  summary.register_s = *register_s;
  summary.drained = SampleProcess(scheduler_pid, elapsed_s);
  PrintSummary(f, summary, report, under_load, cycles.all().size());
  if (!f.json_path.empty()) WriteJson(f, summary, report, under_load, cycles.all().size());
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
