#include "daemon/engine/delivery_sequencer.h"

#include <algorithm>
#include <set>

#include <catch2/catch.hpp>

namespace mlfabric::daemon {
namespace {

using Step = DeliverySequencer::Step;

v1::ExpectDelivery Expect(uint64_t sequence, uint64_t transfer) {
  v1::ExpectDelivery e;
  e.set_sequence(sequence);
  e.set_transfer_id(transfer);
  e.set_job_id(1);
  e.set_server("ps");
  return e;
}

// Delivers everything deliverable at "1/ps"; returns the transfers, in order.
std::vector<uint64_t> Drain(DeliverySequencer& s, const std::set<uint64_t>& complete,
                            std::vector<uint64_t>* skipped = nullptr) {
  std::vector<uint64_t> delivered;
  auto is_complete = [&](uint64_t t) { return complete.count(t) > 0; };
  for (Step step = s.Next("1/ps", is_complete); step.kind != Step::kNothing;
       step = s.Next("1/ps", is_complete)) {
    if (step.kind == Step::kSkip) {
      if (skipped) skipped->push_back(step.info.transfer_id());
      continue;
    }
    delivered.push_back(step.info.transfer_id());
    s.Advance("1/ps");
  }
  return delivered;
}

TEST_CASE("updates are handed over in commit order, never past a gap or an incomplete one") {
  DeliverySequencer s;
  s.Expect("1/ps", Expect(2, 20));
  CHECK(Drain(s, {20}).empty());  // position 1 not announced yet
  s.Expect("1/ps", Expect(1, 10));
  CHECK(Drain(s, {20}).empty());  // position 1's bytes not in yet
  CHECK(Drain(s, {10, 20}) == std::vector<uint64_t>{10, 20});
  s.Expect("1/ps", Expect(3, 30));
  CHECK(Drain(s, {30}) == std::vector<uint64_t>{30});
  CHECK(s.Pending("1/ps") == 0);
}

TEST_CASE("cancelled positions are skipped with their reason; others go on") {
  DeliverySequencer s;
  s.Expect("1/ps", Expect(1, 10));
  s.Expect("1/ps", Expect(2, 20), "server application is not connected");
  s.Expect("1/ps", Expect(3, 30));
  REQUIRE(s.CancelTransfer(1, 10, "source failed").has_value());
  CHECK_FALSE(s.CancelTransfer(3, 99, "wrong transfer").has_value());
  std::vector<uint64_t> skipped;
  CHECK(Drain(s, {30}, &skipped) == std::vector<uint64_t>{30});
  CHECK(skipped == std::vector<uint64_t>{10, 20});
}

TEST_CASE("an endpoint going away cancels what it still expected, once") {
  DeliverySequencer s;
  s.Expect("1/ps", Expect(1, 10));
  s.Expect("1/ps", Expect(2, 20), "already cancelled");
  s.Expect("1/ps", Expect(3, 30));
  CHECK(s.CancelAll("1/ps", "server disconnected") == std::vector<uint64_t>{10, 30});
  CHECK(s.CancelAll("1/ps", "again").empty());
  CHECK(s.EndpointsExpecting(30).size() == 1);
  std::vector<uint64_t> skipped;
  CHECK(Drain(s, {10, 20, 30}, &skipped).empty());
  CHECK(skipped.size() == 3);
}

TEST_CASE("an announcement for a position already passed is dropped") {
  DeliverySequencer s;
  s.Expect("1/ps", Expect(1, 10));
  CHECK(Drain(s, {10}) == std::vector<uint64_t>{10});
  s.Expect("1/ps", Expect(1, 11));  // late duplicate of position 1
  s.Expect("1/ps", Expect(2, 20));
  CHECK(Drain(s, {11, 20}) == std::vector<uint64_t>{20});
}

}  // namespace
}  // namespace mlfabric::daemon

