// Scheduler performance (paper §7.4): batches of |U| = 10, 100, 500, 1000
// updates with deadlines from Uniform(1, 2|U|), |U|/2 worker nodes and a
// congestion-free core; every batch also has 4 server aggregators (on their
// own hosts, then co-hosted with workers as in the paper's testbed) and a
// replica with 2 aggregators, so a plan runs all three algorithms (Alg. 2,
// Alg. 3, §5.3); a third setup drops the replica, so that streaming chains
// are planned too (aggregation.h). It prints, per |U|, milliseconds per batch and the peak heap
// a call allocates, for the optimised core (1 and 2 threads) and for the
// straightforward reference implementation of the same algorithms, and
// checks that all three produce byte-identical plans (exit 1 otherwise) that
// pass every plan invariant.
//
//   bazel run -c opt //scheduler/core:planner_benchmark
//   bazel run -c opt //scheduler/core:planner_benchmark -- --quick   (skips |U| = 1000 reference)
//   bazel run -c opt //scheduler/core:planner_benchmark -- --distribution [--quick]  (§10.3 only)
//   bazel run -c opt //scheduler/core:planner_benchmark -- --servers=S  (§10.2 only)
//   bazel run -c opt //scheduler/core:planner_benchmark -- --sim_shards=96 [--quick]
//       (the simulator's 1000-worker sharded batches: per-batch p50/p99/max)
//   bazel run -c opt //scheduler/core:planner_benchmark -- --batch_files a.json b.json ...
//
// With --servers=S every update is split across S servers (§10.2; S - 1
// shards of random size besides its main part) and the batches have 4
// aggregators on their own hosts and no replica, so Alg. 3 aggregates the
// parts (our extension, aggregation.h). The reference implementation is
// timed up to |U| = 100 only: its multi-part ordering copies the network
// for every candidate and takes minutes beyond that.
//
// The model distribution section times PlanModelDistribution for 10 ... 1000
// requesters with half as many candidate distributors (target: 1000 x 500
// within 20 ms) against the exhaustive reference of the same search, for the
// per-batch objective (earliest total) and for the deadline objective
// (fewest server copies by a deadline at twice the per-batch total).
//
// ms/batch is the median wall time over timed passes (the fastest in
// brackets, the median process CPU time in square brackets: on a shared
// machine the CPU time shows what the planner itself costs);
// figures are printed, never asserted (docs/architecture.md §10: machines are noisy).
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#include "scheduler/core/distribution.h"
#include "scheduler/core/internal/random_batch.h"
#include "scheduler/core/mlfabric_planner.h"
#include "scheduler/core/network.h"
#include "scheduler/core/ordering.h"
#include "scheduler/core/plan_checker.h"
#include "scheduler/core/plan_json.h"

