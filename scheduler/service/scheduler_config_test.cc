#include <sys/stat.h>
#include "scheduler/service/scheduler_config.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>

namespace mlfabric {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

absl::StatusOr<SchedulerConfig> Load(std::vector<std::string> args) {
  std::vector<const char*> argv = {"mlfabric-scheduler"};
  for (const auto& a : args) argv.push_back(a.c_str());
  auto cl = ParseCommandLine(static_cast<int>(argv.size()), argv.data());
  REQUIRE(cl.ok());
  return LoadSchedulerConfig(*cl);
}

TEST_CASE("Scheduler config: defaults, file and flags") {
  // No job (and no token) ships by default: a config must declare them.
  auto bare = Load({});
  REQUIRE_FALSE(bare.ok());
  CHECK(std::string(bare.status().message()).find("no job is configured") != std::string::npos);
  auto config = Load({"--config=" + WriteTemp("one.json", R"({"jobs": [{"name": "j", "token": "t"}]})")});
  REQUIRE(config.ok());
  CHECK(config->batch_interval_ms == 100);
  CHECK(config->jobs.size() == 1);

  const std::string path = WriteTemp(
      "sched.json",
      R"({"grpc_port": 6000, "jobs": [{"name": "a", "token": "t", "tau_max": 5, "mode": "sync"}]})");
  config = Load({"--config=" + path, "--grpc_port=7000"});
  REQUIRE(config.ok());
  CHECK(config->grpc_port == 7000);
  REQUIRE(config->jobs.size() == 1);
  CHECK(config->jobs[0].tau_max == 5);
  CHECK(config->jobs[0].mode == JobMode::kSync);
}

TEST_CASE("Scheduler config: authentication keys, and what a non-loopback address needs") {
  const std::string jobs = WriteTemp("auth_jobs.json", R"({"jobs": [{"name": "j", "token": "short"}]})");
  const std::string secret = WriteTemp("auth.secret", "s3cret\n");
  ::chmod(secret.c_str(), 0600);
  auto loopback = Load({"--config=" + jobs, "--cluster_secret_file=" + secret});
  REQUIRE(loopback.ok());
  CHECK(loopback->cluster_secret == "s3cret");
  CHECK(loopback->data_plane_auth);
  CHECK_FALSE(loopback->data_plane_encryption);
  auto sealed = Load({"--config=" + jobs, "--data_plane_encryption=true"});
  REQUIRE(sealed.ok());
  CHECK(sealed->data_plane_encryption);
  auto sealed_without_auth =
      Load({"--config=" + jobs, "--data_plane_encryption=true", "--data_plane_auth=false"});
  REQUIRE_FALSE(sealed_without_auth.ok());
  CHECK(std::string(sealed_without_auth.status().message())
            .find("flag --data_plane_encryption: needs data_plane_auth") != std::string::npos);

  auto open = Load({"--config=" + jobs, "--listen_address=0.0.0.0"});
  REQUIRE_FALSE(open.ok());
  const std::string why(open.status().message());
  CHECK(why.find("listen_address: 0.0.0.0 is not a loopback address") != std::string::npos);
  auto short_token = Load({"--config=" + jobs, "--listen_address=0.0.0.0",
                           "--cluster_secret_file=" + secret});
  REQUIRE_FALSE(short_token.ok());
  CHECK(std::string(short_token.status().message()).find("its token has 5 characters") !=
        std::string::npos);

  const std::string long_token = WriteTemp(
      "auth_long.json", R"({"jobs": [{"name": "j", "token": "0123456789abcdef"}]})");
  CHECK(Load({"--config=" + long_token, "--listen_address=10.0.0.1",
              "--cluster_secret_file=" + secret}).ok());

  ::chmod(secret.c_str(), 0644);
  auto readable = Load({"--config=" + jobs, "--cluster_secret_file=" + secret});
  REQUIRE_FALSE(readable.ok());
  CHECK(std::string(readable.status().message()).find("chmod 600") != std::string::npos);

  auto half = Load({"--config=" + jobs, "--tls_cert_file=/x.pem"});
  REQUIRE_FALSE(half.ok());
  CHECK(std::string(half.status().message()).find("go together") != std::string::npos);
}

TEST_CASE("Scheduler config: errors name the key") {
  auto config = Load({"--config=" + WriteTemp("bad1.json", R"({"batch_intervl_ms": 5})")});
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("batch_intervl_ms") != std::string::npos);

  config = Load({"--config=" + WriteTemp("bad2.json", R"({"grpc_port": "80"})")});
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("grpc_port") != std::string::npos);

  config = Load({"--config=" + WriteTemp("bad3.json", R"({"jobs": [{"name": "a", "tau": 1}]})")});
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("tau") != std::string::npos);

  config = Load({"--planner=magic"});
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("--planner") != std::string::npos);
}

TEST_CASE("Scheduler config: job parameters, admin keys, and their errors") {
  const std::string path = WriteTemp("jobs.json", R"({
    "admin_port": 0, "admin_token": "x", "planner_threads": 3, "transfer_slack_s": 2.5,
    "jobs": [{"name": "a", "token": "ta", "mode": "ssp", "staleness_k": 4,
              "divergence_max": 5.0, "momentum": 0.9, "priority_class": 2},
             {"name": "b", "token": "tb"},
             {"name": "c", "token": "tc", "mode": "sync", "member_loss": "fail"}]})");
  auto config = Load({"--config=" + path});
  REQUIRE(config.ok());
  CHECK(config->admin_port == 0);
  CHECK(config->admin_address == "127.0.0.1");
  CHECK(config->planner_threads == 3);
  CHECK(config->transfer_slack_s == 2.5);
  REQUIRE(config->jobs.size() == 3);
  CHECK(config->jobs[0].mode == JobMode::kSsp);
  CHECK(config->jobs[0].staleness_k == 4);
  CHECK(config->jobs[0].momentum == 0.9);
  CHECK(config->jobs[0].priority_class == 2);
  CHECK(config->jobs[1].mode == JobMode::kAsync);
  CHECK(config->jobs[1].member_loss == MemberLoss::kShrink);  // the default
  CHECK(config->jobs[2].member_loss == MemberLoss::kFail);
  // Written or not: only a written "shrink" makes AllReduce roots elastic.
  CHECK_FALSE(config->jobs[1].member_loss_explicit);
  CHECK(config->jobs[2].member_loss_explicit);
  CHECK_FALSE(config->admin_read_auth);
  auto read_auth = Load({"--config=" + path, "--admin_read_auth=true"});
  REQUIRE(read_auth.ok());
  CHECK(read_auth->admin_read_auth);

  for (const auto& [text, key] : std::vector<std::pair<std::string, std::string>>{
           {R"({"admin_port": 70000})", "admin_port"},
           {R"({"jobs": [{"name": "a", "token": "t", "momentum": 1.5}]})", "momentum"},
           {R"({"jobs": [{"name": "a", "token": "t", "priority_class": 9}]})", "priority_class"},
           {R"({"jobs": [{"name": "a", "token": "t", "mode": "bsp"}]})", "mode"},
           {R"({"jobs": [{"name": "a", "token": "t", "member_loss": "wait"}]})", "member_loss"},
           {R"({"jobs": [{"name": "a"}]})", "token"},
           {R"({"admin_read_auth": true})", "admin_read_auth"}}) {
    auto bad = Load({"--config=" + WriteTemp("bad_job.json", text)});
    INFO(text);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().message().find(key) != std::string::npos);
  }
}

}  // namespace
}  // namespace mlfabric
