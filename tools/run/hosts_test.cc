// Hostfile parsing and finding this machine among a hostfile's hosts.
#include "tools/run/hosts.h"

#include "catch2/catch.hpp"

namespace mlfabric::run {
namespace {

TEST_CASE("A hostfile's hosts, slots and comments") {
  auto entries = ParseHostfile("# cluster\nnode1 slots=4\n\n  10.0.0.2 slots=2 max_slots=8 # b\nnode3\n");
  REQUIRE(entries.ok());
  REQUIRE(entries->size() == 3);
  CHECK((*entries)[0].host == "node1");
  CHECK((*entries)[0].slots == 4);
  CHECK((*entries)[1].host == "10.0.0.2");
  CHECK((*entries)[1].slots == 2);
  CHECK((*entries)[2].slots == 1);
}

TEST_CASE("Bad hostfiles are errors naming the line") {
  auto twice = ParseHostfile("a\nb\na slots=2\n");
  REQUIRE(!twice.ok());
  CHECK(std::string(twice.status().message()) == "hostfile line 3: host 'a' is named twice");
  auto slots = ParseHostfile("a slots=zero\n");
  REQUIRE(!slots.ok());
  CHECK(std::string(slots.status().message()).find("line 1: 'slots=zero'") != std::string::npos);
  CHECK(!ParseHostfile("# nothing\n\n").ok());
}

TEST_CASE("This machine is found by address or name, the first match wins") {
  const std::vector<std::string> local = {"127.0.0.1", "10.1.2.3", "box"};
  CHECK(FindLocalHost({"10.9.9.9", "10.1.2.3", "box"}, local) == 1);
  CHECK(FindLocalHost({"box", "10.1.2.3"}, local) == 0);
  CHECK(FindLocalHost({"10.9.9.9"}, local) == -1);
  // Names resolve: "localhost" is 127.0.0.1 here.
  CHECK(FindLocalHost({"10.9.9.9", "localhost"}, local) == 1);
  // The real machine has at least its loopback address.
  CHECK(FindLocalHost({"127.0.0.1"}, LocalNames()) == 0);
  CHECK(ResolveIpv4("127.0.0.1") == "127.0.0.1");
  CHECK(RouteSource("127.0.0.1") == "127.0.0.1");
}

}  // namespace
}  // namespace mlfabric::run
