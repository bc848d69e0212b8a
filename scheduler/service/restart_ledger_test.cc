// RestartLedger's own contract: what it keeps of a restarted scheduler's
// pushes in doubt, holds and kept copies, and what it forgets when. How
// pushes end from it is in_doubt_test's.
#include "scheduler/service/restart_ledger.h"

#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

InDoubtPush Doubt(uint64_t id, const std::string& src_host, double since_s = 0) {
  InDoubtPush push;
  push.transfer_id = id;
  push.local_id = 40 + id;
  push.src_host = src_host;
  push.job = "demo";
  push.server = "ps";
  push.since_s = since_s;
  return push;
}

// A copy kept at replica r1 of push `source`, or of an aggregate of
// `constituents` (source 0).
HeldAtReplica Kept(uint64_t source, std::vector<uint64_t> constituents = {},
                   bool incomplete = false) {
  HeldAtReplica held;
  held.job = "demo";
  held.replica_host = "r1";
  held.copy.set_source_transfer_id(source);
  for (uint64_t push : constituents) held.copy.add_constituents(push);
  held.incomplete = incomplete;
  return held;
}

HeldAtSource Hold(const std::string& src_host, bool from_doubt, double since_s = 0) {
  HeldAtSource held;
  held.job = "demo";
  held.server = "ps";
  held.copy.src_host = src_host;
  held.since_s = since_s;
  held.from_doubt = from_doubt;
  return held;
}

TEST_CASE("pushes in doubt are kept by transfer id, a later report replacing an earlier") {
  RestartLedger ledger;
  CHECK_FALSE(ledger.IsInDoubt(5));
  ledger.AddInDoubt(Doubt(5, "w1", 10));
  ledger.AddInDoubt(Doubt(5, "w2", 20));  // its source registered again
  ledger.AddInDoubt(Doubt(3, "w1", 10));
  CHECK(ledger.IsInDoubt(5));
  CHECK(ledger.IsInDoubt(3));
  CHECK(ledger.InDoubtCount() == 2);
  std::vector<uint64_t> seen;
  ledger.EraseInDoubtIf([&](const InDoubtPush& push) {
    seen.push_back(push.transfer_id);
    if (push.transfer_id == 5) {
      CHECK(push.src_host == "w2");
      CHECK(push.since_s == 20);
    }
    return push.transfer_id == 3;
  });
  CHECK(seen == std::vector<uint64_t>{3, 5});  // in transfer id order
  CHECK_FALSE(ledger.IsInDoubt(3));
  CHECK(ledger.IsInDoubt(5));
  CHECK(ledger.InDoubtCount() == 1);
}

TEST_CASE("a push applied elsewhere is no longer being delivered, and stays applied") {
  RestartLedger ledger;
  CHECK_FALSE(ledger.AppliedVersion(7).has_value());
  ledger.MarkDelivering(7);  // handed to the application, not acknowledged
  CHECK(ledger.IsDelivering(7));
  ledger.MarkAppliedElsewhere(7, 12, 100);
  CHECK_FALSE(ledger.IsDelivering(7));
  REQUIRE(ledger.AppliedVersion(7).has_value());
  CHECK(*ledger.AppliedVersion(7) == 12);
  // Another daemon's log naming it unacknowledged does not undo that.
  ledger.MarkDelivering(7);
  CHECK_FALSE(ledger.IsDelivering(7));
  // An acknowledgement saying it was not applied ends the delivery alone.
  ledger.MarkDelivering(8);
  ledger.EndDelivering(8);
  CHECK_FALSE(ledger.IsDelivering(8));
  CHECK_FALSE(ledger.AppliedVersion(8).has_value());
}

TEST_CASE("kept copies of a push: its own or an aggregate's, whole or incomplete") {
  RestartLedger ledger;
  ledger.KeepAtReplica(101, Kept(1));
  ledger.KeepAtReplica(102, Kept(0, {2, 3}));
  ledger.KeepAtReplica(103, Kept(3, {}, /*incomplete=*/true));
  CHECK(ledger.HeldAtReplicaCount() == 3);

  const RestartLedger::KeptCopies one = ledger.KeptCopiesOf(1);
  CHECK(one.whole);
  CHECK_FALSE(one.incomplete);
  const RestartLedger::KeptCopies two = ledger.KeptCopiesOf(2);  // in the aggregate
  CHECK(two.whole);
  CHECK_FALSE(two.incomplete);
  const RestartLedger::KeptCopies three = ledger.KeptCopiesOf(3);  // in both
  CHECK(three.whole);
  CHECK(three.incomplete);
  const RestartLedger::KeptCopies none = ledger.KeptCopiesOf(4);
  CHECK_FALSE(none.whole);
  CHECK_FALSE(none.incomplete);

  std::vector<uint64_t> seen;
  ledger.EraseHeldAtReplicaIf([&](uint64_t copy_id, const HeldAtReplica& held) {
    seen.push_back(copy_id);
    return held.incomplete;
  });
  CHECK(seen == std::vector<uint64_t>{101, 102, 103});  // in copy id order
  CHECK(ledger.HeldAtReplicaCount() == 2);
  CHECK_FALSE(ledger.KeptCopiesOf(3).incomplete);
}