// Heap accounting for this benchmark binary only: the current and the peak
// number of bytes allocated through operator new.
namespace {
std::atomic<int64_t> g_heap_current{0};
std::atomic<int64_t> g_heap_peak{0};

void* CountedAlloc(size_t size) {
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  const int64_t now = g_heap_current += static_cast<int64_t>(malloc_usable_size(p));
  int64_t peak = g_heap_peak.load();
  while (now > peak && !g_heap_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void CountedFree(void* p) {
  if (p == nullptr) return;
  g_heap_current -= static_cast<int64_t>(malloc_usable_size(p));
  std::free(p);
}
}  // namespace

void* operator new(size_t size) { return CountedAlloc(size); }
void* operator new[](size_t size) { return CountedAlloc(size); }
void operator delete(void* p) noexcept { CountedFree(p); }
void operator delete[](void* p) noexcept { CountedFree(p); }
void operator delete(void* p, size_t) noexcept { CountedFree(p); }
void operator delete[](void* p, size_t) noexcept { CountedFree(p); }

namespace mlfabric::core {
namespace {

struct Measurement {
  double ms_per_batch = 0;  // median over the timed passes
  double min_ms = 0;        // fastest pass
  double cpu_ms = 0;        // median process CPU time per batch (all threads)
  double peak_mib = 0;
  std::string plan_json;
  Plan plan;
};

Measurement Measure(const MlfabricPlanner& planner, const std::vector<Batch>& batches,
                    int repetitions) {
  Measurement m;
  int64_t peak = 0;
  std::vector<double> pass_ms, pass_cpu_ms;
  auto cpu_now_ms = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
  };
  for (int r = 0; r < repetitions; ++r) {
    const double cpu_start = cpu_now_ms();
    const auto start = std::chrono::steady_clock::now();
    for (const Batch& batch : batches) {
      const int64_t base = g_heap_current.load();
      g_heap_peak = base;
      absl::StatusOr<Plan> plan = planner.PlanBatch(batch);
      peak = std::max(peak, g_heap_peak.load() - base);
      if (!plan.ok()) {
        std::fprintf(stderr, "planning failed: %s\n", std::string(plan.status().message()).c_str());
        std::exit(1);
      }
      if (r == 0) {
        m.plan_json += PlanToJson(*plan).dump();
        m.plan = *std::move(plan);
      }
    }
    const auto stop = std::chrono::steady_clock::now();
    pass_cpu_ms.push_back((cpu_now_ms() - cpu_start) / static_cast<double>(batches.size()));
    pass_ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count() /
                      static_cast<double>(batches.size()));
  }
  std::sort(pass_ms.begin(), pass_ms.end());
  std::sort(pass_cpu_ms.begin(), pass_cpu_ms.end());
  m.cpu_ms = pass_cpu_ms[pass_cpu_ms.size() / 2];
  m.ms_per_batch = pass_ms[pass_ms.size() / 2];
  m.min_ms = pass_ms.front();
  m.peak_mib = static_cast<double>(peak) / (1024.0 * 1024.0);
  return m;
}

// A §10.3 batched get: `requesters` machines with NIC rates from the §7 N2
// set, the first `distributors` of them also candidate distributors (as in
// the simulator, where workers' machines distribute), a 10 Gbit/s server and
// a 100 MB model.
DistributionRequest RandomDistribution(int requesters, int distributors, uint64_t seed) {
  uint64_t state = seed;
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
  };
  auto nic = [&next] {
    const double u = next();
    if (u < 0.05) return 1e9;
    if (u < 0.15) return 2.5e9;
    if (u < 0.25) return 3.3e9;
    if (u < 0.35) return 5e9;
    return 1e10;
  };
  DistributionRequest r;
  r.server = "s";
  r.model_bytes = 100000000;
  r.seed = seed;
  r.hosts.push_back({"s", 1e10, 1e10, {}, {}});
  for (int i = 0; i < requesters; ++i) {
    const std::string name = "m" + std::to_string(i);
    const double up = nic();
    r.hosts.push_back({name, up, nic(), {}, {}});
    r.requesters.push_back(name);
    if (i < distributors) r.distributors.push_back(name);
  }
  return r;
}

// Plans every request with its options `repetitions` times; returns the
// median and fastest wall ms per plan and the median CPU ms per plan, with
// the first pass's plans in `*plans` (unless null).
std::tuple<double, double, double> TimeDistributions(
    const std::vector<DistributionRequest>& requests,
    const std::vector<DistributionOptions>& options, int repetitions,
    std::vector<DistributionPlan>* plans) {
  std::vector<double> pass_ms, pass_cpu_ms;
  auto cpu_now_ms = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
  };
  for (int rep = 0; rep < repetitions; ++rep) {
    const double cpu_start = cpu_now_ms();
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < requests.size(); ++i) {
      absl::StatusOr<DistributionPlan> plan = PlanModelDistribution(requests[i], options[i]);
      if (!plan.ok()) {
        std::fprintf(stderr, "distribution failed: %s\n",
                     std::string(plan.status().message()).c_str());
        std::exit(1);
      }
      if (rep == 0 && plans != nullptr) plans->push_back(*std::move(plan));
    }
    pass_cpu_ms.push_back((cpu_now_ms() - cpu_start) / static_cast<double>(requests.size()));
    pass_ms.push_back(std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count() /
                      static_cast<double>(requests.size()));
  }
  std::sort(pass_ms.begin(), pass_ms.end());
  std::sort(pass_cpu_ms.begin(), pass_cpu_ms.end());
  return std::make_tuple(pass_ms[pass_ms.size() / 2], pass_ms.front(),
                         pass_cpu_ms[pass_cpu_ms.size() / 2]);
}

