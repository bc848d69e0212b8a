// allreduce_benchmark: one AllReduce backend, one length, many repeats, run
// under mlfabric-run (which starts the scheduler and daemons):
//
//   bazel-bin/tools/run/mlfabric-run -np 4 bazel-bin/api/allreduce_benchmark
//       --backend=mlfabric --count=1048576 --repeats=50
//   (one command line; --ranks_per_host 4 puts the ranks on one host,
//   where the mlfabric backend sums in shared memory)
//
// Rank 0 prints milliseconds per AllReduce (mean, min and max over repeats)
// after --warmup untimed calls. Meant for profiling one backend at a time
// (perf record -a while it runs); tests:allreduce_mpirun_test prints both
// backends side by side.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "api/allreduce.h"

namespace {

long FlagValue(int argc, char** argv, const char* name, long fallback) {
  const size_t n = std::strlen(name);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') return std::atol(argv[i] + n + 1);
  }
  return fallback;
}

std::string FlagString(int argc, char** argv, const char* name, const char* fallback) {
  const size_t n = std::strlen(name);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') return argv[i] + n + 1;
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mlfabric;
  AllReduceOptions options;
  options.backend = FlagString(argc, argv, "--backend", "mlfabric");
  if (const char* job = std::getenv("MLFABRIC_JOB")) options.client.job = job;
  if (const char* token = std::getenv("MLFABRIC_JOB_TOKEN")) options.client.job_token = token;
  const size_t count = static_cast<size_t>(FlagValue(argc, argv, "--count", 1 << 20));
  const int repeats = static_cast<int>(FlagValue(argc, argv, "--repeats", 20));
  const int warmup = static_cast<int>(FlagValue(argc, argv, "--warmup", 3));
  auto reducer = MakeAllReducer(options);
  if (!reducer.ok()) {
    std::fprintf(stderr, "allreduce_benchmark: %s\n", reducer.status().ToString().c_str());
    return 1;
  }
  std::vector<float> values(count, 1.0f);
  std::vector<double> ms;
  for (int i = 0; i < warmup + repeats; ++i) {
    std::fill(values.begin(), values.end(), 1.0f);
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = (*reducer)->AllReduce(values.data(), count, DataType::kFloat32);
    const double elapsed =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!status.ok() || values[0] != static_cast<float>((*reducer)->size())) {
      std::fprintf(stderr, "allreduce_benchmark: rank %d call %d: %s (sum %g)\n",
                   (*reducer)->rank(), i, status.ToString().c_str(), values[0]);
      return 1;
    }
    if (i >= warmup) ms.push_back(elapsed);
  }
  if ((*reducer)->rank() == 0 && !ms.empty()) {
    double total = 0;
    for (double m : ms) total += m;
    std::printf("allreduce_benchmark: %s, %d ranks, %zu float32: %.3f ms per AllReduce "
                "(min %.3f, max %.3f, %d repeats)\n",
                (*reducer)->backend(), (*reducer)->size(), count, total / ms.size(),
                *std::min_element(ms.begin(), ms.end()), *std::max_element(ms.begin(), ms.end()),
                repeats);
  }
  reducer->reset();
  return 0;
}