TEST_CASE("a hold at a source is replaced by a later report, but one from doubt stays so") {
  RestartLedger ledger;
  ledger.HoldAtSource(9, Hold("w1", /*from_doubt=*/true, 10));
  ledger.HoldAtSource(9, Hold("w2", /*from_doubt=*/false, 20));  // w2 named it registering
  ledger.HoldAtSource(4, Hold("w1", /*from_doubt=*/false, 10));
  CHECK(ledger.IsHeldAtSource(9));
  CHECK(ledger.IsHeldAtSource(4));
  CHECK_FALSE(ledger.IsHeldAtSource(5));
  CHECK(ledger.HeldAtSourceCount() == 2);
  std::vector<uint64_t> seen;
  ledger.EraseHeldAtSourceIf([&](uint64_t push, const HeldAtSource& held) {
    seen.push_back(push);
    if (push == 9) {
      CHECK(held.copy.src_host == "w2");
      CHECK(held.since_s == 20);
      CHECK(held.from_doubt);
    } else {
      CHECK_FALSE(held.from_doubt);
    }
    return push == 9;
  });
  CHECK(seen == std::vector<uint64_t>{4, 9});
  CHECK_FALSE(ledger.IsHeldAtSource(9));
  CHECK(ledger.HeldAtSourceCount() == 1);
}

TEST_CASE("a callback may read and add to the ledger's other records while erasing") {
  RestartLedger ledger;
  ledger.AddInDoubt(Doubt(5, "w1"));
  ledger.AddInDoubt(Doubt(6, "w1"));
  ledger.MarkAppliedElsewhere(5, 3, 0);
  // As ResolveInDoubt does: a push in doubt found applied becomes a hold.
  ledger.EraseInDoubtIf([&](const InDoubtPush& push) {
    if (!ledger.AppliedVersion(push.transfer_id).has_value()) return false;
    ledger.HoldAtSource(push.transfer_id, Hold(push.src_host, /*from_doubt=*/true));
    return true;
  });
  CHECK_FALSE(ledger.IsInDoubt(5));
  CHECK(ledger.IsInDoubt(6));
  CHECK(ledger.IsHeldAtSource(5));
}

TEST_CASE("Prune forgets what was heard more than keep_s ago") {
  RestartLedger ledger;
  ledger.MarkAppliedElsewhere(1, 4, 100);
  ledger.MarkAppliedElsewhere(2, 5, 150);
  ledger.MarkAtReplica(1, 100);
  ledger.MarkAtReplica(2, 150);
  ledger.Prune(/*now_s=*/220, /*keep_s=*/120);  // exactly keep_s: kept
  CHECK(ledger.AppliedVersion(1).has_value());
  CHECK(ledger.IsAtReplica(1));
  ledger.Prune(/*now_s=*/221, /*keep_s=*/120);
  CHECK_FALSE(ledger.AppliedVersion(1).has_value());
  CHECK_FALSE(ledger.IsAtReplica(1));
  CHECK(*ledger.AppliedVersion(2) == 5);
  CHECK(ledger.IsAtReplica(2));
}

TEST_CASE("Prune keeps the recopied marks while kept copies are left to settle") {
  RestartLedger ledger;
  ledger.KeepAtReplica(101, Kept(1, {}, /*incomplete=*/true));
  ledger.MarkRecopiedFromSource(1);
  ledger.Prune(1000, 120);
  CHECK(ledger.WasRecopiedFromSource(1));
  ledger.EraseHeldAtReplicaIf([](uint64_t, const HeldAtReplica&) { return true; });
  ledger.Prune(1000, 120);
  CHECK_FALSE(ledger.WasRecopiedFromSource(1));
}

TEST_CASE("an empty ledger knows nothing") {
  const RestartLedger ledger;
  CHECK_FALSE(ledger.IsInDoubt(1));
  CHECK_FALSE(ledger.IsDelivering(1));
  CHECK_FALSE(ledger.AppliedVersion(1).has_value());
  CHECK_FALSE(ledger.IsAtReplica(1));
  CHECK_FALSE(ledger.IsHeldAtSource(1));
  CHECK_FALSE(ledger.WasRecopiedFromSource(1));
  CHECK(ledger.InDoubtCount() == 0);
  CHECK(ledger.HeldAtReplicaCount() == 0);
  CHECK(ledger.HeldAtSourceCount() == 0);
}

}  // namespace
}  // namespace mlfabric