// Times PlanModelDistribution (and its exhaustive reference, unless
// `quick` and the size makes it take minutes) per size, for the per-batch
// objective and for the deadline objective with each request's
// deadline at twice its per-batch total.
bool DistributionBenchmark(bool quick) {
  std::printf("\nModel distribution (§10.3 batched get), 10 Gbit/s server, 100 MB model,\n"
              "NICs from the §7 N2 set, distributors co-hosted with requesters;\n"
              "objective: earliest total, or fewest server copies by a deadline at 2x it\n\n");
  std::printf("%11s %12s %9s | %31s | %12s | %8s | %s\n", "requesters", "distributors",
              "objective", "ms/plan (min) [cpu ms]", "reference ms", "speedup", "plans");
  struct Row {
    int requesters, distributors, plans, repetitions;
  };
  const std::vector<Row> rows = {
      {10, 5, 20, 50}, {100, 50, 5, 5}, {500, 250, 3, 5}, {1000, 500, 3, 5}};
  bool identical = true;
  for (const Row& row : rows) {
    std::vector<DistributionRequest> requests;
    for (int p = 0; p < row.plans; ++p) {
      requests.push_back(RandomDistribution(row.requesters, row.distributors,
                                            7919 * row.requesters + p + 1));
    }
    // Options per request (the deadline depends on the request).
    std::vector<DistributionOptions> earliest(requests.size());
    std::vector<DistributionPlan> per_batch;
    TimeDistributions(requests, earliest, 1, &per_batch);  // to set the deadlines
    std::vector<DistributionOptions> by_deadline(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      by_deadline[i].deadline_s =
          requests[i].now_s + 2 * (per_batch[i].total_s - requests[i].now_s);
    }
    for (const bool deadline : {false, true}) {
      const std::vector<DistributionOptions>& options = deadline ? by_deadline : earliest;
      std::vector<DistributionPlan> fast_plans, ref_plans;
      const auto fast = TimeDistributions(requests, options, row.repetitions, &fast_plans);
      std::string verdict = "identical";
      double ref_ms = 0;
      if (quick && row.requesters > 100) {
        verdict = "(reference skipped)";
      } else {
        std::vector<DistributionOptions> reference = options;
        for (DistributionOptions& o : reference) o.reference = true;
        ref_ms = std::get<0>(TimeDistributions(requests, reference, 1, &ref_plans));
        for (size_t i = 0; i < fast_plans.size(); ++i) {
          if (DistributionPlanToText(fast_plans[i]) != DistributionPlanToText(ref_plans[i])) {
            verdict = "DIFFERENT (reference)";
          }
        }
      }
      identical = identical && verdict != "DIFFERENT (reference)";
      std::printf("%11d %12d %9s | %9.3f (%8.3f) [%8.3f] | %12.1f | %7.0fx | %s\n",
                  row.requesters, row.distributors, deadline ? "deadline" : "earliest",
                  std::get<0>(fast), std::get<1>(fast), std::get<2>(fast), ref_ms,
                  ref_ms > 0 ? ref_ms / std::get<0>(fast) : 0.0, verdict.c_str());
      std::fflush(stdout);
    }
  }
  return identical;
}

