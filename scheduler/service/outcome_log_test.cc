#include "scheduler/service/outcome_log.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

TEST_CASE("a push's first outcome stands") {
  OutcomeLog log;
  CHECK(log.Find(42) == nullptr);
  log.Remember(42, {v1::OUTCOME_APPLIED, "", 7, 1});
  log.Remember(42, {v1::OUTCOME_FAILED, "late report", 0, 0});
  REQUIRE(log.Find(42) != nullptr);
  CHECK(log.Find(42)->outcome == v1::OUTCOME_APPLIED);
  CHECK(log.Find(42)->applied_version == 7);
  CHECK(log.outcomes() == 1);
}

TEST_CASE("the oldest outcomes are forgotten past the window, in the order remembered") {
  OutcomeLog log;
  // Remembered out of id order: the window follows the order remembered.
  log.Remember(1000000, {v1::OUTCOME_DROPPED, "stale", 0, 0});
  for (uint64_t id = 1; id < OutcomeLog::kRecentOutcomes; ++id) {
    log.Remember(id, {v1::OUTCOME_APPLIED, "", 1, 0});
  }
  CHECK(log.outcomes() == OutcomeLog::kRecentOutcomes);
  REQUIRE(log.Find(1000000) != nullptr);
  log.Remember(OutcomeLog::kRecentOutcomes, {v1::OUTCOME_APPLIED, "", 1, 0});
  CHECK(log.outcomes() == OutcomeLog::kRecentOutcomes);
  CHECK(log.Find(1000000) == nullptr);
  CHECK(log.Find(1) != nullptr);
  CHECK(log.Find(OutcomeLog::kRecentOutcomes) != nullptr);
}

TEST_CASE("a uid names the push that first claimed it; uid 0 names nothing") {
  OutcomeLog log;
  log.RememberUid(5, 100, "demo", "w1");
  log.RememberUid(5, 200, "other", "w2");
  log.RememberUid(0, 300, "demo", "w1");
  REQUIRE(log.FindUid(5) != nullptr);
  CHECK(log.FindUid(5)->transfer_id == 100);
  CHECK(log.FindUid(5)->job == "demo");
  CHECK(log.FindUid(5)->worker == "w1");
  CHECK(log.FindUid(0) == nullptr);
  CHECK(log.uids() == 1);
}

TEST_CASE("the oldest uids are forgotten past the window") {
  OutcomeLog log;
  log.RememberUid(5, 100, "demo", "w1");
  for (uint64_t uid = 10; uid < 10 + OutcomeLog::kPushUids; ++uid) {
    log.RememberUid(uid, uid, "demo", "w1");
  }
  CHECK(log.uids() == OutcomeLog::kPushUids);
  CHECK(log.FindUid(5) == nullptr);
  CHECK(log.FindUid(10) != nullptr);
  CHECK(log.FindUid(10 + OutcomeLog::kPushUids - 1) != nullptr);
}

}  // namespace
}  // namespace mlfabric
