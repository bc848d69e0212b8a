// A test case whose prerequisite is always missing (run by prereq_test.sh).
#include <catch2/catch.hpp>

#include "testing/prereq.h"

TEST_CASE("a test whose prerequisite is missing") {
  MLFABRIC_SKIP_TEST("the prerequisite of this check never exists");
  FAIL("unreachable: the macro returns or fails");
}
