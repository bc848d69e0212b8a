#include "daemon/apps/push_table.h"

#include <catch2/catch.hpp>

namespace mlfabric::daemon {
namespace {

PushTable::Push Push(uint64_t request_id) {
  PushTable::Push push;
  push.app = std::make_shared<AppSession>();
  push.request_id = request_id;
  return push;
}

TEST_CASE("PushTable knows a push by its transfer id once its submission returned") {
  PushTable table;
  const uint64_t a = table.Record(Push(10));
  const uint64_t b = table.Record(Push(11));
  CHECK(a != b);
  CHECK(a > 0);
  CHECK(!table.Find(500).has_value());
  table.Submitted(a, 500);
  REQUIRE(table.Find(500).has_value());
  CHECK(table.Find(500)->request_id == 10);
  table.SubmitFailed(b);
  table.Submitted(b, 501);  // forgotten: nothing to move
  CHECK(!table.Find(501).has_value());
  CHECK(table.submitted() == 1);
}

TEST_CASE("PushTable: a command that overtakes the submission's reply adopts the push") {
  PushTable table;
  const uint64_t local = table.Record(Push(7));
  table.Adopt(600, local);  // the schedule came first
  REQUIRE(table.Find(600).has_value());
  table.Submitted(local, 600);  // the reply: no-op
  CHECK(table.Find(600)->request_id == 7);
  CHECK(table.submitted() == 1);
  table.Adopt(601, 0);       // no local id: nothing
  table.Adopt(602, 12345);   // unknown local id: nothing
  CHECK(table.submitted() == 1);
}

TEST_CASE("PushTable ends a push at its outcome, keeping it for a replica copy if asked") {
  PushTable table;
  table.Submitted(table.Record(Push(1)), 700);
  table.Submitted(table.Record(Push(2)), 701);
  CHECK(table.TakeForOutcome(700, /*hold_for_replica=*/false)->request_id == 1);
  CHECK(!table.TakeForOutcome(700, false).has_value());  // once
  CHECK(table.TakeForOutcome(701, /*hold_for_replica=*/true)->request_id == 2);
  CHECK(!table.Find(701).has_value());
  CHECK(table.held() == 1);
  // Reported to a restarted scheduler, and still held.
  const auto held = table.Held();
  REQUIRE(held.size() == 1);
  CHECK(held[0].first == 701);
  CHECK(held[0].second.request_id == 2);
  CHECK(table.TakeHeld(701)->request_id == 2);
  CHECK(!table.TakeHeld(701).has_value());
}

TEST_CASE("PushTable hands back every submitted push when the scheduler is gone") {
  PushTable table;
  table.Submitted(table.Record(Push(1)), 800);
  table.Submitted(table.Record(Push(2)), 801);
  table.Submitted(table.Record(Push(3)), 802);
  (void)table.TakeForOutcome(802, /*hold_for_replica=*/true);
  const uint64_t still = table.Record(Push(4));  // its SubmitUpdate has not returned
  const std::vector<PushTable::Push> all = table.TakeAllSubmitted();
  CHECK(all.size() == 2);
  CHECK(table.submitted() == 0);
  CHECK(table.held() == 1);  // the held copy stays
  table.Submitted(still, 803);  // fails with its RPC, or lands here
  CHECK(table.Find(803).has_value());
}

}  // namespace
}  // namespace mlfabric::daemon
