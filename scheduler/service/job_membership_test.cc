#include "scheduler/service/job_membership.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

TEST_CASE("The generation starts at 1 and grows by one with every join and leave") {
  JobMembership members;
  CHECK(members.generation() == 1);
  CHECK(members.size() == 0);
  CHECK(members.Join("w1", 1.0, "registered on host h1"));
  CHECK(members.Join("w2", 2.0, "registered on host h2"));
  CHECK(members.generation() == 3);
  // Registering again is no change.
  CHECK_FALSE(members.Join("w1", 3.0, "registered on host h1"));
  CHECK(members.generation() == 3);
  CHECK(members.Leave("w1", 4.0, "its host h1 is down"));
  CHECK(members.generation() == 4);
  CHECK_FALSE(members.Leave("w1", 5.0, "again"));
  CHECK_FALSE(members.Leave("nobody", 5.0, "never joined"));
  CHECK(members.generation() == 4);
  CHECK(members.size() == 1);
  CHECK(members.Contains("w2"));
  CHECK_FALSE(members.Contains("w1"));
  CHECK(members.WhyLeft("w1") == "its host h1 is down (generation 4)");
  CHECK(members.WhyLeft("w2").empty());

  REQUIRE(members.history().size() == 3);
  const MembershipChange& left = members.history().back();
  CHECK(left.worker == "w1");
  CHECK_FALSE(left.joined);
  CHECK(left.at_s == 4.0);
  CHECK(left.reason == "its host h1 is down");
  CHECK(left.generation == 4);

  CHECK(members.Join("w1", 6.0, "registered on host h3"));
  CHECK(members.WhyLeft("w1").empty());
  CHECK(members.generation() == 5);
}

TEST_CASE("The history keeps the newest changes only") {
  JobMembership members;
  for (int i = 0; i < 100; ++i) {
    members.Join("w", i, "join");
    members.Leave("w", i + 0.5, "leave");
  }
  REQUIRE(members.history().size() == JobMembership::kHistoryKept);
  CHECK(members.history().back().generation == 201);
  CHECK(members.history().front().generation == 201 - JobMembership::kHistoryKept + 1);
  CHECK(members.generation() == 201);
}

TEST_CASE("JoinedAt tells a member of an older generation from one that joined again since") {
  JobMembership members;
  members.Join("w1", 1.0, "registered");  // generation 2
  members.Join("w2", 2.0, "registered");  // 3
  CHECK(members.JoinedAt("w1") == 2);
  CHECK(members.JoinedAt("w2") == 3);
  CHECK(members.JoinedAt("nobody") == 0);
  CHECK(members.MembersSince(2) == 1);
  CHECK(members.MembersSince(3) == 2);
  members.Leave("w1", 3.0, "its host is down");  // 4
  CHECK(members.JoinedAt("w1") == 0);
  CHECK(members.MembersSince(3) == 1);
  members.Join("w1", 4.0, "registered again");  // 5
  // A member now, but not of generation 3 or 4.
  CHECK(members.JoinedAt("w1") == 5);
  CHECK(members.MembersSince(4) == 1);
  CHECK(members.MembersSince(5) == 2);
  // Registering again while a member keeps its generation.
  members.Join("w2", 5.0, "registered again");
  CHECK(members.JoinedAt("w2") == 3);
}

}  // namespace
}  // namespace mlfabric
