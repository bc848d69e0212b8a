// Cross-process tests of the first end-to-end path: the real scheduler, real
// daemons on loopback, real server and worker applications.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "launch/cluster.h"
#include "launch/process.h"
#include "proto/scheduler.grpc.pb.h"
#include "tests/test_util.h"

namespace mlfabric {
namespace {

using launch::BinaryPath;
using launch::ReadFile;
using launch::Subprocess;
using launch::WaitUntil;

std::string WriteFile(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST_CASE("Three workers' integer pushes sum exactly at the server, all applied") {
  auto cluster = launch::Cluster::StartLoopback({"s1", "w1", "w2", "w3"});
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  launch::Cluster& c = **cluster;
  const int kPushes = 15, kDim = 5000;
  const std::string model_path = c.dir() + "/model.txt";
  auto server = c.StartApp("server", {BinaryPath("testing/apps/sum_server"),
                                      "--socket=" + c.Socket("s1"), "--dim=" + std::to_string(kDim),
                                      "--expect_updates=" + std::to_string(3 * kPushes),
                                      "--out=" + model_path});
  REQUIRE(server.ok());
  std::vector<Subprocess*> workers;
  for (int w = 1; w <= 3; ++w) {
    const std::string name = "w" + std::to_string(w);
    auto worker = c.StartApp(
        name, {BinaryPath("testing/apps/vector_worker"), "--socket=" + c.Socket(name),
               "--name=" + name, "--seed=" + std::to_string(w), "--dim=" + std::to_string(kDim),
               "--pushes=" + std::to_string(kPushes), "--out=" + c.dir() + "/sum" + name + ".txt"});
    REQUIRE(worker.ok());
    workers.push_back(*worker);
  }
  for (int w = 0; w < 3; ++w) {
    auto code = workers[w]->WaitFor(120);
    INFO(workers[w]->Log());
    INFO("sum_server: " + (*server)->Log());
    INFO("s1's daemon: " + c.daemon("s1").Log());
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    CHECK(workers[w]->Log().find("applied=" + std::to_string(kPushes) + " dropped=0 failed=0") !=
          std::string::npos);
    // A push made after an earlier one ended reuses its shared buffer (the
    // daemon released it with the outcome). With 4 in flight, 11 of the 15
    // pushes could; a sender thread still holding a finished push's buffer
    // for a moment after its last write makes the daemon keep it, so half
    // is the bound (every run here reused 11).
    const std::string& log = workers[w]->Log();
    const size_t at = log.find("buffers_reused=");
    REQUIRE(at != std::string::npos);
    CHECK(std::atoi(log.c_str() + at + 15) >= (kPushes - 4) / 2);
  }
  REQUIRE(WaitUntil([&] { return !ReadFile(model_path).empty(); }, 30));
  CHECK(testing::SumMismatches(model_path, c.dir(), {"w1", "w2", "w3"}, kDim) == 0);
}

TEST_CASE("A bad config exits non-zero with a message naming the key") {
  const std::string dir = launch::MakeTempDir("config");
  struct Case {
    std::string binary, file, text, key;
  };
  const std::vector<Case> cases = {
      {"scheduler/mlfabric-scheduler", "unknown.json", R"({"batch_interval": 100})",
       "batch_interval"},
      {"scheduler/mlfabric-scheduler", "type.json", R"({"grpc_port": "fifty"})", "grpc_port"},
      {"scheduler/mlfabric-scheduler", "range.json", R"({"batch_interval_ms": -4})",
       "batch_interval_ms"},
      {"daemon/mlfabricd", "daemon.json", R"({"host": "w1", "payload_byte": 4096})",
       "payload_byte"},
      {"daemon/mlfabricd", "daemon_type.json", R"({"host": 7})", "host"},
  };
  for (const Case& c : cases) {
    const std::string path = WriteFile(dir, c.file, c.text);
    auto proc = Subprocess::Start({BinaryPath(c.binary), "--config=" + path}, dir + "/" + c.file + ".log");
    REQUIRE(proc.ok());
    auto code = (*proc)->WaitFor(30);
    INFO(c.binary << " " << c.text << ": " << (*proc)->Log());
    REQUIRE(code.has_value());
    CHECK(*code == 2);
    CHECK((*proc)->Log().find(c.key) != std::string::npos);
  }
}

TEST_CASE("Invalid submits get INVALID_ARGUMENT and the scheduler keeps serving") {
  // This test submits for host w1 without being it: hosts are not
  // authenticated here (tests/security_test covers that they can be).
  launch::ClusterOptions options;
  options.hosts = {"s1", "w1"};
  options.cluster_secret = false;
  auto cluster = launch::Cluster::Create(options);
  REQUIRE(cluster.ok());
  REQUIRE((*cluster)->Start().ok());
  launch::Cluster& c = **cluster;
  auto server = c.StartApp("server", {BinaryPath("testing/apps/sum_server"),
                                      "--socket=" + c.Socket("s1"), "--dim=64"});
  REQUIRE(server.ok());
  REQUIRE(WaitUntil(
      [&] { return ReadFile(c.dir() + "/scheduler.log").find("server ps0") != std::string::npos; },
      30));

  auto stub = v1::Scheduler::NewStub(
      grpc::CreateChannel(c.scheduler_address(), grpc::InsecureChannelCredentials()));
  auto submit = [&](const std::function<void(v1::SubmitUpdateRequest*)>& edit) {
    v1::SubmitUpdateRequest request;
    request.set_job("demo");
    request.set_src_host("w1");
    request.set_server("ps0");
    request.set_bytes(256);
    edit(&request);
    v1::SubmitUpdateReply reply;
    grpc::ClientContext context;
    context.AddMetadata("x-mlfabric-job-token", std::getenv("MLFABRIC_JOB_TOKEN"));
    return stub->SubmitUpdate(&context, request, &reply);
  };
  auto status = submit([](auto* r) { r->set_bytes(-1); });
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message().find("bytes") != std::string::npos);
  status = submit([](auto* r) { r->set_bytes(int64_t{1} << 55); });
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message().find("max_update_bytes") != std::string::npos);
  status = submit([](auto* r) { r->set_job("no-such-job"); });
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message().find("no-such-job") != std::string::npos);

