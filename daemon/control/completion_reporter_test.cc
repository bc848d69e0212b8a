#include "daemon/control/completion_reporter.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

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

TEST_CASE("reports queued while a call is out go together in the next call, in order") {
  FakeSchedulerClient fake;
  std::mutex mu;
  std::condition_variable cv;
  bool sending = false, queued = false;
  // The first report's call waits until 30 more are queued behind it.
  fake.completion_hook = [&](const v1::CompletionReport& r) {
    if (r.transfer_id() == 1) {
      std::unique_lock<std::mutex> lock(mu);
      sending = true;
      cv.notify_all();
      cv.wait(lock, [&] { return queued; });
    }
    return r.transfer_id() == 5 ? absl::UnavailableError("down") : absl::OkStatus();
  };
  CompletionReporter reporter(&fake, "s1");
  reporter.ReportPartReady(1);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return sending; });
  }
  for (uint64_t id = 2; id <= 31; ++id) {
    if (id % 2 == 0) {
      reporter.ReportPartReady(id);
    } else {
      reporter.ReportFailure(id, "reason");
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    queued = true;
  }
  cv.notify_all();
  REQUIRE(fake.WaitForCompletions(31, std::chrono::seconds(30)));
  const auto reports = fake.completions();
  REQUIRE(reports.size() == 31);
  for (size_t i = 0; i < reports.size(); ++i) {
    CHECK(reports[i].transfer_id() == i + 1);
    CHECK(reports[i].host() == "s1");
    CHECK(reports[i].part_ready() == (i == 0 || (i + 1) % 2 == 0));
  }
  // The first alone (nothing else was queued when it went), then one call
  // for the 30 behind it, a failed report among them.
  CHECK(fake.completion_batches() == std::vector<size_t>{30});
}

TEST_CASE("Stop sends the reports still queued: applied updates survive a shutdown") {
  FakeSchedulerClient fake;
  std::mutex mu;
  std::condition_variable cv;
  bool sending = false, release = false;
  fake.completion_hook = [&](const v1::CompletionReport& r) {
    if (r.transfer_id() == 1) {
      std::unique_lock<std::mutex> lock(mu);
      sending = true;
      cv.notify_all();
      cv.wait(lock, [&] { return release; });
    }
    return absl::OkStatus();
  };
  CompletionReporter reporter(&fake, "s1");
  reporter.ReportFailure(1, "first");
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return sending; });
  }
  for (uint64_t id = 2; id <= 5; ++id) {
    v1::CompletionReport applied;
    applied.set_transfer_id(id);
    applied.set_applied(true);
    applied.set_model_version(static_cast<int64_t>(id));
    reporter.Report(applied);
  }
  std::thread stopping([&] { reporter.Stop(); });
  // Stop has begun (it waits for the call out); then that call returns.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  stopping.join();
  const auto reports = fake.completions();
  REQUIRE(reports.size() == 5);
  for (size_t i = 1; i < reports.size(); ++i) {
    CHECK(reports[i].transfer_id() == i + 1);
    CHECK(reports[i].host() == "s1");  // the reporter's own host
    CHECK(reports[i].applied());
  }
}

}  // namespace
}  // namespace mlfabric::daemon
