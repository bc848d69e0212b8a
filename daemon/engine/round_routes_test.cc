#include "daemon/engine/round_routes.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace mlfabric::daemon {
namespace {

std::string Addr(int w) { return "10.0.0." + std::to_string(w) + ":7000"; }

TEST_CASE("RoundRoutes: an F-ary tree over the order of arrival") {
  RoundRoutes routes(/*fanout=*/2, /*rounds_kept=*/4);
  std::vector<std::string> via;
  for (int w = 1; w <= 8; ++w) {
    via.push_back(routes.Join("1/ps", 5, "w" + std::to_string(w), Addr(w)).via_host);
  }
  // w1, w2 from the root; w3, w4 from w1; w5, w6 from w2; w7, w8 from w3.
  CHECK(via == std::vector<std::string>{"", "", "w1", "w1", "w2", "w2", "w3", "w3"});
  CHECK(routes.Join("1/ps", 5, "w9", Addr(9)).via_address == Addr(4));
  // Another round, another job's server: their own trees.
  CHECK(routes.Join("1/ps", 6, "w8", Addr(8)).via_host.empty());
  CHECK(routes.Join("2/ps", 5, "w8", Addr(8)).via_host.empty());
}

TEST_CASE("RoundRoutes: a second worker on a host, unknown addresses, no tree") {
  RoundRoutes routes(2, 4);
  CHECK(routes.Join("1/ps", 0, "w1", Addr(1)).via_host.empty());
  CHECK(routes.Join("1/ps", 0, "w2", Addr(2)).via_host.empty());
  CHECK(routes.Join("1/ps", 0, "w1", Addr(1)).via_host.empty());  // w1's second worker
  CHECK(routes.Join("1/ps", 0, "w3", "").via_host.empty());       // no address given
  CHECK(routes.Join("1/ps", 0, "w4", Addr(4)).via_host == "w1");  // third in the tree
  RoundRoutes off(0, 4);
  for (int w = 1; w <= 5; ++w) {
    CHECK(off.Join("1/ps", 0, "w" + std::to_string(w), Addr(w)).via_host.empty());
  }
}

TEST_CASE("RoundRoutes: old rounds are forgotten") {
  RoundRoutes routes(1, 2);
  CHECK(routes.Join("1/ps", 0, "w1", Addr(1)).via_host.empty());
  CHECK(routes.Join("1/ps", 0, "w2", Addr(2)).via_host == "w1");
  routes.Join("1/ps", 1, "w1", Addr(1));
  routes.Join("1/ps", 2, "w1", Addr(1));  // round 0 forgotten
  // A late get of round 0 starts a new tree: from the root.
  CHECK(routes.Join("1/ps", 0, "w3", Addr(3)).via_host.empty());
}

}  // namespace
}  // namespace mlfabric::daemon
