#include "daemon/daemon_config.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

absl::StatusOr<DaemonConfig> Load(std::vector<const char*> argv) {
  argv.insert(argv.begin(), "mlfabricd");
  auto cl = ParseCommandLine(static_cast<int>(argv.size()), argv.data());
  REQUIRE(cl.ok());
  return LoadDaemonConfig(*cl);
}

TEST_CASE("Daemon config needs a host and derives the socket path") {
  auto config = Load({});
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("host") != std::string::npos);

  config = Load({"--host=w1"});
  REQUIRE(config.ok());
  CHECK(config->local_socket == "/tmp/mlfabricd-w1.sock");
  CHECK(config->payload_bytes == 32 * 1024);
}

TEST_CASE("Daemon config takes a send timeout within range") {
  auto config = Load({"--host=w1"});
  REQUIRE(config.ok());
  CHECK(config->send_timeout_s == 30);
  config = Load({"--host=w1", "--send_timeout_s=2.5"});
  REQUIRE(config.ok());
  CHECK(config->send_timeout_s == 2.5);
  config = Load({"--host=w1", "--send_timeout_s=0"});
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("--send_timeout_s") != std::string::npos);
}

TEST_CASE("Daemon config takes how long a get waits for a failover, 0 for not at all") {
  auto config = Load({"--host=w1"});
  REQUIRE(config.ok());
  CHECK(config->failover_wait_s == 6);
  config = Load({"--host=w1", "--failover_wait_s=0"});
  REQUIRE(config.ok());
  CHECK(config->failover_wait_s == 0);
  config = Load({"--host=w1", "--failover_wait_s=-1"});
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("--failover_wait_s") != std::string::npos);
}

TEST_CASE("Daemon config range-checks the packet payload") {
  auto config = Load({"--host=w1", "--payload_bytes=100"});
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("--payload_bytes") != std::string::npos);
  CHECK(config.status().message().find("out of range") != std::string::npos);
}

TEST_CASE("Daemon config refuses link rates the scheduler would refuse, naming the flag") {
  for (const char* flag : {"--uplink_bps=500", "--downlink_bps=0.5"}) {
    auto config = Load({"--host=w1", flag});
    INFO(flag);
    REQUIRE_FALSE(config.ok());
    const std::string key = std::string(flag).substr(0, std::string(flag).find('='));
    CHECK(config.status().message().find(key) != std::string::npos);
    CHECK(config.status().message().find("at least 1000") != std::string::npos);
  }
  CHECK(Load({"--host=w1", "--uplink_bps=0"}).ok());
  CHECK(Load({"--host=w1", "--uplink_bps=1000", "--downlink_bps=1e9"}).ok());
}

TEST_CASE("Daemon config takes NIC priorities only with jobs and a ranking, naming the flag") {
  auto config = Load({"--host=w1", "--job_priority=rr", "--nic_priority_interface=eth0",
                      "--nic_priority_jobs=jobA:2222;jobB:3333,3334"});
  REQUIRE(config.ok());
  CHECK(config->nic_priority_interface == "eth0");
  CHECK(config->nic_priority_link_bps == 0);
  auto error = [](const absl::StatusOr<DaemonConfig>& c) {
    REQUIRE_FALSE(c.ok());
    return std::string(c.status().message());
  };
  CHECK(error(Load({"--host=w1", "--job_priority=one", "--nic_priority_interface=eth0"}))
            .find("--nic_priority_interface: needs nic_priority_jobs") != std::string::npos);
  CHECK(error(Load({"--host=w1", "--nic_priority_interface=eth0", "--nic_priority_jobs=a:1"}))
            .find("needs a job ranking: give job_priority one or rr (it is fifo)") !=
        std::string::npos);
  CHECK(error(Load({"--host=w1", "--nic_priority_jobs=a:1"}))
            .find("--nic_priority_jobs: needs nic_priority_interface") != std::string::npos);
  CHECK(error(Load({"--host=w1", "--job_priority=one", "--nic_priority_interface=eth0",
                    "--nic_priority_jobs=a:http"}))
            .find("'a:http': 'http' is not a TCP port") != std::string::npos);
}

}  // namespace
}  // namespace mlfabric
