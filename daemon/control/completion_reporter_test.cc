#include "daemon/control/completion_reporter.h"

#include <chrono>

#include <catch2/catch.hpp>

#include "daemon/control/fake_scheduler_client.h"

namespace mlfabric::daemon {
namespace {

TEST_CASE("failures are reported in order from the reporter's own thread") {
  FakeSchedulerClient fake;
  CompletionReporter reporter(&fake, "w1");
  for (uint64_t id = 1; id <= 50; ++id) reporter.ReportFailure(id, "reason " + std::to_string(id));
  REQUIRE(fake.WaitForCompletions(50, std::chrono::seconds(30)));
  const auto reports = fake.completions();
  for (size_t i = 0; i < reports.size(); ++i) {
    CHECK(reports[i].transfer_id() == i + 1);
    CHECK(reports[i].host() == "w1");
    CHECK_FALSE(reports[i].applied());
    CHECK(reports[i].error() == "reason " + std::to_string(i + 1));
  }
}

TEST_CASE("a scheduler that answers NotFound or fails does not stop the reporter") {
  FakeSchedulerClient fake;
  fake.completion_hook = [](const v1::CompletionReport& r) {
    return r.transfer_id() == 1 ? absl::NotFoundError("ended") : absl::UnavailableError("down");
  };
  CompletionReporter reporter(&fake, "w1");
  reporter.ReportFailure(1, "a");
  reporter.ReportFailure(2, "b");
  REQUIRE(fake.WaitForCompletions(2, std::chrono::seconds(30)));
  reporter.Stop();
  reporter.ReportFailure(3, "after stop");  // dropped: the host is going away
  CHECK(fake.completions().size() == 2);
}

}  // namespace
}  // namespace mlfabric::daemon