// --servers=S: §10.2 batches of |U| = 10..1000 updates split across S
// servers, 4 aggregators on their own hosts, no replica.
bool ShardedBenchmark(int servers) {
  PlannerOptions reference, exhaustive;
  reference.reference = true;
  exhaustive.sampled_split_from = 0;
  const MlfabricPlanner optimised, every_split(exhaustive), straightforward(reference);
  std::printf("MLfabric planner, updates split across %d servers (§10.2), deadlines ~ U(1, 2|U|),\n"
              "|U|/2 workers, congestion-free core, 4 aggregators on their own hosts, no replica\n\n",
              servers);
  std::printf("%6s | %29s %7s | %12s %7s | %8s | %6s | %s\n", "|U|", "optimised, 1 thread",
              "peak", "reference", "peak", "ref/opt", "split", "plans");
  std::printf("%6s | %29s %7s | %12s %7s | %8s | %6s | %s\n", "", "ms/batch (min) [cpu ms]",
              "MiB", "ms/batch", "MiB", "", "mean", "");
  struct Row {
    int updates, batches, repetitions;
  };
  const std::vector<Row> rows = {{10, 20, 100}, {100, 5, 20}, {500, 3, 5}, {1000, 3, 3}};
  bool identical = true;
  for (const Row& row : rows) {
    std::vector<Batch> batches;
    for (int b = 0; b < row.batches; ++b) {
      internal::RandomBatchOptions o;
      o.updates = row.updates;
      o.aggregators = 4;
      o.shards = servers - 1;
      o.seed = 1000 * row.updates + b + 1;
      batches.push_back(internal::RandomBatch(o));
    }
    const Measurement fast = Measure(optimised, batches, row.repetitions);
    std::string verdict = "identical";
    double ref_ms = 0, ref_peak = 0;
    if (row.updates > 100) {
      verdict = "(reference skipped)";
    } else {
      const Measurement ref = Measure(straightforward, batches, 1);
      ref_ms = ref.ms_per_batch;
      ref_peak = ref.peak_mib;
      // From 64 ordered updates the default samples Alg. 3's split points
      // (PlannerOptions::sampled_split_from): the reference is compared with
      // the exhaustive search.
      if (ref.plan_json != Measure(every_split, batches, 1).plan_json) {
        verdict = "DIFFERENT (reference)";
      }
    }
    double split = 0;
    int sampled_apart = 0;
    for (const Batch& batch : batches) {
      const Plan plan = *optimised.PlanBatch(batch);
      sampled_apart += plan.aggregation_split != every_split.PlanBatch(batch)->aggregation_split;
      const auto problems = CheckPlan(batch, plan);
      if (!problems.empty()) verdict = "INVALID: " + problems[0];
      split += static_cast<double>(plan.aggregation_split) / batches.size();
    }
    identical = identical && (verdict == "identical" || verdict == "(reference skipped)");
    if (sampled_apart > 0) {
      verdict += "; sampled split search: " + std::to_string(sampled_apart) + " of " +
                 std::to_string(batches.size()) + " splits apart";
    }
    std::printf("%6d | %8.3f (%7.3f) [%8.3f] %7.2f | %12.2f %7.2f | %7.0fx | %6.1f | %s\n",
                row.updates, fast.ms_per_batch, fast.min_ms, fast.cpu_ms, fast.peak_mib, ref_ms,
                ref_peak, ref_ms > 0 ? ref_ms / fast.ms_per_batch : 0.0, split, verdict.c_str());
    std::fflush(stdout);
  }
  return identical;
}

double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

// The q-quantile (nearest rank) of `v`.
double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank > 0 ? rank - 1 : 0)];
}

// Per-batch CPU ms of the whole plan and of Alg. 2 alone (network build,
// PrepareBatch and OrderUpdates on a fresh copy: where the multi-part t_en
// runs), the best of `repetitions` calls each; false if a plan fails
// CheckPlan (the problem is printed).
bool TimeBatches(const std::vector<Batch>& batches, int repetitions, std::vector<double>* plan_ms,
                 std::vector<double>* order_ms) {
  const MlfabricPlanner planner;
  bool valid = true;
  for (const Batch& batch : batches) {
    double best_plan = kInfinity, best_order = kInfinity;
    for (int r = 0; r < repetitions; ++r) {
      const double start = ThreadCpuMs();
      absl::StatusOr<Plan> plan = planner.PlanBatch(batch);
      best_plan = std::min(best_plan, ThreadCpuMs() - start);
      if (!plan.ok()) {
        std::fprintf(stderr, "planning failed: %s\n", std::string(plan.status().message()).c_str());
        std::exit(1);
      }
      if (r == 0) {
        const std::vector<std::string> problems = CheckPlan(batch, *plan);
        if (!problems.empty()) {
          std::printf("INVALID plan: %s\n", problems[0].c_str());
          valid = false;
        }
      }
      const double order_start = ThreadCpuMs();
      Network net = *Network::FromBatch(batch);
      const PreparedBatch prepared = *PrepareBatch(batch, net);
      const OrderingResult ordering = OrderUpdates(prepared, &net, PlannerOptions{});
      best_order = std::min(best_order, ThreadCpuMs() - order_start);
    }
    plan_ms->push_back(best_plan);
    order_ms->push_back(best_order);
  }
  return valid;
}

