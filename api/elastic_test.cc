#include "api/elastic.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

TEST_CASE("RankOrder compares the numbers in worker names as numbers") {
  CHECK(RankOrder({"rank10", "rank2", "rank1", "rank0", "rank11"}) ==
        std::vector<std::string>{"rank0", "rank1", "rank2", "rank10", "rank11"});
  // Text runs bytewise, digit runs by value, leading zeros aside; equal
  // values fall back to bytes, so the order is total.
  CHECK(RankOrder({"w1x20", "w1x3", "b", "a10", "a9", "rank01", "rank1"}) ==
        std::vector<std::string>{"a9", "a10", "b", "rank01", "rank1", "w1x3", "w1x20"});
  CHECK(RankOrder({"9", "x", "10"}) == std::vector<std::string>{"9", "10", "x"});
  CHECK(RankOrder({}).empty());
}

TEST_CASE("IsMembershipChange knows the scheduler's wording and nothing else") {
  CHECK(IsMembershipChange(absl::UnavailableError(
      "AllReduce round 7: rank 1's push failed: round 7 failed: worker 'rank2' left the job "
      "(its application left host h2) at membership generation 5")));
  CHECK_FALSE(IsMembershipChange(absl::OkStatus()));
  CHECK_FALSE(IsMembershipChange(
      absl::UnavailableError("round 31 failed: server 'demo-allreduce-root-g4' is not connected")));
  CHECK_FALSE(IsMembershipChange(absl::UnavailableError("rank2 left the job")));
}

}  // namespace
}  // namespace mlfabric
