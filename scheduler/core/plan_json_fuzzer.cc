// libFuzzer target for the planner JSON contract (plan_json.h, docs/architecture.md):
// any text must parse to a batch or give an error, never a crash; an
// accepted batch encodes and parses back to the same JSON; and both
// planners answer a small accepted batch with a plan or an error, never a
// crash. Build and run with clang: tools/fuzz plan_json [seconds]. Without
// clang, plan_json_fuzzer_smoke_test runs the entry point over the
// committed corpus (testdata/fuzz/plan_json/).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "scheduler/core/plan_json.h"
#include "scheduler/core/planner_factory.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mlfabric::core;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto batch = BatchFromJsonText(text);
  if (!batch.ok()) {
    if (batch.status().message().empty()) std::abort();
    return 0;
  }
  const auto json = BatchToJson(*batch);
  auto again = BatchFromJson(json);
  if (!again.ok() || BatchToJson(*again) != json) std::abort();
  if (batch->updates.size() > 16 || batch->hosts.size() > 16) return 0;  // keep each input fast
  for (const char* name : {"fifo", "mlfabric"}) {
    auto planner = MakePlanner(name);
    if (!planner.ok()) std::abort();
    (void)(*planner)->PlanBatch(*batch);
  }
  return 0;
}