void PrintBatchTimes(const char* label, const std::vector<Batch>& batches,
                     const std::vector<double>& plan_ms, const std::vector<double>& order_ms) {
  double updates = 0, plan_sum = 0, order_sum = 0;
  for (const Batch& b : batches) updates += static_cast<double>(b.updates.size());
  for (double ms : plan_ms) plan_sum += ms;
  for (double ms : order_ms) order_sum += ms;
  const double n = static_cast<double>(batches.size());
  std::printf("%-22s %7zu %7.0f | %9.2f %9.2f %9.2f | %9.2f %9.2f | %5.1f%%\n", label,
              batches.size(), updates / n, Quantile(plan_ms, 0.5), Quantile(plan_ms, 0.99),
              Quantile(plan_ms, 1.0), order_sum / n, (plan_sum - order_sum) / n,
              100.0 * order_sum / std::max(plan_sum, 1e-9));
  std::fflush(stdout);
}

void PrintBatchHeader() {
  std::printf("%-22s %7s %7s | %9s %9s %9s | %9s %9s | %6s\n", "", "batches", "mean|U|",
              "p50 ms", "p99 ms", "max ms", "Alg.2 ms", "rest ms", "Alg.2");
}

// When the last commit of `plan` lands (its total).
double LastCommit(const Plan& plan) {
  double last = 0;
  for (const Commit& c : plan.commits) last = std::max(last, c.at_s);
  return last;
}

// Plans `batches` with Alg. 3's split search sampled (the default) and
// exhaustive, and prints how often and by how much the sample's plan ends
// later (it can never end sooner).
void CompareSampledSplits(const std::vector<Batch>& batches) {
  PlannerOptions exhaustive;
  exhaustive.sampled_split_from = 0;
  const MlfabricPlanner sampled_planner, exhaustive_planner(exhaustive);
  int same = 0;
  double worst_ms = 0, sum_ms = 0;
  for (const Batch& batch : batches) {
    const Plan sampled = *sampled_planner.PlanBatch(batch);
    const Plan full = *exhaustive_planner.PlanBatch(batch);
    if (sampled.aggregation_split == full.aggregation_split) ++same;
    const double later_ms = 1e3 * (LastCommit(sampled) - LastCommit(full));
    worst_ms = std::max(worst_ms, later_ms);
    sum_ms += later_ms;
  }
  std::printf("  Alg. 3 on a sample of split points: the exhaustive search's split in %d of %zu "
              "batches; last commit later by %.3f ms on average, %.3f ms at most\n",
              same, batches.size(), sum_ms / static_cast<double>(batches.size()), worst_ms);
}

// --sim_shards=S: batches shaped like the simulator's at 1000 workers and S
// shards (eval/sim: 100 MB model in S equal parts, two updates per machine
// on average, 50 aggregators co-hosted with workers, every link already
// carrying earlier reservations), |U| around the 190-230 the simulator
// cuts; per-batch planning CPU ms (each batch's best of 3 calls) and the
// share Alg. 2 (the multi-part t_en) takes. Small batches are also
// planned by the reference implementation and must give the same plan;
// large ones also with every split point tried (PlannerOptions::
// sampled_split_from = 0), to show what sampling them costs in plan quality.
bool SimShardsBenchmark(int servers, bool quick) {
  std::printf("MLfabric planner, simulator-shaped sharded batches: %d shards of equal size "
              "(100 MB model),\nlinks busy with earlier reservations, 50 aggregators co-hosted "
              "with workers, no replica;\nper-batch CPU ms (best of 3 calls per batch), Alg. 2 = "
              "network + PrepareBatch + OrderUpdates\n\n",
              servers);
  PrintBatchHeader();
  PlannerOptions reference;
  reference.reference = true;
  const MlfabricPlanner optimised, straightforward(reference);
  bool ok = true;
  struct Row {
    int updates, batches;
  };
  const std::vector<Row> rows = quick ? std::vector<Row>{{20, 5}, {200, 5}}
                                      : std::vector<Row>{{20, 10}, {200, 20}};
  for (const Row& row : rows) {
    std::vector<Batch> batches;
    for (int b = 0; b < row.batches; ++b) {
      internal::RandomBatchOptions o;
      o.updates = row.updates + b % 31;  // 200 .. 230
      o.workers = std::max(1, 2 * o.updates / 3);
      o.aggregators = 50;
      o.worker_aggregators = true;
      o.shards = servers - 1;
      o.equal_shards = true;
      o.max_bytes = 100000000;
      o.busy_points = 8;
      o.seed = 7000 * row.updates + b + 1;
      batches.push_back(internal::RandomBatch(o));
    }
    std::vector<double> plan_ms, order_ms;
    ok = TimeBatches(batches, 3, &plan_ms, &order_ms) && ok;
    const std::string label = "|U|~" + std::to_string(row.updates) + ", S=" + std::to_string(servers);
    PrintBatchTimes(label.c_str(), batches, plan_ms, order_ms);
    if (row.updates > 20) CompareSampledSplits(batches);
    if (row.updates <= 20) {
      for (const Batch& batch : batches) {
        if (PlanToJson(*optimised.PlanBatch(batch)).dump() !=
            PlanToJson(*straightforward.PlanBatch(batch)).dump()) {
          std::printf("  DIFFERENT from the reference (seed %llu)\n",
                      static_cast<unsigned long long>(batch.seed));
          ok = false;
        }
      }
      std::printf("  plans of the reference implementation: %s\n", ok ? "identical" : "DIFFERENT");
    }
  }
  return ok;
}

