// The fault-injection benchmark: the driver of
// tests/fault_driver.h run for more cycles, printing each fault's recovery
// time and the totals against the targets. Needs root (namespaces).
//
//   bazel run -c opt //tests:fault_benchmark -- --cycles=5   # 23 faults
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "tests/fault_driver.h"

namespace {

constexpr char kUsage[] =
    "Trains a job under a scripted sequence of faults and prints recovery times.\n"
    "Usage: fault_benchmark [--cycles=N]\n"
    "  --cycles=N  cycles of the repeatable faults (aggregator, worker daemon, link cut,\n"
    "              scheduler restart), default 5; the run injects 4 * N + 3 faults\n";

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int cycles = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    char* end = nullptr;
    if (arg.rfind("--cycles=", 0) == 0) {
      cycles = static_cast<int>(std::strtol(arg.c_str() + 9, &end, 10));
      if (*end != '\0' || end == arg.c_str() + 9 || cycles < 1) {
        std::fprintf(stderr, "fault_benchmark: --cycles wants a whole number >= 1, not '%s'\n",
                     arg.c_str() + 9);
        return 2;
      }
      continue;
    }
    std::fprintf(stderr, "fault_benchmark: unknown argument '%s'\n%s", arg.c_str(), kUsage);
    return 2;
  }
  mlfabric::testing::FaultRunOptions options;
  options.cycles = cycles;
  auto run = mlfabric::testing::RunFaultScript(options);
  if (!run.ok()) {
    std::fprintf(stderr, "fault_benchmark: %s\n", run.status().ToString().c_str());
    return 1;
  }
  const mlfabric::testing::FaultReport& r = *run;
  std::map<std::string, std::vector<double>> recovery, all_back, detection;
  int survived = 0;
  for (const auto& f : r.faults) {
    if (f.recovered && f.exact) ++survived;
    recovery[f.kind].push_back(f.recovery_s);
    all_back[f.kind].push_back(f.all_back_s);
    if (f.detected_s >= 0) detection[f.kind].push_back(f.detected_s);
  }
  std::printf("\n%-11s %6s %9s %9s %9s %14s\n", "fault", "count", "min s", "median s", "max s",
              "all back (med)");
  for (const auto& [kind, times] : recovery) {
    std::printf("%-11s %6zu %9.2f %9.2f %9.2f %14.2f\n", kind.c_str(), times.size(),
                *std::min_element(times.begin(), times.end()), Median(times),
                *std::max_element(times.begin(), times.end()), Median(all_back[kind]));
  }
  std::printf("(recovery: from the fault, or a cut link's restoring, to the first push "
              "submitted after the fault began that applied, at each server concerned; all back: "
              "every worker's)\n");
  for (const auto& [kind, times] : detection) {
    std::printf("%s cut detected (the scheduler marked the host down): median %.2f s, max %.2f s "
                "(target <= 5 s)\n",
                kind.c_str(), Median(times), *std::max_element(times.begin(), times.end()));
  }
  if (recovery.count("server")) {
    std::printf("server death to the first update applied at the promoted replica: %.2f s "
                "(target <= 2 s)\n", recovery["server"][0]);
  }
  if (recovery.count("scheduler")) {
    std::printf("scheduler restart to the first applied update: median %.2f s (target <= 2 s)\n",
                Median(recovery["scheduler"]));
  }
  std::printf("faults survived: %d of %zu (target >= 20); pushes %lld: %lld applied, %lld "
              "dropped, %lld failed, %lld without an outcome; lost %lld, applied twice or "
              "after failing %lld (target 0 and 0); models exact at the end: %s; job "
              "finished: %s; %.0f s\n",
              survived, r.faults.size(), static_cast<long long>(r.pushes),
              static_cast<long long>(r.applied), static_cast<long long>(r.dropped),
              static_cast<long long>(r.failed), static_cast<long long>(r.pushes - r.outcomes),
              static_cast<long long>(r.lost), static_cast<long long>(r.extra),
              r.final_exact ? "yes" : "NO", r.finished ? "yes" : "NO", r.seconds);
  for (const std::string& reason : r.reasons) std::printf("  %s\n", reason.c_str());
  if (!r.culprits.empty()) std::printf("the final check disagreed%s\n", r.culprits.c_str());
  return survived == static_cast<int>(r.faults.size()) && r.final_exact && r.finished ? 0 : 1;
}
