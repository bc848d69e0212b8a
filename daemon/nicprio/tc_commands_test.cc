#include "daemon/nicprio/tc_commands.h"

#include <catch2/catch.hpp>

#include <algorithm>

namespace mlfabric::nicprio {
namespace {

std::vector<std::string> Format(const std::vector<TcCommand>& commands) {
  std::vector<std::string> lines;
  for (const TcCommand& c : commands) lines.push_back(FormatCommand(c));
  return lines;
}

NicPrioConfig Config() {
  NicPrioConfig config;
  config.interface = "eth0";
  config.link_rate_bps = 10e9;
  config.min_rate_bps = 1e6;
  return config;
}

const std::vector<NicJob> kJobs = {{"jobA", {2222}}, {"jobB", {3333, 3334}}};

TEST_CASE("Setup: htb root, one class per job ordered by prio, u32 port filters") {
  auto commands = SetupCommands(Config(), kJobs, {1, 0});  // jobB first
  REQUIRE(commands.ok());
  for (const TcCommand& c : *commands) CHECK(c[0] == "tc");
  CHECK(Format(*commands) ==
        std::vector<std::string>{
            "tc qdisc add dev eth0 root handle 1: htb default ff",
            "tc class add dev eth0 parent 1: classid 1:1 htb rate 10000000kbit ceil "
            "10000000kbit",
            "tc class add dev eth0 parent 1:1 classid 1:10 htb rate 1000kbit ceil "
            "10000000kbit prio 1",
            "tc class add dev eth0 parent 1:1 classid 1:11 htb rate 1000kbit ceil "
            "10000000kbit prio 0",
            "tc class add dev eth0 parent 1:1 classid 1:ff htb rate 1000kbit ceil "
            "10000000kbit prio 7",
            "tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip sport 2222 "
            "0xffff flowid 1:10",
            "tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dport 2222 "
            "0xffff flowid 1:10",
            "tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip sport 3333 "
            "0xffff flowid 1:11",
            "tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dport 3333 "
            "0xffff flowid 1:11",
            "tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip sport 3334 "
            "0xffff flowid 1:11",
            "tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dport 3334 "
            "0xffff flowid 1:11",
        });
  // Never the prio or netem qdiscs: this kernel lacks them.
  for (const TcCommand& c : *commands) {
    CHECK(std::find(c.begin(), c.end(), "netem") == c.end());
    CHECK((c[1] != "qdisc" || std::find(c.begin(), c.end(), "prio") == c.end()));
  }
}

TEST_CASE("Rotation only changes class prios (TLs-RR)") {
  auto commands = RankCommands(Config(), kJobs, {0, 1});
  REQUIRE(commands.ok());
  CHECK(Format(*commands) ==
        std::vector<std::string>{
            "tc class change dev eth0 parent 1:1 classid 1:10 htb rate 1000kbit ceil "
            "10000000kbit prio 0",
            "tc class change dev eth0 parent 1:1 classid 1:11 htb rate 1000kbit ceil "
            "10000000kbit prio 1",
        });
}

TEST_CASE("Jobs beyond the band count share the lowest job band") {
  NicPrioConfig config = Config();
  config.max_bands = 2;
  std::vector<NicJob> jobs;
  for (uint16_t i = 0; i < 4; ++i) jobs.push_back({"j", {uint16_t(1000 + i)}});
  auto commands = RankCommands(config, jobs, {3, 2, 1, 0});
  REQUIRE(commands.ok());
  std::vector<std::string> prio;
  for (const TcCommand& c : *commands) prio.push_back(c[8] + "=" + c.back());
  CHECK(prio == std::vector<std::string>{"1:13=0", "1:12=1", "1:11=1", "1:10=1"});
  CHECK(JobClassId(0) == "1:10");
  CHECK(JobClassId(5) == "1:15");
  CHECK(JobClassId(6) == "1:16");
  CHECK(JobClassId(0xef - 1) == "1:fe");
}

TEST_CASE("Bad input is rejected with the reason") {
  auto message = [](NicPrioConfig config, std::vector<NicJob> jobs,
                    std::vector<size_t> ranking) {
    auto r = SetupCommands(config, jobs, ranking);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  NicPrioConfig bad = Config();
  bad.interface = "eth0; rm -rf /";
  CHECK(message(bad, kJobs, {0, 1}).find("interface") != std::string::npos);
  bad.interface = "";
  CHECK(message(bad, kJobs, {0, 1}).find("interface") != std::string::npos);
  bad = Config();
  bad.max_bands = 8;
  CHECK(message(bad, kJobs, {0, 1}).find("max_bands") != std::string::npos);
  bad = Config();
  bad.min_rate_bps = 20e9;
  CHECK(message(bad, kJobs, {0, 1}).find("min_rate_bps") != std::string::npos);
  CHECK(message(Config(), {}, {}).find("no jobs") != std::string::npos);
  CHECK(message(Config(), {{"a", {}}}, {0}).find("job 'a' has no ports") != std::string::npos);
  CHECK(message(Config(), {{"a", {5}}, {"b", {5}}}, {0, 1}).find("port 5") !=
        std::string::npos);
  CHECK(message(Config(), kJobs, {0, 0}).find("permutation") != std::string::npos);
  CHECK(message(Config(), kJobs, {0}).find("permutation") != std::string::npos);
  CHECK(message(Config(), kJobs, {0, 2}).find("permutation") != std::string::npos);
  CHECK_FALSE(RankCommands(Config(), kJobs, {1}).ok());
}

TEST_CASE("Teardown deletes the root qdisc") {
  CHECK(Format(TeardownCommands(Config())) ==
        std::vector<std::string>{"tc qdisc del dev eth0 root"});
}

}  // namespace
}  // namespace mlfabric::nicprio
