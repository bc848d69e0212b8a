// A push's submission to the scheduler does not hold up anything else on
// its daemon. Worker A pushes to a server that has not
// registered yet: the scheduler holds that SubmitUpdate for server_wait_s
// (8 s here, under the daemon's 10 s deadline for the call) waiting for it. While A's submission is in flight, worker B
// on the same daemon pushes to a registered server. B's push must end
// applied while A's is still waiting; A's must then end failed, naming the
// missing server. When the daemon serialised submissions (and held the
// command stream behind them), B could not end before A — so this test
// fails on that design, by the order of events, not by a time limit.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <thread>

#include "api/registration.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "tests/test_util.h"

namespace mlfabric {
namespace {


TEST_CASE("A push waiting on the scheduler does not hold back another push on the same daemon") {
  const std::string dir = launch::MakeTempDir("submit-concurrency");
  const std::string config = dir + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789"}]})";
  auto started = launch::Cluster::StartLoopback(
      {"s1", "w1"}, {"--config=" + config, "--server_wait_s=8"}, {},
      {{"w1", {"--log_level=debug"}}});
  INFO(started.status().ToString());
  REQUIRE(started.ok());
  launch::Cluster& c = **started;

  testing::InProcessServer server(c.Socket("s1"), "ps0", testing::NextVersion,
                                  testing::TinyModel);
  REQUIRE(server.status().ok());

  auto connect = [&](const std::string& name) {
    ClientOptions options;
    options.daemon_socket = c.Socket("w1");
    options.name = name;
    auto worker = Worker::Connect(options);
    REQUIRE(worker.ok());
    return std::move(*worker);
  };
  std::unique_ptr<Worker> a = connect("a");
  std::unique_ptr<Worker> b = connect("b");
  const std::vector<float> update(1024, 1.0f);

  std::future<PushResult> waiting =
      a->Push("not_yet_registered", update.data(), update.size() * sizeof(float), 0, 1.0);
  // A's SubmitUpdate is in flight once its daemon says so.
  REQUIRE(launch::WaitUntil(
      [&] {
        return c.daemon("w1").Log().find("to server 'not_yet_registered'") != std::string::npos;
      },
      30));
  const auto b_start = std::chrono::steady_clock::now();
  std::future<PushResult> quick = b->Push("ps0", update.data(), update.size() * sizeof(float), 0, 1.0);
  const PushResult b_result = quick.get();
  // A figure for the record (not asserted): B's push-to-outcome time while
  // A's submission waits at the scheduler.
  std::printf("submit_concurrency_test: push B ended after %.1f ms while A's submission waited\n",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - b_start)
                  .count());
  const bool a_still_waiting =
      waiting.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
  CHECK(b_result.outcome == PushOutcome::kApplied);
  CHECK(a_still_waiting);
  const PushResult a_result = waiting.get();
  INFO("a: " << PushOutcomeName(a_result.outcome) << ": " << a_result.reason);
  CHECK(a_result.outcome == PushOutcome::kFailed);
  CHECK(a_result.reason.find("'not_yet_registered'") != std::string::npos);
}

}  // namespace
}  // namespace mlfabric
