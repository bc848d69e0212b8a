#include "scheduler/service/aggregate_ledger.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

AggregateRecord::Hop HopAt(uint64_t id, const std::string& host) {
  AggregateRecord::Hop hop;
  hop.id = id;
  hop.host = host;
  return hop;
}

TEST_CASE("an opened aggregate is found by its id, and its hops by theirs") {
  AggregateLedger ledger;
  AggregateRecord& aggregate = ledger.Open(77);
  CHECK(aggregate.id == 77);
  aggregate.host = "a1";
  ledger.AddHop(77, HopAt(78, "w2"));
  ledger.AddHop(77, HopAt(79, "w3"));
  REQUIRE(ledger.Find(77) != nullptr);
  CHECK(ledger.Find(77)->hops.size() == 2);
  CHECK(ledger.Find(77)->hops[0].host == "w2");  // upstream first
  CHECK(ledger.AggregateOfHop(79) == std::optional<uint64_t>(77));
  CHECK_FALSE(ledger.AggregateOfHop(77).has_value());  // an aggregate is not its own hop
  CHECK(ledger.Find(78) == nullptr);
}

TEST_CASE("a hop for an aggregate not in the ledger is not indexed") {
  AggregateLedger ledger;
  ledger.AddHop(5, HopAt(6, "w1"));
  CHECK(ledger.hops() == 0);
  CHECK_FALSE(ledger.AggregateOfHop(6).has_value());
}

TEST_CASE("taking an aggregate out takes its hops' index with it") {
  AggregateLedger ledger;
  ledger.Open(77).constituents = {1, 2};
  ledger.AddHop(77, HopAt(78, "w2"));
  ledger.Open(90);
  std::optional<AggregateRecord> taken = ledger.Take(77);
  REQUIRE(taken.has_value());
  CHECK(taken->constituents == std::vector<uint64_t>{1, 2});
  CHECK(taken->hops.size() == 1);
  CHECK(ledger.hops() == 0);
  CHECK_FALSE(ledger.AggregateOfHop(78).has_value());
  CHECK(ledger.size() == 1);
  CHECK_FALSE(ledger.Take(77).has_value());  // once
}

TEST_CASE("an aggregate whose sum arrived forgets its hops but stays until taken") {
  AggregateLedger ledger;
  ledger.Open(77);
  ledger.AddHop(77, HopAt(78, "w2"));
  ledger.ForgetHops(77);
  CHECK_FALSE(ledger.AggregateOfHop(78).has_value());
  REQUIRE(ledger.Find(77) != nullptr);
  CHECK(ledger.Find(77)->hops.size() == 1);  // still planned on its links
}

TEST_CASE("Select names the aggregates a predicate holds for, to act on after the walk") {
  AggregateLedger ledger;
  ledger.Open(1).host = "a1";
  ledger.Open(2).host = "a2";
  ledger.Open(3).host = "a1";
  CHECK(ledger.Select([](const AggregateRecord& a) { return a.host == "a1"; }) ==
        std::vector<uint64_t>{1, 3});
  int visited = 0;
  ledger.ForEach([&](const AggregateRecord&) { ++visited; });
  CHECK(visited == 3);
}

}  // namespace
}  // namespace mlfabric
