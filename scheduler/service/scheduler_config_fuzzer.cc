// libFuzzer target for the scheduler's config loader (common/config.h
// ParseJsonText + ConfigReader, scheduler_config.h): any bytes must give a
// config or an error that names what was wrong, never a crash; a config
// that loads keeps every job's name and token non-empty and its bounds in
// range. Build and run with clang: tools/fuzz scheduler_config [seconds].
// Without clang, scheduler_config_fuzzer_smoke_test runs the entry point
// over the committed corpus (testdata/fuzz/scheduler_config/).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/config.h"
#include "nlohmann/json.hpp"
#include "scheduler/service/scheduler_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mlfabric;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto json = ParseJsonText(text, "fuzz");
  if (!json.ok()) {
    if (json.status().message().empty()) std::abort();
    return 0;
  }
  auto config = LoadSchedulerConfig(ConfigReader(std::move(*json), "fuzz"));
  if (!config.ok()) {
    if (config.status().message().empty()) std::abort();
    return 0;
  }
  for (const JobConfig& job : config->jobs) {
    if (job.name.empty() || job.tau_max < 0 || job.tau_max > kMaxDelayBound) std::abort();
  }
  return 0;
}
