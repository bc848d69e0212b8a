#include "scheduler/core/distribution.h"

#include <catch2/catch.hpp>

#include "scheduler/core/network.h"

namespace mlfabric::core {
namespace {

DistributionRequest Request(double server_uplink_bps, int distributors) {
  DistributionRequest r;
  r.server = "s";
  r.model_bytes = 125000000;  // 1 Gbit
  r.hosts.push_back({"s", server_uplink_bps, 1e10, {}, {}});
  for (int i = 0; i < 8; ++i) {
    const std::string w = "w" + std::to_string(i);
    r.hosts.push_back({w, 1e10, 1e10, {}, {}});
    r.requesters.push_back(w);
  }
  for (int d = 0; d < distributors; ++d) {
    const std::string name = "d" + std::to_string(d);
    r.hosts.push_back({name, 1e10, 1e10, {}, {}});
    r.distributors.push_back(name);
  }
  return r;
}

TEST_CASE("Without distributors the server's uplink sends every copy") {
  auto plan = PlanModelDistribution(Request(1e10, 0));
  REQUIRE(plan.ok());
  CHECK(plan->direct == 8);
  CHECK(plan->total_s == Approx(0.8));
  CHECK(plan->transfers.size() == 8);
}

TEST_CASE("A distribution tree relieves the server's uplink (§10.3)") {
  auto plan = PlanModelDistribution(Request(1e10, 2));
  REQUIRE(plan.ok());
  CHECK(plan->total_s < 0.8 - 1e-9);
  CHECK(plan->distributors_used >= 1);
  REQUIRE(plan->deliveries.size() == 8);
  int via_distributor = 0;
  for (const Delivery& d : plan->deliveries) {
    CHECK(d.at_s <= plan->total_s + 1e-12);
    via_distributor += d.via != "s";
  }
  CHECK(via_distributor > 0);
  // The server serves distributors first, the k°-th first ("then backwards").
  CHECK(plan->transfers[0].src == "s");
  CHECK(plan->transfers[0].dst.rfind("d", 0) == 0);
  // No host's uplink carries two transfers at once beyond its capacity.
  for (const Transfer& t : plan->transfers) {
    CHECK(SegmentBits(t.segments) == Approx(1e9));
    for (const RateSegment& s : t.segments) CHECK(s.rate_bps <= 1e10 + 1);
  }
}

TEST_CASE("Distribution is deterministic and errors name the field") {
  auto a = PlanModelDistribution(Request(5e9, 3));
  auto b = PlanModelDistribution(Request(5e9, 3));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->total_s == b->total_s);
  DistributionRequest bad = Request(1e10, 1);
  bad.requesters.push_back("ghost");
  auto plan = PlanModelDistribution(bad);
  REQUIRE_FALSE(plan.ok());
  CHECK(std::string(plan.status().message()).find("requesters[8]") == 0);
}

}  // namespace
}  // namespace mlfabric::core
