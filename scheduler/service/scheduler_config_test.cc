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
  auto config = Load({});
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
  CHECK(config->jobs[0].mode == "sync");
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

}  // namespace
}  // namespace mlfabric
