#include "scheduler/service/straggler_tracker.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

// Each worker pushes every `period` seconds for `n` iterations; each push
// takes `transfer` seconds to end.
void Run(StragglerTracker* t, const std::string& worker, double period, double transfer, int n) {
  for (int i = 0; i < n; ++i) {
    const double at = period * i;
    t->OnPush("job", worker, at);
    t->OnOutcome("job", worker, at, at + transfer);
  }
}

const WorkerTiming& Find(const std::vector<WorkerTiming>& all, const std::string& worker) {
  for (const WorkerTiming& t : all) {
    if (t.worker == worker) return t;
  }
  FAIL("no worker " << worker);
  return all.front();
}

TEST_CASE("a worker slower than factor x the job's median is flagged") {
  StragglerTracker tracker({/*factor=*/1.5, /*window=*/20, /*min_samples=*/3});
  Run(&tracker, "fast0", 0.1, 0.02, 30);
  Run(&tracker, "fast1", 0.11, 0.02, 30);
  Run(&tracker, "slow", 0.3, 0.02, 10);
  const auto all = tracker.Evaluate("job");
  REQUIRE(all.size() == 3);
  CHECK(Find(all, "slow").straggler);
  CHECK(Find(all, "slow").slowdown == Approx(0.3 / 0.11));
  CHECK_FALSE(Find(all, "fast0").straggler);
  CHECK_FALSE(Find(all, "fast1").straggler);
  CHECK(Find(all, "fast0").iterations == 30);
  CHECK(Find(all, "slow").iterations == 10);
  CHECK(Find(all, "fast0").iteration_s == Approx(0.1));
  CHECK(Find(all, "fast0").transfer_s == Approx(0.02));
  CHECK(Find(all, "fast0").compute_s == Approx(0.08));
  CHECK(tracker.IsStraggler("job", "slow"));
  CHECK_FALSE(tracker.IsStraggler("other", "slow"));
}

TEST_CASE("no flag without enough samples or peers") {
  StragglerTracker tracker({1.5, 20, 3});
  Run(&tracker, "a", 0.1, 0.01, 30);
  Run(&tracker, "b", 1.0, 0.01, 3);  // 2 intervals < min_samples
  auto all = tracker.Evaluate("job");
  CHECK_FALSE(Find(all, "b").straggler);
  CHECK(Find(all, "b").slowdown == 0);
  StragglerTracker alone({1.5, 20, 3});
  Run(&alone, "a", 5.0, 0.01, 10);
  CHECK_FALSE(alone.Evaluate("job")[0].straggler);  // nobody to be slower than
}

TEST_CASE("the window forgets old samples: a worker that recovers is no longer flagged") {
  StragglerTracker tracker({1.5, 5, 3});
  Run(&tracker, "a", 0.1, 0.01, 20);
  Run(&tracker, "b", 0.1, 0.01, 20);
  for (int i = 0; i < 6; ++i) tracker.OnPush("job", "c", 1.0 * i);  // slow
  CHECK(tracker.IsStraggler("job", "c"));
  for (int i = 0; i < 6; ++i) tracker.OnPush("job", "c", 5.0 + 0.1 * (i + 1));  // recovered
  CHECK_FALSE(tracker.IsStraggler("job", "c"));
  tracker.Leave("job", "c");
  CHECK(tracker.Evaluate("job").size() == 2);
}

TEST_CASE("a worker that left is out of the median and unjudged; a rejoin keeps its clock") {
  StragglerTracker tracker({1.5, 20, 3});
  Run(&tracker, "a", 0.1, 0.01, 10);
  Run(&tracker, "b", 0.3, 0.01, 10);
  Run(&tracker, "c", 0.3, 0.01, 10);
  // The median is 0.3: a, at a third of it, is no straggler, b and c neither.
  CHECK_FALSE(tracker.IsStraggler("job", "b"));
  tracker.Leave("job", "c");
  // Without c the median of a and b is 0.2, and b (1.5x it) is not above 1.5x.
  CHECK(tracker.Evaluate("job").size() == 2);
  CHECK(Find(tracker.Evaluate("job"), "b").slowdown == Approx(1.5));
  CHECK_FALSE(tracker.IsStraggler("job", "c"));
  CHECK(tracker.Iterations("job", "c") == 10);  // its clock is kept
  tracker.Leave("job", "b");
  CHECK(Find(tracker.Evaluate("job"), "a").slowdown == 0);  // nobody left to compare with
  tracker.Rejoin("job", "c");
  // Its first push after the rejoin is no iteration: the time away is not counted.
  tracker.OnPush("job", "c", 1000.0);
  CHECK(tracker.Iterations("job", "c") == 11);
  CHECK(Find(tracker.Evaluate("job"), "c").iteration_s == Approx(0.3));
}

TEST_CASE("jobs are judged separately") {
  StragglerTracker tracker({1.5, 20, 3});
  Run(&tracker, "a", 0.1, 0.01, 10);
  Run(&tracker, "b", 0.1, 0.01, 10);
  for (int i = 0; i < 10; ++i) tracker.OnPush("other", "z", 2.0 * i);
  CHECK(tracker.Evaluate("job").size() == 2);
  CHECK(tracker.Evaluate("other").size() == 1);
  CHECK_FALSE(tracker.IsStraggler("other", "z"));
}

}  // namespace
}  // namespace mlfabric
