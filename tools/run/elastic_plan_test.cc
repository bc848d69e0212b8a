// The elastic launcher's decisions (elastic_plan.h), step by step: discovery
// output, ranks per slot, vanishing and reappearing hosts, replacements,
// blacklisting, min-np/max-np and the end of the job.
#include "tools/run/elastic_plan.h"

#include "catch2/catch.hpp"

namespace mlfabric::run {
namespace {

std::vector<int> Numbers(const std::vector<RankStart>& starts) {
  std::vector<int> numbers;
  for (const RankStart& start : starts) numbers.push_back(start.rank);
  return numbers;
}

TEST_CASE("Discovery output: host or host:slots a line, errors name the script and line") {
  auto hosts = ParseDiscoveryOutput("n1:2\n# comment\n\n  10.0.0.2  \nn3:4 # four\n", "d.sh");
  REQUIRE(hosts.ok());
  REQUIRE(hosts->size() == 3);
  CHECK((*hosts)[0].host == "n1");
  CHECK((*hosts)[0].slots == 2);
  CHECK((*hosts)[1].host == "10.0.0.2");
  CHECK((*hosts)[1].slots == 1);
  CHECK((*hosts)[2].slots == 4);
  CHECK(ParseDiscoveryOutput("", "d.sh")->empty());
  auto bad = ParseDiscoveryOutput("n1:2\nn2:zero\n", "d.sh");
  REQUIRE(!bad.ok());
  CHECK(std::string(bad.status().message()) ==
        "host discovery script d.sh: line 2 'n2:zero': slots must be an integer >= 1 "
        "(expected host or host:slots)");
  CHECK(!ParseDiscoveryOutput("n1 slots=2\n", "d.sh").ok());
  CHECK(!ParseDiscoveryOutput("n1:0\n", "d.sh").ok());
  CHECK(!ParseDiscoveryOutput(":2\n", "d.sh").ok());
  auto twice = ParseDiscoveryOutput("n1\nn1:2\n", "d.sh");
  REQUIRE(!twice.ok());
  CHECK(std::string(twice.status().message()).find("line 2 'n1:2': host listed twice") !=
        std::string::npos);
}

TEST_CASE("Ranks fill slots in host order; a vanished host's ranks stop and their numbers "
          "go to the next starts") {
  ElasticPlan plan(ElasticLimits{1, 1 << 20, 3});
  CHECK(plan.SetHosts({{"n1", 2}, {"n2", 2}}).empty());
  auto starts = plan.Fill();
  REQUIRE(Numbers(starts) == std::vector<int>{0, 1, 2, 3});
  CHECK(starts[2].host == "n2");
  CHECK(starts[2].slot == 0);
  CHECK(starts[3].slot == 1);
  CHECK(starts[3].host_appeared);
  CHECK(starts[3].size == 4);
  CHECK(starts[3].local_size == 2);
  CHECK(plan.Fill().empty());

  auto stops = plan.SetHosts({{"n1", 2}});
  REQUIRE(stops.size() == 2);
  CHECK(stops[0].rank == 2);
  CHECK(stops[0].host_vanished);
  CHECK(plan.running() == 2);
  CHECK(plan.alive() == 4);
  plan.Exited(2, 143, true);
  // n2 is back while rank 3 still stops: rank 2 takes slot 0, slot 1 waits.
  CHECK(plan.SetHosts({{"n1", 2}, {"n2", 2}}).empty());
  starts = plan.Fill();
  REQUIRE(Numbers(starts) == std::vector<int>{2});
  CHECK(starts[0].host_appeared);
  CHECK(starts[0].size == 3);
  plan.Exited(3, 137, true);
  starts = plan.Fill();
  REQUIRE(Numbers(starts) == std::vector<int>{3});
  CHECK(!starts[0].host_appeared);
  CHECK(starts[0].slot == 1);
}

TEST_CASE("Fewer slots on a host stop the ranks of the slots it lost") {
  ElasticPlan plan(ElasticLimits{});
  plan.SetHosts({{"n1", 3}});
  plan.Fill();
  auto stops = plan.SetHosts({{"n1", 1}});
  REQUIRE(stops.size() == 2);
  CHECK(stops[0].rank == 1);
  CHECK(!stops[0].host_vanished);
}

TEST_CASE("A failed rank is replaced with its number; a host failing too often is blacklisted") {
  ElasticPlan plan(ElasticLimits{1, 1 << 20, 2});
  plan.SetHosts({{"n1", 2}, {"n2", 1}});
  plan.Fill();
  CHECK(plan.Exited(1, 137, false) == "rank 1 on n1 exited with 137: failure 1 of 2 on n1; "
                                      "replacing it");
  auto starts = plan.Fill();
  REQUIRE(Numbers(starts) == std::vector<int>{1});
  CHECK(starts[0].slot == 1);
  CHECK(plan.Exited(0, 1, false).find("n1 is blacklisted") != std::string::npos);
  CHECK(plan.blacklisted("n1"));
  CHECK(plan.Fill().empty());
  CHECK(plan.hosts() == std::vector<std::string>{"n2"});
  // Listed again, still ignored: as if it had vanished, its last rank stops.
  auto stops = plan.SetHosts({{"n1", 2}, {"n2", 1}});
  REQUIRE(stops.size() == 1);
  CHECK(stops[0].rank == 1);
  CHECK(plan.Fill().empty());
  CHECK(plan.running() == 1);  // rank 2 on n2
}

TEST_CASE("min-np: no rank starts until min-np could run; max-np caps the ranks") {
  ElasticPlan plan(ElasticLimits{3, 4, 3});
  plan.SetHosts({{"n1", 2}});
  CHECK(plan.Fill().empty());
  CHECK(plan.alive() == 0);
  plan.SetHosts({{"n1", 2}, {"n2", 4}});
  auto starts = plan.Fill();
  REQUIRE(Numbers(starts) == std::vector<int>{0, 1, 2, 3});
  CHECK(starts[3].host == "n2");
  CHECK(starts[3].size == 4);
}

TEST_CASE("A rank exiting 0 finishes the job: no replacement, the end code") {
  ElasticPlan plan(ElasticLimits{});
  plan.SetHosts({{"n1", 3}});
  plan.Fill();
  plan.Exited(0, 0, false);
  CHECK(plan.finishing());
  CHECK(!plan.done());
  plan.Exited(1, 0, false);
  CHECK(plan.Fill().empty());
  CHECK(plan.Exited(2, 5, false).find("not replaced") != std::string::npos);
  CHECK(plan.done());
  CHECK(plan.exit_code() == 5);

  ElasticPlan clean(ElasticLimits{});
  clean.SetHosts({{"n1", 1}});
  clean.Fill();
  clean.Exited(0, 0, false);
  CHECK(clean.done());
  CHECK(clean.exit_code() == 0);
}

}  // namespace
}  // namespace mlfabric::run