  // The scheduler is still up and a real worker's pushes go through.
  auto worker = c.StartApp("w1", {BinaryPath("testing/apps/vector_worker"),
                                  "--socket=" + c.Socket("w1"), "--name=w1", "--dim=64",
                                  "--pushes=5"});
  REQUIRE(worker.ok());
  auto code = (*worker)->WaitFor(60);
  INFO((*worker)->Log());
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(c.scheduler().Running());
}

TEST_CASE("Killing a worker's daemon mid-push fails that push; others go on") {
  auto cluster = launch::Cluster::StartLoopback({"s1", "w1", "w2"});
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  launch::Cluster& c = **cluster;
  auto server = c.StartApp("server", {BinaryPath("testing/apps/sum_server"),
                                      "--socket=" + c.Socket("s1"), "--dim=262144",
                                      "--progress_every=1"});
  REQUIRE(server.ok());
  // w1 pushes 1 MiB updates for a long time, several in flight at once.
  auto doomed = c.StartApp("w1", {BinaryPath("testing/apps/vector_worker"),
                                  "--socket=" + c.Socket("w1"), "--name=w1", "--dim=262144",
                                  "--pushes=100000", "--window=8", "--get=false"});
  REQUIRE(doomed.ok());
  REQUIRE(WaitUntil(
      [&] { return testing::CountOccurrences((*server)->Log(), "sum_server: applied") >= 5; },
      60));
  c.daemon("w1").Signal(SIGKILL);

  // Bounded: the worker's in-flight pushes complete as failed, it exits.
  auto code = (*doomed)->WaitFor(30);
  INFO((*doomed)->Log());
  REQUIRE(code.has_value());
  CHECK(*code == 3);
  CHECK((*doomed)->Log().find("push failed: lost the connection to the MLfabric daemon") !=
        std::string::npos);

  // The server is not stalled behind w1's cancelled updates.
  auto survivor = c.StartApp("w2", {BinaryPath("testing/apps/vector_worker"),
                                    "--socket=" + c.Socket("w2"), "--name=w2", "--dim=262144",
                                    "--pushes=5"});
  REQUIRE(survivor.ok());
  auto survivor_code = (*survivor)->WaitFor(60);
  INFO((*survivor)->Log());
  REQUIRE(survivor_code.has_value());
  CHECK(*survivor_code == 0);
  CHECK(ReadFile(c.dir() + "/scheduler.log").find("host w1 is down") != std::string::npos);
}

}  // namespace
}  // namespace mlfabric

namespace mlfabric {
namespace {

TEST_CASE("The scheduler and daemons exit cleanly and promptly on SIGTERM") {
  auto cluster = launch::Cluster::StartLoopback({"s1", "w1"});
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  launch::Cluster& c = **cluster;
  auto server = c.StartApp("server", {launch::BinaryPath("testing/apps/sum_server"),
                                      "--socket=" + c.Socket("s1"), "--dim=64"});
  REQUIRE(server.ok());
  auto worker = c.StartApp("w1", {launch::BinaryPath("testing/apps/vector_worker"),
                                  "--socket=" + c.Socket("w1"), "--name=w1", "--dim=64",
                                  "--pushes=3"});
  REQUIRE(worker.ok());
  const int worker_code = (*worker)->WaitFor(60).value_or(-1);
  INFO((*worker)->Log());
  REQUIRE(worker_code == 0);
  // Stop() sends SIGTERM and only escalates to SIGKILL (exit 137) after
  // the grace period: exit code 0 means a clean, prompt shutdown.
  for (const std::string host : {"s1", "w1"}) {
    INFO(host << ": " << c.daemon(host).Log());
    CHECK(c.daemon(host).Stop(/*grace_s=*/5) == 0);
  }
  INFO(c.scheduler().Log());
  CHECK(c.scheduler().Stop(/*grace_s=*/5) == 0);
}

}  // namespace
}  // namespace mlfabric
