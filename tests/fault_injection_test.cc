// Training under injected faults (tests/fault_driver.h):
// one of each kind of fault, each followed by a check that every push
// ended exactly once and that each server's model is exactly the sum of
// the pushes reported applied; at the end, the job finishes. Hosts in
// network namespaces (root); tests/fault_benchmark runs more cycles and
// prints the recovery times.
#include <catch2/catch.hpp>

#include <cstdio>

#include "testing/prereq.h"
#include "tests/fault_driver.h"

namespace mlfabric {
namespace {

TEST_CASE("Training survives one fault of each kind with every push accounted for, exactly") {
  testing::FaultRunOptions options;
  options.cycles = 1;
  auto run = testing::RunFaultScript(options);
  if (!run.ok() && run.status().code() == absl::StatusCode::kFailedPrecondition) {
    MLFABRIC_SKIP_TEST(std::string(run.status().message()));
  }
  INFO(run.status().ToString());
  REQUIRE(run.ok());
  const testing::FaultReport& r = *run;
  std::printf("%lld pushes: %lld applied, %lld dropped, %lld failed; %lld gets (%lld failed)\n",
              static_cast<long long>(r.pushes), static_cast<long long>(r.applied),
              static_cast<long long>(r.dropped), static_cast<long long>(r.failed),
              static_cast<long long>(r.gets), static_cast<long long>(r.get_errors));
  for (const std::string& reason : r.reasons) std::printf("  %s\n", reason.c_str());

  REQUIRE(r.faults.size() == 7);
  for (const testing::FaultRecord& f : r.faults) {
    INFO(f.kind << ": " << f.description << " (recovery " << f.recovery_s << " s, lost "
                << f.lost << ", extra " << f.extra << f.culprits << ")");
    CHECK(f.recovered);
    CHECK(f.exact);
    if (f.kind == "link") CHECK(f.detected_s >= 0);
  }
  // Every push ended exactly once, and the ones that did not apply say why.
  CHECK(r.outcomes == r.pushes);
  CHECK(r.applied + r.dropped + r.failed == r.pushes);
  CHECK(r.failed_without_reason == 0);
  CHECK(r.applied > 0);
  // The servers' models: exactly the sum of what was reported applied.
  INFO(r.culprits);
  CHECK(r.final_exact);
  CHECK(r.lost == 0);
  CHECK(r.extra == 0);
  CHECK(r.finished);
}

}  // namespace
}  // namespace mlfabric
