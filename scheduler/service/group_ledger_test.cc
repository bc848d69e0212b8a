#include "scheduler/service/group_ledger.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

GroupPart Part(uint64_t id, const std::string& shard) {
  GroupPart part;
  part.id = id;
  part.server = shard;
  part.host = "h-" + shard;
  return part;
}

TransferView Feed(uint64_t id) {
  TransferView feed;
  feed.transfer_id = id;
  return feed;
}

// Push 10 in two parts (11, 12), and group aggregate 20 of pushes 1 and 2,
// summed at a1: two sums (21, 22) and two feeds (23, 24).
struct Ledger {
  GroupLedger groups;
  Ledger() {
    groups.AddPart(10, Part(11, "ps-0"));
    groups.AddPart(10, Part(12, "ps-1"));
    GroupPush& aggregate = groups.Open(20);
    aggregate.constituents = {1, 2};
    aggregate.aggregator = "a1";
    groups.AddPart(20, Part(21, "ps-0"));
    groups.AddPart(20, Part(22, "ps-1"));
    groups.AddFeed(20, Feed(23));
    groups.AddFeed(20, Feed(24));
  }
};

TEST_CASE("a part is found with the push it belongs to") {
  Ledger l;
  GroupLedger::PartOf owner = l.groups.FindPart(12);
  REQUIRE(owner.push != nullptr);
  CHECK(owner.push_id == 10);
  CHECK(owner.part->server == "ps-1");
  CHECK(owner.push == l.groups.Find(10));
  CHECK(l.groups.FindPart(99).push == nullptr);
  CHECK(l.groups.FindPart(23).push == nullptr);  // a feed is no part
}

TEST_CASE("a push's own entry is no aggregate; an entry with constituents is") {
  Ledger l;
  CHECK_FALSE(l.groups.IsAggregate(10));
  CHECK(l.groups.IsAggregate(20));
  CHECK_FALSE(l.groups.IsAggregate(99));
  CHECK(l.groups.Contains(10));
  CHECK_FALSE(l.groups.Contains(11));  // a part's id is no entry
}

TEST_CASE("feeds name the aggregate they go to, and parts and feeds are the groups' transfers") {
  Ledger l;
  CHECK(l.groups.AggregateFed(24) == 20u);
  CHECK_FALSE(l.groups.AggregateFed(21).has_value());
  for (uint64_t id : {11, 12, 21, 22, 23, 24}) CHECK(l.groups.IsPartOrFeed(id));
  CHECK_FALSE(l.groups.IsPartOrFeed(10));
  CHECK_FALSE(l.groups.IsPartOrFeed(20));
  REQUIRE(l.groups.Find(20)->feeds.size() == 2);
  CHECK(l.groups.Find(20)->feeds[1].transfer_id == 24);
}

TEST_CASE("taking an entry forgets its parts and feeds, and nothing else") {
  Ledger l;
  std::optional<GroupPush> aggregate = l.groups.Take(20);
  REQUIRE(aggregate.has_value());
  CHECK(aggregate->parts.size() == 2);
  CHECK(aggregate->aggregator == "a1");
  CHECK_FALSE(l.groups.Contains(20));
  for (uint64_t id : {21, 22, 23, 24}) CHECK_FALSE(l.groups.IsPartOrFeed(id));
  CHECK(l.groups.FindPart(11).push_id == 10);
  CHECK_FALSE(l.groups.Take(20).has_value());  // once
  REQUIRE(l.groups.Take(10).has_value());
  CHECK(l.groups.empty());
}

TEST_CASE("aggregates still summing at a host are those not released") {
  Ledger l;
  GroupPush& other = l.groups.Open(30);
  other.constituents = {3};
  other.aggregator = "a2";
  CHECK(l.groups.AggregatesUnreleasedAt("a1") == std::vector<uint64_t>{20});
  l.groups.Find(20)->released = true;
  CHECK(l.groups.AggregatesUnreleasedAt("a1").empty());
  CHECK(l.groups.AggregatesUnreleasedAt("a2") == std::vector<uint64_t>{30});
}

TEST_CASE("ForEach visits every entry in id order") {
  Ledger l;
  std::vector<uint64_t> seen;
  l.groups.ForEach([&](uint64_t id, const GroupPush&) { seen.push_back(id); });
  CHECK(seen == std::vector<uint64_t>{10, 20});
  CHECK(l.groups.size() == 2);
}

}  // namespace
}  // namespace mlfabric