// --batch_files F...: plans batches saved as JSON (BatchToJson, e.g. cut by
// the simulator) and prints the same per-batch figures.
int BatchFilesBenchmark(int argc, char** argv) {
  std::vector<Batch> batches;
  for (int i = 0; i < argc; ++i) {
    std::FILE* f = std::fopen(argv[i], "rb");
    if (f == nullptr) {
      std::fprintf(stderr, "--batch_files: cannot read '%s'\n", argv[i]);
      return 2;
    }
    std::string text;
    char buffer[1 << 16];
    for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;) text.append(buffer, n);
    std::fclose(f);
    absl::StatusOr<Batch> batch = BatchFromJsonText(text);
    if (!batch.ok()) {
      std::fprintf(stderr, "--batch_files: %s: %s\n", argv[i],
                   std::string(batch.status().message()).c_str());
      return 2;
    }
    batches.push_back(*std::move(batch));
  }
  if (batches.empty()) {
    std::fprintf(stderr, "--batch_files: give one or more batch JSON files\n");
    return 2;
  }
  PrintBatchHeader();
  std::vector<double> plan_ms, order_ms;
  const bool valid = TimeBatches(batches, 3, &plan_ms, &order_ms);
  PrintBatchTimes("batch files", batches, plan_ms, order_ms);
  return valid ? 0 : 1;
}

