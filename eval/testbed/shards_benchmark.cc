// Server groups on the emulated testbed: W
// workers train asynchronously (MLfabric-A: get the model, compute, push)
// against one server, then against a group of S shard servers on S hosts,
// every server host with the same link rate. Prints the gradients applied
// per second of each run and, per pair of runs, the S-shard / one-server
// ratio (runs alternate 1, S, 1, S, ...: the machine is shared and noisy).
// --aggregators=K adds K aggregator hosts (same links) named in the job's
// config; --compare=aggregation then pairs S shards without them against
// S shards with them (in-network aggregation of the group's pushes).
//
//   bazel run -c opt //eval/testbed:shards_benchmark -- --shards=4 --workers=16
//   bazel run -c opt //eval/testbed:shards_benchmark -- --aggregators=4 --compare=aggregation
//
// Hosts are network namespaces with htb-shaped links (root); without root
// the run stops with the reason (--mode=loopback runs on 127.0.0.1 with the
// daemons' own pacing instead).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "api/mlfabric.h"
#include "common/config.h"
#include "launch/cluster.h"
#include "nlohmann/json.hpp"

namespace mlfabric {
namespace {

// The run's own job token (the scheduler config below names it).
constexpr char kToken[] = "shards-benchmark-token-0123456789";

using Clock = std::chrono::steady_clock;

struct Flags {
  int shards = 4;
  int workers = 16;
  int64_t model_bytes = 1 << 20;
  double link_bps = 100e6;
  int64_t compute_ms = 100;
  double seconds = 20;
  double warmup_s = 3;
  int pairs = 2;
  // The delay bound: MLfabric-A60's (the paper's §7 settings are 30 and 60).
  int64_t tau_max = 60;
  std::string mode = "netns";
  std::vector<std::string> daemon_flags;  // given to every daemon
  int aggregators = 0;                    // hosts a1..aK, named in the job's config
  std::string compare = "servers";        // servers: 1 vs S; aggregation: S without vs with
};

// A server (or shard) that sums what it is given, float32.
struct SumServer {
  std::mutex mu;
  std::vector<float> model;
  int64_t version = 0;
  std::unique_ptr<Server> server;
  std::thread thread;
  ~SumServer() {
    if (server) server->Stop();
    if (thread.joinable()) thread.join();
  }
};

struct RunResult {
  int64_t applied = 0, dropped = 0, failed = 0, gets = 0, get_errors = 0;
  double seconds = 0;
  double get_s_total = 0;
  std::string first_error;
};

// Run's cluster (shard hosts s1..sS, workers w1..wW, aggregators
// a1..aK, every link at link_bps) with its scheduler and daemons started.
absl::StatusOr<std::unique_ptr<launch::Cluster>> StartCluster(const Flags& flags, int shards,
                                                              int aggregators) {
  launch::ClusterOptions options;
  options.topology = flags.mode == "netns" ? launch::Topology::kNetns : launch::Topology::kLoopback;
  std::map<std::string, std::vector<std::string>> host_flags;
  const std::string rate = absl::StrFormat("%.0f", flags.link_bps);
  for (int i = 1; i <= shards; ++i) options.hosts.push_back(absl::StrCat("s", i));
  for (int i = 1; i <= flags.workers; ++i) options.hosts.push_back(absl::StrCat("w", i));
  std::string aggregator_list;
  for (int i = 1; i <= aggregators; ++i) {
    options.hosts.push_back(absl::StrCat("a", i));
    absl::StrAppend(&aggregator_list, i > 1 ? ", " : "", "\"a", i, "\"");
  }
  for (const std::string& host : options.hosts) {
    options.rates[host] = {flags.link_bps, flags.link_bps};
    host_flags[host] = {"--uplink_bps=" + rate, "--downlink_bps=" + rate};
    for (const std::string& f : flags.daemon_flags) host_flags[host].push_back(f);
  }
  options.rate = {flags.link_bps, flags.link_bps};
  options.prefix = absl::StrCat("mlfsh", shards, aggregators > 0 ? "a" : "", "-");
  auto cluster = launch::Cluster::Create(options);
  if (!cluster.ok()) return cluster.status();
  launch::Cluster& c = **cluster;
  const std::string config = c.dir() + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": ")" << kToken << R"(",)"
                        << R"( "tau_max": )" << flags.tau_max
                        << (aggregators > 0 ? absl::StrCat(R"(, "aggregators": [)", aggregator_list, "]")
                                            : std::string())
                        << "}]}";
  if (absl::Status s = c.Start({"--config=" + config, "--planner=mlfabric"}, {}, host_flags);
      !s.ok()) {
    return s;
  }
  return cluster;
}

// The server, or the group's shards, each on its host s1..sS and serving.
absl::Status StartServers(launch::Cluster& c, const Flags& flags, int shards,
                          std::vector<std::unique_ptr<SumServer>>* servers) {
  // Whole float32 elements each.
  std::vector<std::pair<int64_t, int64_t>> ranges = {{0, flags.model_bytes}};
  if (shards > 1) {
    auto split = SplitModel(flags.model_bytes, shards);
    if (!split.ok()) return split.status();
    ranges = *split;
  }
  for (int i = 0; i < shards; ++i) {
    auto s = std::make_unique<SumServer>();
    ClientOptions client;
    client.daemon_socket = c.Socket(absl::StrCat("s", i + 1));
    client.job_token = kToken;
    client.name = shards > 1 ? absl::StrCat("ps-", i) : "ps";
    if (shards > 1) {
      client.shard = {"ps", i, shards, ranges[i].first, ranges[i].second};
    }
    s->model.assign((ranges[i].second - ranges[i].first) / 4, 0.0f);
    auto server = Server::Connect(client);
    if (!server.ok()) return server.status();
    s->server = std::move(*server);
    SumServer* raw = s.get();
    raw->server->RegisterUpdateCallback([raw](const Server::Update& u) -> absl::StatusOr<int64_t> {
      std::lock_guard<std::mutex> lock(raw->mu);
      if (u.bytes != raw->model.size() * sizeof(float)) {
        return absl::InvalidArgumentError("update size does not match the model");
      }
      const float* v = reinterpret_cast<const float*>(u.data);
      for (size_t k = 0; k < raw->model.size(); ++k) raw->model[k] += v[k];
      raw->version += u.count;
      return raw->version;
    });
    raw->server->RegisterRequestCallback([raw]() -> absl::StatusOr<Server::Snapshot> {
      std::lock_guard<std::mutex> lock(raw->mu);
      Server::Snapshot snap;
      snap.version = raw->version;
      snap.bytes.resize(raw->model.size() * sizeof(float));
      std::memcpy(snap.bytes.data(), raw->model.data(), snap.bytes.size());
      return snap;
    });
    raw->thread = std::thread([raw] { (void)raw->server->Serve(); });
    servers->push_back(std::move(s));
  }
  return absl::OkStatus();
}

// What a run's workers count, under `mu`: gets asked and pushes settled
// between measure_from and stop.
struct Tally {
  std::mutex mu;
  RunResult result;
  Clock::time_point measure_from, stop;
};

// Worker w of a run, on host w<w+1>: get, compute, push (at most two
// pushes in flight) until tally.stop.
void RunWorker(launch::Cluster& c, const Flags& flags, int w, Tally& tally) {
  ClientOptions client;
  client.daemon_socket = c.Socket(absl::StrCat("w", w + 1));
  client.job_token = kToken;
  client.name = absl::StrCat("worker", w);
  auto worker = Worker::Connect(client);
  if (!worker.ok()) {
    std::lock_guard<std::mutex> lock(tally.mu);
    ++tally.result.get_errors;
    if (tally.result.first_error.empty()) {
      tally.result.first_error = std::string(worker.status().message());
    }
    return;
  }
  std::vector<float> update(flags.model_bytes / 4, 1e-3f * (w + 1));
  const double norm = std::sqrt(static_cast<double>(update.size())) * 1e-3 * (w + 1);
  std::deque<std::future<PushResult>> pending;
  auto settle = [&](PushResult r) {
    const bool counted = Clock::now() >= tally.measure_from && Clock::now() < tally.stop;
    std::lock_guard<std::mutex> lock(tally.mu);
    if (!counted) return;
    if (r.outcome == PushOutcome::kApplied) ++tally.result.applied;
    if (r.outcome == PushOutcome::kDropped) ++tally.result.dropped;
    if (r.outcome == PushOutcome::kFailed) {
      ++tally.result.failed;
      if (tally.result.first_error.empty()) tally.result.first_error = r.reason;
    }
  };
  while (Clock::now() < tally.stop) {
    const Clock::time_point asked = Clock::now();
    auto model = (*worker)->Get("ps");
    const double get_s = std::chrono::duration<double>(Clock::now() - asked).count();
    int64_t version = 0;
    {
      std::lock_guard<std::mutex> lock(tally.mu);
      if (asked >= tally.measure_from && asked < tally.stop) {
        ++tally.result.gets;
        tally.result.get_s_total += get_s;
      }
      if (!model.ok()) {
        ++tally.result.get_errors;
        if (tally.result.first_error.empty()) {
          tally.result.first_error = std::string(model.status().message());
        }
      } else {
        version = model->version;
      }
    }
    if (!model.ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(flags.compute_ms));
    pending.push_back((*worker)->Push("ps", update.data(), update.size() * sizeof(float),
                                      version, norm));
    while (!pending.empty() &&
           (pending.size() > 2 ||
            pending.front().wait_for(std::chrono::seconds(0)) == std::future_status::ready)) {
      settle(pending.front().get());
      pending.pop_front();
    }
  }
  while (!pending.empty()) {
    settle(pending.front().get());
    pending.pop_front();
  }
}

absl::StatusOr<RunResult> Run(const Flags& flags, int shards, int aggregators) {
  auto cluster = StartCluster(flags, shards, aggregators);
  if (!cluster.ok()) return cluster.status();
  launch::Cluster& c = **cluster;
  std::vector<std::unique_ptr<SumServer>> servers;
  if (absl::Status s = StartServers(c, flags, shards, &servers); !s.ok()) return s;

  // Workers: get, compute, push (at most two pushes of a worker in flight).
  Tally tally;
  const Clock::time_point start = Clock::now();
  tally.measure_from =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(flags.warmup_s));
  tally.stop = tally.measure_from + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(flags.seconds));
  std::vector<std::thread> threads;
  for (int w = 0; w < flags.workers; ++w) {
    threads.emplace_back([&, w] { RunWorker(c, flags, w, tally); });
  }
  for (std::thread& t : threads) t.join();
  RunResult result = std::move(tally.result);
  result.seconds = flags.seconds;
  return result;
}

