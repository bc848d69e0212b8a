#include "scheduler/service/admin_history.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

TEST_CASE("history keeps bounded recent lists and all-time counts") {
  AdminHistory history(2);
  for (uint64_t i = 1; i <= 3; ++i) {
    BatchView batch;
    batch.id = i;
    history.RecordBatch(batch);
  }
  for (uint64_t i = 0; i < AdminHistory::kRecentDrops + 5; ++i) {
    DropView drop;
    drop.transfer_id = i;
    drop.category = i % 2 ? "stale" : "host_down";
    history.RecordDrop(drop);
  }
  ClusterSnapshot snap;
  history.CopyInto(&snap);
  REQUIRE(snap.recent_batches.size() == 2);
  CHECK(snap.recent_batches.front().id == 2);  // oldest first, the first one forgotten
  CHECK(snap.recent_drops.size() == AdminHistory::kRecentDrops);
  CHECK(snap.recent_drops.front().transfer_id == 5);
  CHECK(snap.drops_by_category.at("stale") + snap.drops_by_category.at("host_down") ==
        static_cast<int64_t>(AdminHistory::kRecentDrops + 5));
}

TEST_CASE("delays fall into the histogram bucket of their upper bound") {
  AdminHistory history(1);
  for (int64_t delay : {0, 1, 3, 4, 200}) {
    DelayView view;
    view.delay = delay;
    history.RecordDelay(view);
  }
  ClusterSnapshot snap;
  history.CopyInto(&snap);
  const DelayHistogram& h = snap.delay_histogram;
  REQUIRE(h.counts.size() == h.bounds.size() + 1);
  CHECK(h.counts[0] == 1);      // 0
  CHECK(h.counts[1] == 1);      // 1
  CHECK(h.counts[3] == 2);      // 3 and 4 are in (2, 4]
  CHECK(h.counts.back() == 1);  // 200 > 128
  CHECK(h.total == 5);
  CHECK(h.sum == 208);
}

TEST_CASE("link samples are due once per period") {
  AdminHistory history(1);
  CHECK(history.LinkSampleDue(10.0));
  CHECK_FALSE(history.LinkSampleDue(10.1));
  CHECK(history.LinkSampleDue(10.0 + AdminHistory::kLinkSamplePeriodS));
}

}  // namespace
}  // namespace mlfabric
