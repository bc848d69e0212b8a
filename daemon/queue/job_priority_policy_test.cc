#include "daemon/queue/job_priority_policy.h"

#include <catch2/catch.hpp>

#include <limits>

namespace mlfabric::daemon {
namespace {

JobPriorityPolicy Make(JobPriorityMode mode, double period_s = 20.0,
                       double epoch_s = 0.0) {
  auto policy = JobPriorityPolicy::Create({mode, period_s, epoch_s});
  REQUIRE(policy.ok());
  return *policy;
}

TEST_CASE("Mode names round-trip and unknown names are rejected") {
  for (auto mode : {JobPriorityMode::kFifo, JobPriorityMode::kOne, JobPriorityMode::kRr}) {
    auto parsed = ParseJobPriorityMode(JobPriorityModeName(mode));
    REQUIRE(parsed.ok());
    CHECK(*parsed == mode);
  }
  auto bad = ParseJobPriorityMode("prio");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("prio") != std::string::npos);
}

TEST_CASE("Invalid rotation periods are rejected") {
  CHECK_FALSE(JobPriorityPolicy::Create({JobPriorityMode::kRr, 0.0, 0.0}).ok());
  CHECK_FALSE(JobPriorityPolicy::Create({JobPriorityMode::kRr, -1.0, 0.0}).ok());
  CHECK_FALSE(JobPriorityPolicy::Create(
                  {JobPriorityMode::kRr, std::numeric_limits<double>::infinity(), 0.0})
                  .ok());
}

TEST_CASE("fifo gives every job rank 0 and ranks by arrival") {
  JobPriorityPolicy policy = Make(JobPriorityMode::kFifo);
  REQUIRE(policy.AddJob(5, /*rank_key=*/3).ok());
  REQUIRE(policy.AddJob(2, /*rank_key=*/1).ok());
  CHECK(*policy.RankOf(5, 0) == 0);
  CHECK(*policy.RankOf(2, 100) == 0);
  CHECK(policy.Ranking(0) == std::vector<JobId>{5, 2});
  CHECK(policy.NextChangeTime(0) == std::numeric_limits<double>::infinity());
}

TEST_CASE("one ranks by key then arrival and re-ranks on arrival/departure") {
  JobPriorityPolicy policy = Make(JobPriorityMode::kOne);
  REQUIRE(policy.AddJob(10).ok());
  REQUIRE(policy.AddJob(11).ok());
  CHECK(policy.Ranking(0) == std::vector<JobId>{10, 11});
  // A job with a smaller key (e.g. smaller model update, §IV-B) goes first.
  REQUIRE(policy.AddJob(12, -1.0).ok());
  CHECK(policy.Ranking(0) == std::vector<JobId>{12, 10, 11});
  CHECK(*policy.RankOf(11, 1e6) == 2);  // static: time does not matter
  REQUIRE(policy.RemoveJob(12).ok());
  CHECK(policy.Ranking(0) == std::vector<JobId>{10, 11});
  CHECK(policy.AddJob(10).code() == absl::StatusCode::kAlreadyExists);
  CHECK(policy.RemoveJob(99).code() == absl::StatusCode::kNotFound);
  CHECK(policy.RankOf(99, 0).status().code() == absl::StatusCode::kNotFound);
  CHECK(policy.NextChangeTime(0) == std::numeric_limits<double>::infinity());
}

TEST_CASE("a running job's rank key can change, keeping its arrival") {
  JobPriorityPolicy policy = Make(JobPriorityMode::kOne);
  REQUIRE(policy.AddJob(1, 1.0).ok());
  REQUIRE(policy.AddJob(2, 2.0).ok());
  REQUIRE(policy.AddJob(3, 2.0).ok());
  CHECK(policy.Ranking(0) == std::vector<JobId>{1, 2, 3});
  REQUIRE(policy.SetRankKey(3, 0.5).ok());  // job 3's priority raised
  CHECK(policy.Ranking(0) == std::vector<JobId>{3, 1, 2});
  REQUIRE(policy.SetRankKey(3, 2.0).ok());  // back to 2: ties go by arrival again
  CHECK(policy.Ranking(0) == std::vector<JobId>{1, 2, 3});
  CHECK(policy.SetRankKey(9, 0).code() == absl::StatusCode::kNotFound);
  CHECK(policy.SetRankKey(1, std::nan("")).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("rr rotates the ranking every period (tensorlights §IV-C, Fig. 4)") {
  JobPriorityPolicy policy = Make(JobPriorityMode::kRr, 20.0, 100.0);
  REQUIRE(policy.AddJob(1).ok());
  REQUIRE(policy.AddJob(2).ok());
  REQUIRE(policy.AddJob(3).ok());
  CHECK(policy.Ranking(50) == std::vector<JobId>{1, 2, 3});   // before epoch
  CHECK(policy.Ranking(100) == std::vector<JobId>{1, 2, 3});
  CHECK(policy.Ranking(119.999) == std::vector<JobId>{1, 2, 3});
  CHECK(policy.Ranking(120) == std::vector<JobId>{2, 3, 1});
  CHECK(policy.Ranking(140) == std::vector<JobId>{3, 1, 2});
  CHECK(policy.Ranking(160) == std::vector<JobId>{1, 2, 3});
  CHECK(policy.NextChangeTime(50) == Approx(120));
  CHECK(policy.NextChangeTime(120) == Approx(140));
  CHECK(policy.NextChangeTime(131) == Approx(140));
  CHECK(policy.RotationIndex(161) == 3);
}

TEST_CASE("rr: every job is on top once per n periods; arrivals do not reset rotation") {
  JobPriorityPolicy policy = Make(JobPriorityMode::kRr, 20.0, 0.0);
  for (JobId j = 0; j < 4; ++j) REQUIRE(policy.AddJob(j).ok());
  std::vector<int> times_on_top(5, 0);
  for (int period = 0; period < 8; ++period) {
    std::vector<JobId> ranking = policy.Ranking(period * 20.0 + 10.0);
    // A ranking is a permutation.
    std::vector<JobId> sorted = ranking;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == std::vector<JobId>{0, 1, 2, 3});
    ++times_on_top[ranking[0]];
  }
  CHECK(times_on_top == std::vector<int>{2, 2, 2, 2, 0});
  // A job arriving mid-period does not restart the period count.
  CHECK(policy.RotationIndex(170) == 8);
  REQUIRE(policy.AddJob(4).ok());
  CHECK(policy.RotationIndex(170) == 8);
  CHECK(policy.NextChangeTime(170) == Approx(180));
}

TEST_CASE("rr with one job never changes") {
  JobPriorityPolicy policy = Make(JobPriorityMode::kRr);
  REQUIRE(policy.AddJob(1).ok());
  CHECK(*policy.RankOf(1, 1000) == 0);
  CHECK(policy.NextChangeTime(0) == std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace mlfabric::daemon