// main: --shards and the rest into `flags` (its defaults for those not
// given); false, after saying why, when they do not fit.
bool ReadFlags(ConfigReader& reader, Flags* flags) {
  int64_t shards = flags->shards, workers = flags->workers, pairs = flags->pairs;
  reader.Int("shards", &shards, 2, 64);
  reader.Int("workers", &workers, 1, 64);
  reader.Int("model_bytes", &flags->model_bytes, 4 * 64, int64_t{1} << 30);
  reader.Double("link_bps", &flags->link_bps, 1e6, 1e11);
  reader.Int("compute_ms", &flags->compute_ms, 0, 60000);
  reader.Double("seconds", &flags->seconds, 1, 3600);
  reader.Double("warmup_s", &flags->warmup_s, 0, 600);
  reader.Int("pairs", &pairs, 1, 20);
  reader.Int("tau_max", &flags->tau_max, 0, 1000000);
  reader.String("mode", &flags->mode);
  int64_t aggregators = 0;
  reader.Int("aggregators", &aggregators, 0, 64);
  reader.Enum("compare", &flags->compare, {"servers", "aggregation"});
  std::string daemon_flags;
  reader.String("daemon_flags", &daemon_flags);
  for (absl::string_view f : absl::StrSplit(daemon_flags, ',', absl::SkipEmpty())) {
    flags->daemon_flags.emplace_back(f);
  }
  if (absl::Status s = reader.Finish(); !s.ok() ||
                                        (flags->mode != "netns" && flags->mode != "loopback")) {
    std::fprintf(stderr,
                 "shards_benchmark: %s\nflags: --shards=S (4) --workers=W (16) --model_bytes (1 MiB) "
                 "--link_bps (100e6) --compute_ms (100) --seconds (20) --warmup_s (3) --pairs (2) "
                 "--tau_max (60) --mode=netns|loopback --daemon_flags=--a=1,--b=2 "
                 "--aggregators=K (0) --compare=servers|aggregation (servers)\n",
                 s.ok() ? "--mode must be netns or loopback" : std::string(s.message()).c_str());
    return false;
  }
  flags->shards = static_cast<int>(shards);
  flags->workers = static_cast<int>(workers);
  flags->pairs = static_cast<int>(pairs);
  flags->aggregators = static_cast<int>(aggregators);
  if (flags->compare == "aggregation" && flags->aggregators == 0) {
    std::fprintf(stderr, "shards_benchmark: --compare=aggregation needs --aggregators=K > 0\n");
    return false;
  }
  if (flags->model_bytes % (4 * flags->shards) != 0 && flags->model_bytes % 4 != 0) {
    std::fprintf(stderr, "shards_benchmark: --model_bytes must be a multiple of 4\n");
    return false;
  }
  return true;
}

}  // namespace
}  // namespace mlfabric