namespace mlfabric::daemon {
namespace {

TEST_CASE("Reset forgets every endpoint: a restarted scheduler's position 1 is next again") {
  DeliverySequencer sequencer;
  auto info = [](uint64_t transfer, uint64_t sequence) {
    v1::ExpectDelivery expect;
    expect.set_transfer_id(transfer);
    expect.set_sequence(sequence);
    return expect;
  };
  auto all_complete = [](uint64_t) { return true; };
  sequencer.Expect("1/ps", info(10, 1));
  REQUIRE(sequencer.Next("1/ps", all_complete).kind == DeliverySequencer::Step::kDeliver);
  sequencer.Advance("1/ps");
  sequencer.Expect("1/ps", info(11, 2));
  sequencer.Expect("1/ps", info(12, 3), "cancelled");
  sequencer.Expect("1/other", info(20, 1));
  std::vector<uint64_t> pending = sequencer.Reset();
  std::sort(pending.begin(), pending.end());
  CHECK(pending == std::vector<uint64_t>{11, 20});
  CHECK(sequencer.Pending("1/ps") == 0);
  // The new scheduler's first position is delivered, not skipped as old.
  sequencer.Expect("1/ps", info(30, 1));
  const DeliverySequencer::Step step = sequencer.Next("1/ps", all_complete);
  CHECK(step.kind == DeliverySequencer::Step::kDeliver);
  CHECK(step.info.transfer_id() == 30);
}

TEST_CASE("a promoted replica's endpoint keeps its commit order under the server's name") {
  DeliverySequencer s;
  // The replica's stream: positions 1-3 announced, 1 delivered.
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    v1::ExpectDelivery e = Expect(seq, 100 + seq);
    e.set_server("replica:ps");
    s.Expect("1/replica:ps", e);
  }
  auto complete = [](uint64_t) { return true; };
  REQUIRE(s.Next("1/replica:ps", complete).kind == Step::kDeliver);
  s.Advance("1/replica:ps");
  // The old server's endpoint on this host had one update pending.
  s.Expect("1/ps", Expect(7, 900));

  CHECK(s.Rename("1/replica:ps", "1/ps", "ps") == std::vector<uint64_t>{900});
  CHECK(s.Pending("1/replica:ps") == 0);
  CHECK(s.EndpointsExpecting(102) == std::vector<std::pair<uint32_t, std::string>>{{1, "ps"}});
  // Position 4 is the promoted server's first own delivery.
  s.Expect("1/ps", Expect(4, 200));
  CHECK(Drain(s, {102, 103, 200}) == std::vector<uint64_t>{102, 103, 200});
  // Nothing to move: nothing changes.
  CHECK(s.Rename("1/replica:ps", "1/ps", "ps").empty());
  CHECK(s.Pending("1/ps") == 0);
}

TEST_CASE("a held replica copy waits for its release, and holds back what follows") {
  DeliverySequencer s;
  v1::ExpectDelivery held = Expect(1, 101);
  held.set_held(true);
  s.Expect("1/ps", held);
  s.Expect("1/ps", Expect(2, 102));
  // Its bytes are in, but its push has no outcome yet.
  CHECK(Drain(s, {101, 102}).empty());
  REQUIRE(s.Held("1/ps").size() == 1);
  CHECK(s.Held("1/ps")[0].transfer_id() == 101);
  // Held or released, both wait: a lost stream keeps group parts of both.
  REQUIRE(s.Undelivered("1/ps").size() == 2);
  CHECK(s.Undelivered("1/ps")[1].transfer_id() == 102);
  CHECK_FALSE(s.Release(1, 999).has_value());  // another transfer: nothing released
  CHECK(Drain(s, {101, 102}).empty());
  const auto released = s.Release(1, 101);
  REQUIRE(released.has_value());
  CHECK(released->server() == "ps");
  CHECK(Drain(s, {101, 102}) == std::vector<uint64_t>{101, 102});
  CHECK(s.Held("1/ps").empty());
  CHECK(s.Undelivered("1/ps").empty());

  // A held copy whose push failed is cancelled instead: skipped, never delivered.
  v1::ExpectDelivery doomed = Expect(3, 103);
  doomed.set_held(true);
  s.Expect("1/ps", doomed);
  s.Expect("1/ps", Expect(4, 104));
  REQUIRE(s.CancelTransfer(3, 103, "its push failed").has_value());
  std::vector<uint64_t> skipped;
  CHECK(Drain(s, {103, 104}, &skipped) == std::vector<uint64_t>{104});
  CHECK(skipped == std::vector<uint64_t>{103});
}

}  // namespace
}  // namespace mlfabric::daemon
