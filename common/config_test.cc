#include "common/config.h"

#include <catch2/catch.hpp>
#include <fstream>

#include "nlohmann/json.hpp"

namespace mlfabric {
namespace {

struct TestConfig {
  int64_t port = 7;
  double interval_ms = 100;
  std::string name = "default";
  std::string mode = "async";
  bool verbose = false;
  std::vector<std::string> hosts;
};

absl::Status Read(ConfigReader reader, TestConfig* config) {
  reader.Int("port", &config->port, 1, 65535);
  reader.Double("interval_ms", &config->interval_ms, 1, 1000);
  reader.String("name", &config->name);
  reader.Enum("mode", &config->mode, {"async", "sync"});
  reader.Bool("verbose", &config->verbose);
  reader.StringList("hosts", &config->hosts);
  return reader.Finish();
}

TEST_CASE("Defaults hold when nothing is given") {
  TestConfig config;
  REQUIRE(Read(ConfigReader(nlohmann::json::object(), "test"), &config).ok());
  CHECK(config.port == 7);
  CHECK(config.name == "default");
}

TEST_CASE("File values override defaults and flags override the file") {
  TestConfig config;
  auto json = nlohmann::json::parse(R"({"port": 9000, "name": "file", "hosts": ["a", "b"]})");
  REQUIRE(Read(ConfigReader(json, "test.json", {{"name", "flag"}, {"interval_ms", "50"}}),
               &config)
              .ok());
  CHECK(config.port == 9000);
  CHECK(config.name == "flag");
  CHECK(config.interval_ms == 50);
  CHECK(config.hosts == std::vector<std::string>{"a", "b"});
}

TEST_CASE("Unknown keys are rejected by name") {
  TestConfig config;
  auto status = Read(ConfigReader(nlohmann::json::parse(R"({"prot": 1})"), "x.json"), &config);
  REQUIRE_FALSE(status.ok());
  CHECK(status.message().find("unknown config key 'prot'") != std::string::npos);
  CHECK(status.message().find("x.json") != std::string::npos);

  status = Read(ConfigReader(nlohmann::json::object(), "x.json", {{"bogus", "1"}}), &config);
  REQUIRE_FALSE(status.ok());
  CHECK(status.message().find("--bogus") != std::string::npos);
}

TEST_CASE("Wrong types and ranges name the key") {
  TestConfig config;
  auto status = Read(ConfigReader(nlohmann::json::parse(R"({"port": "80"})"), "x.json"), &config);
  REQUIRE_FALSE(status.ok());
  CHECK(status.message().find("'port'") != std::string::npos);
  CHECK(status.message().find("expected an integer") != std::string::npos);

  status = Read(ConfigReader(nlohmann::json::parse(R"({"port": 70000})"), "x.json"), &config);
  REQUIRE_FALSE(status.ok());
  CHECK(status.message().find("out of range") != std::string::npos);

  status = Read(ConfigReader(nlohmann::json::object(), "x", {{"port", "12ab"}}), &config);
  REQUIRE_FALSE(status.ok());
  CHECK(status.message().find("--port") != std::string::npos);

  status = Read(ConfigReader(nlohmann::json::parse(R"({"mode": "bulk"})"), "x.json"), &config);
  REQUIRE_FALSE(status.ok());
  CHECK(status.message().find("not one of: async, sync") != std::string::npos);
}

TEST_CASE("Command lines split flags, the config path and positionals") {
  const char* argv[] = {"prog", "--port=5", "--name", "n1", "--config=c.json", "pos", "--help"};
  auto cl = ParseCommandLine(7, argv);
  REQUIRE(cl.ok());
  CHECK(cl->flags.at("port") == "5");
  CHECK(cl->flags.at("name") == "n1");
  CHECK(cl->config_path == "c.json");
  CHECK(cl->positional == std::vector<std::string>{"pos"});
  CHECK(cl->help);

  const char* dangling[] = {"prog", "--port"};
  CHECK_FALSE(ParseCommandLine(2, dangling).ok());
}

TEST_CASE("Config files that are missing or malformed say so") {
  CHECK(LoadJsonFile("/nonexistent/file.json").status().code() == absl::StatusCode::kNotFound);
  const std::string path = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                           "/bad.json";
  std::ofstream(path) << "{\"port\": ";
  auto loaded = LoadJsonFile(path);
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().message().find("invalid JSON") != std::string::npos);
}

}  // namespace
}  // namespace mlfabric
