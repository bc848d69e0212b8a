#include "daemon/engine/get_batcher.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace mlfabric::daemon {
namespace {

GetBatcher::Snapshot Model(int64_t version) {
  auto buffer = SharedBuffer::Create(8);
  REQUIRE(buffer.ok());
  return GetBatcher::Snapshot{version, std::make_shared<SharedBuffer>(std::move(*buffer)), ""};
}

TEST_CASE("GetBatcher: gets that come while a snapshot is taken share it") {
  GetBatcher batcher;
  const GetBatcher::Ticket first = batcher.Join("1/ps");
  CHECK(first.ask);
  CHECK(batcher.MayAsk(first.batch));  // nothing is leaving
  const GetBatcher::Ticket second = batcher.Join("1/ps");
  const GetBatcher::Ticket third = batcher.Join("1/ps");
  CHECK(!second.ask);
  CHECK(!third.ask);
  CHECK(second.batch == first.batch);
  CHECK(third.batch == first.batch);
  CHECK(!batcher.Result(first.batch).has_value());
  // Another server's gets are their own batch.
  const GetBatcher::Ticket other = batcher.Join("1/ps2");
  CHECK(other.ask);
  CHECK(other.batch != first.batch);

  const GetBatcher::Snapshot model = Model(42);
  batcher.Answer(first.batch, model);
  auto result = batcher.Result(first.batch);
  REQUIRE(result.has_value());
  CHECK(result->version == 42);
  CHECK(result->model == model.model);  // one snapshot, shared
  CHECK(batcher.stats().gets == 4);
  CHECK(batcher.stats().snapshots == 1);
}

TEST_CASE("GetBatcher: gets that come while the previous batch leaves form the next batch") {
  GetBatcher batcher;
  const GetBatcher::Ticket a = batcher.Join("k");
  const GetBatcher::Ticket b = batcher.Join("k");
  batcher.Answer(a.batch, Model(1));
  // Batch 1 is leaving (its replies are being sent): new gets gather.
  const GetBatcher::Ticket c = batcher.Join("k");
  const GetBatcher::Ticket d = batcher.Join("k");
  CHECK(c.ask);
  CHECK(!d.ask);
  CHECK(c.batch == d.batch);
  CHECK(c.batch != a.batch);
  CHECK(!batcher.MayAsk(c.batch));
  batcher.Leave(a.batch);
  CHECK(!batcher.MayAsk(c.batch));
  batcher.Leave(b.batch);
  CHECK(batcher.MayAsk(c.batch));  // batch 1 has left
  batcher.Answer(c.batch, Model(2));
  CHECK(batcher.Result(d.batch)->version == 2);
  batcher.Leave(c.batch);
  batcher.Leave(d.batch);
  CHECK(batcher.batches() == 0);
  CHECK(batcher.stats().snapshots == 2);
}

TEST_CASE("GetBatcher: a batch asked past its bound, errors, and a server that went away") {
  GetBatcher batcher;
  const GetBatcher::Ticket a = batcher.Join("k");
  batcher.Answer(a.batch, Model(1));
  const GetBatcher::Ticket b = batcher.Join("k");
  CHECK(!batcher.MayAsk(b.batch));
  // The previous batch is slow to leave; b asks anyway and is answered.
  batcher.Answer(b.batch, Model(2));
  const GetBatcher::Ticket c = batcher.Join("k");
  CHECK(c.ask);
  CHECK(!batcher.MayAsk(c.batch));  // b is the one leaving now
  batcher.Leave(b.batch);
  CHECK(batcher.MayAsk(c.batch));
  batcher.Leave(a.batch);  // the slow one, late

  // The application answered with an error: every get of the batch sees it.
  const GetBatcher::Ticket d = batcher.Join("k");
  CHECK(!d.ask);
  CHECK(d.batch == c.batch);
  batcher.Answer(c.batch, GetBatcher::Snapshot{0, nullptr, "no model yet"});
  CHECK(batcher.Result(d.batch)->error == "no model yet");
  batcher.Answer(c.batch, Model(9));  // a second answer is ignored
  CHECK(batcher.Result(c.batch)->error == "no model yet");
  batcher.Leave(c.batch);
  batcher.Leave(d.batch);

  // The server went away: the batch waiting for its snapshot fails.
  const GetBatcher::Ticket e = batcher.Join("k");
  batcher.FailKey("k", "server 'ps' disconnected");
  REQUIRE(batcher.Result(e.batch).has_value());
  CHECK(batcher.Result(e.batch)->error == "server 'ps' disconnected");
  batcher.Leave(e.batch);
  CHECK(batcher.batches() == 0);
  CHECK(batcher.stats().snapshots == 2);
  CHECK(batcher.stats().gets == 5);
}

TEST_CASE("GetBatcher: requesters in join order, routes per member") {
  GetBatcher batcher;
  const GetBatcher::Ticket a = batcher.Join("k", "w1");
  const GetBatcher::Ticket b = batcher.Join("k", "w2");
  const GetBatcher::Ticket c = batcher.Join("k", "w3");
  CHECK(a.member == 0);
  CHECK(b.member == 1);
  CHECK(c.member == 2);
  CHECK(batcher.Requesters(a.batch) == std::vector<std::string>{"w1", "w2", "w3"});
  batcher.Answer(a.batch, Model(1));
  // Answered but not routed yet: the members wait.
  CHECK(!batcher.RouteOf(a.batch, 1).has_value());
  batcher.SetRoutes(a.batch, {{}, {"w1", "10.0.0.1:7000"}});
  CHECK(batcher.RouteOf(a.batch, 0)->via_host.empty());
  CHECK(batcher.RouteOf(a.batch, 1)->via_host == "w1");
  CHECK(batcher.RouteOf(a.batch, 1)->via_address == "10.0.0.1:7000");
  CHECK(batcher.RouteOf(a.batch, 2)->via_host.empty());  // past the routes: direct
  // A later get opens the next batch with its own requesters.
  const GetBatcher::Ticket d = batcher.Join("k", "w4");
  CHECK(d.batch != a.batch);
  CHECK(d.member == 0);
  CHECK(batcher.Requesters(d.batch) == std::vector<std::string>{"w4"});
  // A failed batch needs no routes: every member is answered directly.
  batcher.Answer(d.batch, GetBatcher::Snapshot{0, nullptr, "no model"});
  CHECK(batcher.RouteOf(d.batch, 0).has_value());
  for (const auto& t : {a, b, c, d}) batcher.Leave(t.batch);
  CHECK(batcher.batches() == 0);
  CHECK(batcher.RouteOf(a.batch, 0)->via_host.empty());  // unknown: direct
}

TEST_CASE("GetBatcher: a get while a batch leaves joins its tree as a leaf") {
  GetBatcher batcher;
  const GetBatcher::Ticket a = batcher.Join("k", "w1", "10.0.0.1:7000");
  const GetBatcher::Ticket b = batcher.Join("k", "w2", "");  // cannot forward
  batcher.Answer(a.batch, Model(5));
  batcher.SetRoutes(a.batch, {}, /*late_joins_per_member=*/2);
  // Two late gets below w1 (the only member that gave its address) ...
  const GetBatcher::Ticket c = batcher.Join("k", "w3", "10.0.0.3:7000");
  const GetBatcher::Ticket d = batcher.Join("k", "w4", "10.0.0.4:7000");
  for (const GetBatcher::Ticket& t : {c, d}) {
    CHECK(t.late);
    CHECK_FALSE(t.ask);
    CHECK(t.batch == a.batch);
    CHECK(batcher.Result(t.batch)->version == 5);
    CHECK(batcher.RouteOf(t.batch, t.member)->via_host == "w1");
  }
  // ... then w1 is full, and late leaves forward to nobody: the next get
  // opens a new batch.
  const GetBatcher::Ticket e = batcher.Join("k", "w5", "10.0.0.5:7000");
  CHECK_FALSE(e.late);
  CHECK(e.ask);
  // A host already in the leaving batch asks again: the next batch too.
  const GetBatcher::Ticket f = batcher.Join("k", "w1", "10.0.0.1:7000");
  CHECK(f.batch == e.batch);
  CHECK(batcher.stats().late_joins == 2);
  for (const auto& t : {a, b, c, d}) batcher.Leave(t.batch);
  // With no late joins allowed, or once the batch has left, gets wait.
  batcher.Answer(e.batch, Model(6));
  batcher.SetRoutes(e.batch, {}, 0);
  const GetBatcher::Ticket g = batcher.Join("k", "w6", "10.0.0.6:7000");
  CHECK_FALSE(g.late);
  CHECK(g.ask);
  for (const auto& t : {e, f, g}) batcher.Leave(t.batch);
}

TEST_CASE("GetBatcher: with the scheduler's rates a late get goes where it is fastest") {
  GetBatcher batcher;
  // A tree of three (N3): w1 forwards to w2 over a fast uplink; w3, a leaf,
  // has a slow one. The server's own copy ran at 100.
  const GetBatcher::Ticket a = batcher.Join("k", "w1", "10.0.0.1:7000");
  const GetBatcher::Ticket b = batcher.Join("k", "w2", "10.0.0.2:7000");
  const GetBatcher::Ticket c = batcher.Join("k", "w3", "10.0.0.3:7000");
  batcher.Answer(a.batch, Model(5));
  std::vector<GetBatcher::Route> routes(3);
  routes[0] = {"", "", /*rate_bps=*/100, /*uplink_bps=*/200, /*children=*/1};
  routes[1] = {"w1", "10.0.0.1:7000", 100, 90, 0};
  routes[2] = {"", "", 100, 10, 0};
  batcher.SetRoutes(a.batch, routes, /*late_joins_per_member=*/2, /*min_late_bps=*/50);
  // w1 would give 200 / 2 = 100, w2 90 (its uplink): w1 first ...
  const GetBatcher::Ticket d = batcher.Join("k", "w4", "10.0.0.4:7000");
  REQUIRE(d.late);
  CHECK(batcher.RouteOf(d.batch, d.member)->via_host == "w1");
  // ... then w2 (90 against w1's 200 / 3) ...
  const GetBatcher::Ticket e = batcher.Join("k", "w5", "10.0.0.5:7000");
  REQUIRE(e.late);
  CHECK(batcher.RouteOf(e.batch, e.member)->via_host == "w2");
  // ... then w1 again (66.7 against w2's 45, below the bound) ...
  const GetBatcher::Ticket f = batcher.Join("k", "w6", "10.0.0.6:7000");
  REQUIRE(f.late);
  CHECK(batcher.RouteOf(f.batch, f.member)->via_host == "w1");
  // ... and never w3, whose uplink would give 10: the next get waits for
  // the next batch although w2 and w3 have room.
  const GetBatcher::Ticket g = batcher.Join("k", "w7", "10.0.0.7:7000");
  CHECK_FALSE(g.late);
  CHECK(g.ask);
  CHECK(batcher.stats().late_joins == 3);
  // The server's daemon sends two copies itself (w1's and w3's); the rest
  // are forwarded.
  CHECK(batcher.DirectCopies(a.batch) == 2);
  CHECK(batcher.DirectCopies(12345) == 0);
  for (const auto& t : {a, b, c, d, e, f, g}) batcher.Leave(t.batch);
}

}  // namespace
}  // namespace mlfabric::daemon
