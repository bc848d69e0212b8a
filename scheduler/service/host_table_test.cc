#include "scheduler/service/host_table.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

TEST_CASE("a registered host is found, and alive only while marked so") {
  HostTable hosts;
  CHECK(hosts.Find("w1") == nullptr);
  CHECK(hosts.Alive("w1") == nullptr);
  HostState& w1 = hosts.Register("w1");
  w1.data_address = "10.0.0.1:7000";
  CHECK(hosts.Find("w1") == &w1);
  CHECK(hosts.Alive("w1") == nullptr);  // registered, stream not open yet
  w1.alive = true;
  REQUIRE(hosts.Alive("w1") != nullptr);
  CHECK(hosts.Alive("w1")->data_address == "10.0.0.1:7000");
}

TEST_CASE("a host marked down keeps its entry; one never registered is not marked") {
  HostTable hosts;
  hosts.Register("w1").alive = true;
  hosts.Register("w1").incarnation = 9;
  CHECK(hosts.MarkDown("w1"));
  CHECK(hosts.MarkDown("w1"));  // down again: still a known host
  CHECK_FALSE(hosts.MarkDown("never"));
  CHECK(hosts.all().count("never") == 0);
  CHECK(hosts.Alive("w1") == nullptr);
  REQUIRE(hosts.Find("w1") != nullptr);
  CHECK(hosts.Find("w1")->incarnation == 9);  // late calls are recognised by it
}

TEST_CASE("registering again returns the host's old entry, and all() lists hosts by name") {
  HostTable hosts;
  hosts.Register("w2").incarnation = 1;
  hosts.Register("w1").incarnation = 2;
  CHECK(hosts.Register("w2").incarnation == 1);
  REQUIRE(hosts.all().size() == 2);
  CHECK(hosts.all().begin()->first == "w1");
}

}  // namespace
}  // namespace mlfabric