// One §7.4 setup: 0 has the aggregators on their own hosts, 1 co-hosted
// with workers (§7), 2 co-hosted without a replica, where streaming chains
// are considered too (aggregation.h; with a replica the planner runs Alg. 3
// alone). Prints its table; false if some plans differ or fail a check.
bool SetupBenchmark(int setup, bool quick) {
  PlannerOptions two_threads;
  two_threads.threads = 2;
  PlannerOptions reference;
  reference.reference = true;
  const MlfabricPlanner optimised, parallel(two_threads), straightforward(reference);

  struct Row {
    int updates;
    int batches;       // distinct random batches per size
    int repetitions;   // timed passes over them (optimised)
    int reference_repetitions;
  };
  const std::vector<Row> rows = {
      {10, 20, 200, 20}, {100, 5, 40, 1}, {500, 3, 15, 1}, {1000, 3, 9, 1}};
  bool identical = true;
  const bool cohosted = setup > 0, replica = setup < 2;
  std::printf("%sMLfabric planner, paper §7.4 setup (deadlines ~ U(1, 2|U|), |U|/2 workers,\n"
              "congestion-free core, 4 aggregators %s, %s)\n\n",
              setup > 0 ? "\n" : "",
              cohosted ? "co-hosted with workers as in §7" : "on their own hosts",
              replica ? "replica with 2 aggregators"
                      : "no replica: streaming chains considered too");
  std::printf("%6s | %29s %7s | %12s %7s | %12s %7s | %8s | %s\n", "|U|",
              "optimised, 1 thread", "peak", "2 threads", "peak", "reference", "peak", "speedup",
              "plans");
  std::printf("%6s | %29s %7s | %12s %7s | %12s %7s | %8s | %s\n", "",
              "ms/batch (min) [cpu ms]", "MiB", "ms/batch", "MiB", "ms/batch", "MiB", "ref/opt",
              "");
  for (const Row& row : rows) {
    std::vector<Batch> batches;
    for (int b = 0; b < row.batches; ++b) {
      internal::RandomBatchOptions o;
      o.updates = row.updates;
      o.aggregators = 4;
      o.worker_aggregators = cohosted;
      o.replica = replica;
      o.replica_aggregators = replica ? 2 : 0;
      o.seed = 1000 * row.updates + b + 1;
      batches.push_back(internal::RandomBatch(o));
    }
    const Measurement fast = Measure(optimised, batches, row.repetitions);
    const Measurement two = Measure(parallel, batches, row.repetitions);
    std::string verdict = "identical";
    double ref_ms = 0, ref_peak = 0;
    if (quick && row.updates >= 1000) {
      verdict = "(reference skipped)";
    } else {
      const Measurement ref = Measure(straightforward, batches, row.reference_repetitions);
      ref_ms = ref.ms_per_batch;
      ref_peak = ref.peak_mib;
      if (ref.plan_json != fast.plan_json) verdict = "DIFFERENT (reference)";
    }
    if (two.plan_json != fast.plan_json) verdict = "DIFFERENT (threads)";
    for (const Batch& batch : batches) {
      const auto problems = CheckPlan(batch, *optimised.PlanBatch(batch));
      if (!problems.empty()) verdict = "INVALID: " + problems[0];
    }
    // --quick skips the reference at |U| = 1000: that is no failure.
    identical = identical && (verdict == "identical" || verdict == "(reference skipped)");
    std::printf("%6d | %8.3f (%7.3f) [%8.3f] %7.2f | %12.3f %7.2f | %12.2f %7.2f | %7.0fx | %s\n",
                row.updates, fast.ms_per_batch, fast.min_ms, fast.cpu_ms, fast.peak_mib,
                two.ms_per_batch, two.peak_mib, ref_ms, ref_peak,
                ref_ms > 0 ? ref_ms / fast.ms_per_batch : 0.0, verdict.c_str());
    std::fflush(stdout);
  }
  return identical;
}

int Main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (argc > 1 && std::strcmp(argv[1], "--distribution") == 0) {
    return DistributionBenchmark(argc > 2 && std::strcmp(argv[2], "--quick") == 0) ? 0 : 1;
  }
  if (argc > 1 && std::strncmp(argv[1], "--sim_shards=", 13) == 0) {
    const int servers = std::atoi(argv[1] + 13);
    if (servers < 1) {
      std::fprintf(stderr, "--sim_shards=S: S must be a positive number of servers\n");
      return 2;
    }
    return SimShardsBenchmark(servers, argc > 2 && std::strcmp(argv[2], "--quick") == 0) ? 0 : 1;
  }
  if (argc > 1 && std::strcmp(argv[1], "--batch_files") == 0) {
    return BatchFilesBenchmark(argc - 2, argv + 2);
  }
  if (argc > 1 && std::strncmp(argv[1], "--servers=", 10) == 0) {
    const int servers = std::atoi(argv[1] + 10);
    if (servers < 1) {
      std::fprintf(stderr, "--servers=S: S must be a positive number of servers\n");
      return 2;
    }
    return ShardedBenchmark(servers) ? 0 : 1;
  }
  bool identical = true;
  for (int setup = 0; setup < 3; ++setup) {
    // Every setup runs even after one fails.
    identical = SetupBenchmark(setup, quick) && identical;
  }
  std::printf("\npaper (§7.4, one thread): |U|=100: 30 ms, 500: 440 ms, 1000: 1460 ms; "
              "|U|<10: 5 ms\n");
  identical = DistributionBenchmark(quick) && identical;
  return identical ? 0 : 1;
}

}  // namespace
}  // namespace mlfabric::core

int main(int argc, char** argv) { return mlfabric::core::Main(argc, argv); }