int main(int argc, char** argv) {
  using namespace mlfabric;
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) {
    std::fprintf(stderr, "shards_benchmark: %s\n", std::string(cl.status().message()).c_str());
    return 2;
  }
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  Flags flags;
  if (!ReadFlags(reader, &flags)) return 2;
  std::printf("shards_benchmark: %d workers, model %lld bytes, every host's link %.0f Mbit/s, "
              "compute %lld ms, %s, %d aggregator(s); %.0f s measured after %.0f s per run\n",
              flags.workers, static_cast<long long>(flags.model_bytes), flags.link_bps / 1e6,
              static_cast<long long>(flags.compute_ms), flags.mode.c_str(), flags.aggregators,
              flags.seconds, flags.warmup_s);
  const bool by_aggregation = flags.compare == "aggregation";
  std::vector<double> ratios;
  for (int pair = 0; pair < flags.pairs; ++pair) {
    double rate[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const int s = k == 0 && !by_aggregation ? 1 : flags.shards;
      const int a = by_aggregation && k == 0 ? 0 : flags.aggregators;
      std::fflush(stdout);
      auto r = Run(flags, s, a);
      if (!r.ok()) {
        std::fprintf(stderr, "shards_benchmark: run with %d server(s): %s\n", s,
                     r.status().ToString().c_str());
        return 1;
      }
      rate[k] = r->applied / r->seconds;
      std::printf("pair %d  %2d server%s, %d aggregator(s)  applied %6.1f/s  dropped %lld  "
                  "failed %lld  gets %lld (mean %.0f ms, %lld errors)%s%s\n",
                  pair + 1, s, s == 1 ? " " : "s", a, rate[k], static_cast<long long>(r->dropped),
                  static_cast<long long>(r->failed), static_cast<long long>(r->gets),
                  r->gets > 0 ? 1000 * r->get_s_total / r->gets : 0.0,
                  static_cast<long long>(r->get_errors), r->first_error.empty() ? "" : "  first error: ",
                  r->first_error.c_str());
    }
    ratios.push_back(rate[0] > 0 ? rate[1] / rate[0] : 0);
    if (by_aggregation) {
      std::printf("pair %d  ratio %d shards with / without %d aggregator(s): %.2fx\n", pair + 1,
                  flags.shards, flags.aggregators, ratios.back());
    } else {
      std::printf("pair %d  ratio %d shards / 1 server: %.2fx\n", pair + 1, flags.shards,
                  ratios.back());
    }
  }
  std::sort(ratios.begin(), ratios.end());
  const size_t mid = ratios.size() / 2;
  const double median = ratios.size() % 2 ? ratios[mid] : (ratios[mid - 1] + ratios[mid]) / 2;
  std::printf("shards_benchmark: median ratio %.2fx over %d pairs%s\n", median, flags.pairs,
              by_aggregation ? "" : " (target >= 3x)");
  return 0;
}
