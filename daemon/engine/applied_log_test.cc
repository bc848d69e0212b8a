#include "daemon/engine/applied_log.h"

#include <catch2/catch.hpp>

namespace mlfabric::daemon {
namespace {

TEST_CASE("pushes are logged applied when acknowledged, an aggregate's as consecutive versions") {
  AppliedLog log;
  log.Handed(10, {});             // one push
  log.Handed(20, {21, 22, 23});   // an aggregate of three
  log.Handed(30, {});             // refused below
  auto report = log.Report();
  REQUIRE(report.size() == 5);    // all handed over, none acknowledged yet
  for (const auto& e : report) CHECK_FALSE(e.acknowledged);

  log.Acked(10, true, 7);
  log.Acked(20, true, 10);
  log.Acked(30, false, 0);
  log.Acked(99, true, 1);         // never handed: ignored
  log.Applied(40, 11);            // a round's member
  report = log.Report();
  REQUIRE(report.size() == 5);
  CHECK(report[0].push == 10);
  CHECK(report[0].model_version == 7);
  CHECK(report[1].push == 21);
  CHECK(report[1].model_version == 8);
  CHECK(report[3].push == 23);
  CHECK(report[3].model_version == 10);
  CHECK(report[4].push == 40);
  for (const auto& e : report) CHECK(e.acknowledged);
  CHECK(log.Contains(22));
  CHECK_FALSE(log.Contains(30));
}

TEST_CASE("the log keeps the most recent pushes, each once") {
  AppliedLog log(3);
  for (uint64_t push = 1; push <= 5; ++push) log.Applied(push, static_cast<int64_t>(push));
  log.Applied(5, 9);  // again: kept once, as first logged
  const auto report = log.Report();
  REQUIRE(report.size() == 3);
  CHECK(report[0].push == 3);
  CHECK(report[2].push == 5);
  CHECK(report[2].model_version == 5);
  CHECK_FALSE(log.Contains(1));
}

}  // namespace
}  // namespace mlfabric::daemon
