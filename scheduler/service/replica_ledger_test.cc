#include "scheduler/service/replica_ledger.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

// A direct copy (30) of push 1, and an aggregate copy (40) of pushes 2 and
// 3, fed to aggregator a1 as transfers 41 and 42.
struct Ledger {
  ReplicaLedger replicas;
  Ledger() {
    replicas.AddCopy(30, ReplicaCopy{"demo", "ps", 1, "w1", "r1", 1});
    ReplicaCopy aggregate{"demo", "ps", 0, "a1", "r1", 2};
    aggregate.constituents = {2, 3};
    aggregate.feeders = {"w2", "w3"};
    replicas.AddFeed(41, 40);
    replicas.AddFeed(42, 40);
    replicas.AddCopy(40, aggregate);
  }
};

UpdateRecord Push(uint64_t id) {
  UpdateRecord record;
  record.transfer_id = id;
  return record;
}

TEST_CASE("copies are found by id, and by the pushes they carry") {
  Ledger l;
  REQUIRE(l.replicas.FindCopy(30) != nullptr);
  CHECK(l.replicas.FindCopy(30)->source == 1);
  CHECK(l.replicas.FindCopy(99) == nullptr);
  CHECK(l.replicas.HasCopy(40));
  CHECK(l.replicas.CopiesOf(1) == std::vector<uint64_t>{30});
  CHECK(l.replicas.CopiesOf(2).empty());  // an aggregate is no direct copy
  CHECK(l.replicas.CarriesPush(1));
  CHECK(l.replicas.CarriesPush(3));
  CHECK_FALSE(l.replicas.CarriesPush(4));
  CHECK(l.replicas.copy_count() == 2);
}

TEST_CASE("a copy added again under its id replaces the first") {
  Ledger l;
  ReplicaCopy& again = l.replicas.AddCopy(30, ReplicaCopy{"demo", "ps", 5, "w5", "r1", 3});
  again.held = true;
  CHECK(l.replicas.FindCopy(30)->source == 5);
  CHECK(l.replicas.FindCopy(30)->held);
  CHECK(l.replicas.copy_count() == 2);
}

TEST_CASE("taking an aggregate copy forgets its feeds, and nothing else") {
  Ledger l;
  CHECK(l.replicas.AggregateFed(41) == 40u);
  std::optional<ReplicaCopy> aggregate = l.replicas.TakeCopy(40);
  REQUIRE(aggregate.has_value());
  CHECK(aggregate->constituents == std::vector<uint64_t>{2, 3});
  CHECK_FALSE(l.replicas.AggregateFed(41).has_value());
  CHECK(l.replicas.feed_count() == 0);
  CHECK(l.replicas.HasCopy(30));
  CHECK_FALSE(l.replicas.TakeCopy(40).has_value());  // once
}

TEST_CASE("pushes decided by a copy are taken with it, in the order added") {
  Ledger l;
  l.replicas.AddDecidedByCopy(40, Push(3));
  l.replicas.AddDecidedByCopy(40, Push(2));
  l.replicas.AddDecidedByCopy(30, Push(1));
  CHECK(l.replicas.CountDecidedBy(40) == 2);
  // Taking the copy leaves its pushes for its ending to decide.
  l.replicas.TakeCopy(40);
  const std::vector<UpdateRecord> decided = l.replicas.TakeDecidedBy(40);
  REQUIRE(decided.size() == 2);
  CHECK(decided[0].transfer_id == 3);
  CHECK(decided[1].transfer_id == 2);
  CHECK(l.replicas.TakeDecidedBy(40).empty());
  CHECK(l.replicas.decided_count() == 1);
}

TEST_CASE("ForEachCopy may change the copies it visits") {
  Ledger l;
  l.replicas.ForEachCopy([](uint64_t, ReplicaCopy& copy) { copy.failover = true; });
  const ReplicaLedger& view = l.replicas;
  std::vector<uint64_t> seen;
  view.ForEachCopy([&](uint64_t id, const ReplicaCopy& copy) {
    if (copy.failover) seen.push_back(id);
  });
  CHECK(seen == std::vector<uint64_t>{30, 40});
}

TEST_CASE("a snapshot is taken once, naming its server") {
  ReplicaLedger replicas;
  replicas.AddSnapshot(7, {"demo", "ps"});
  CHECK(replicas.snapshot_count() == 1);
  std::optional<ReplicaSnapshot> snapshot = replicas.TakeSnapshot(7);
  REQUIRE(snapshot.has_value());
  CHECK(snapshot->job == "demo");
  CHECK(snapshot->server == "ps");
  CHECK_FALSE(replicas.TakeSnapshot(7).has_value());
  CHECK(replicas.snapshot_count() == 0);
}

}  // namespace
}  // namespace mlfabric
