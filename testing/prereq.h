// Missing test prerequisites (root, network namespaces, tc, Chromium,
// TensorFlow, clang, ...): a skip outside CI, a failure under CI.
//
//   if (std::string why = ns.Create(); !why.empty()) MLFABRIC_SKIP_TEST(why);
//
// Outside CI the test prints "SKIPPED: <reason>" (tools/test counts these)
// and returns. With MLFABRIC_REQUIRE_PREREQS=1 — tools/test sets it when
// CI=true, where tools/bootstrap has installed everything — the same call
// fails the test with the reason instead, so CI never passes a test that
// did not run. Shell tests use testing/prereq.sh, Python ones the same
// variable.
#ifndef MLFABRIC_TESTING_PREREQ_H_
#define MLFABRIC_TESTING_PREREQ_H_

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

namespace mlfabric::testing {

inline bool PrerequisitesRequired() {
  const char* value = std::getenv("MLFABRIC_REQUIRE_PREREQS");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace mlfabric::testing

// Inside a Catch2 TEST_CASE: skips (returns) or, under CI, fails with `why`.
#define MLFABRIC_SKIP_TEST(why)                                                      \
  do {                                                                              \
    const std::string mlfabric_skip_why = (why);                                    \
    if (::mlfabric::testing::PrerequisitesRequired()) {                             \
      FAIL("missing prerequisite (required under CI, MLFABRIC_REQUIRE_PREREQS=1): " \
           << mlfabric_skip_why);                                                   \
    }                                                                               \
    std::cout << "SKIPPED: " << mlfabric_skip_why << std::endl;                     \
    WARN("SKIPPED: " << mlfabric_skip_why);                                         \
    return;                                                                         \
  } while (0)

#endif  // MLFABRIC_TESTING_PREREQ_H_
