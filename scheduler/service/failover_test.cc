// Promotion of a replica when its server goes (failover.h), on a
// ClusterState with a FakeClock and the commands read back as the daemons
// would: every update of the moment ends exactly once, by what the
// replica holds.
#include "scheduler/service/failover.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "scheduler/service/cluster_state_fixture.h"

namespace mlfabric {
namespace {

struct Fixture : ClusterStateFixture {
  Fixture() : ClusterStateFixture({"s1", "r1", "w1", "w2"}) {
    JobState& job = state.GetOrAddJob("demo");
    job.id = 7;
    job.config.name = "demo";
    ServerState& server = job.servers["ps"];
    server.host = "s1";
    server.model_version = 40;
    server.next_sequence = 41;
    server.replica.next_sequence = 31;  // the replica's stream is behind
    job.replica_hosts["ps"] = "r1";
  }

  ServerState& server() { return state.GetOrAddJob("demo").servers["ps"]; }

  uint64_t Push(const std::string& src, bool in_flight, double norm = 1) {
    UpdateRecord& record = AddPush(src);
    record.norm = norm;
    if (in_flight) {  // planned: out of the pending list, at the next commit position
      server().pending.pop_back();
      record.state = UpdateState::kInFlight;
      record.sequence = server().next_sequence++;
      record.planned.deadline_s = 1e9;
      ++server().in_flight;
    }
    return record.transfer_id;
  }

  // A replica copy of push `source` from `src`, moving to the replica.
  // `held`: sent alongside its push, held at the replica until its outcome.
  uint64_t Copy(uint64_t source, const std::string& src, double norm, bool held = false) {
    const uint64_t copy = state.NewTransferId();
    ReplicaCopy& added = state.replicas().AddCopy(
        copy, {"demo", "ps", source, src, "r1", server().replica.next_sequence++});
    added.held = held;
    server().replica.in_flight[copy] = norm;
    return copy;
  }

  // The outcome told to `host` for push `id`, if any.
  static const v1::PushOutcome* OutcomeOf(const std::vector<v1::DaemonCommand>& commands,
                                          uint64_t id) {
    for (const v1::DaemonCommand& c : commands) {
      if (c.has_outcome() && c.outcome().transfer_id() == id) return &c.outcome();
    }
    return nullptr;
  }
  // A pointer into commands that die at the end of the statement: refused.
  static const v1::PushOutcome* OutcomeOf(std::vector<v1::DaemonCommand>&& commands,
                                          uint64_t id) = delete;
};

TEST_CASE("the replica becomes the server; pushes in flight end by what it holds") {
  Fixture f;
  const uint64_t waiting = f.Push("w1", /*in_flight=*/false);
  const uint64_t lost = f.Push("w1", /*in_flight=*/true);
  const uint64_t held = f.Push("w2", /*in_flight=*/true);
  f.state.FindPush(held)->replica_ahead = true;  // its copy was applied first
  const uint64_t racing = f.Push("w2", /*in_flight=*/true);
  const uint64_t racing_copy = f.Copy(racing, "w2", 3);

  REQUIRE(FailOverServersOn(&f.state, "s1", "daemon disconnected") == 1);
  f.state.MarkHostDown("s1", "daemon disconnected");

  // The server lives on r1, its commit order continuing the replica's.
  CHECK(f.server().host == "r1");
  CHECK(f.state.GetOrAddJob("demo").replica_hosts.count("ps") == 0);
  CHECK(f.server().next_sequence == 32);
  const auto at_r1 = f.Drain("r1");
  REQUIRE(at_r1.size() == 1);
  REQUIRE(at_r1[0].has_promote());
  CHECK(at_r1[0].promote().job_id() == 7);
  CHECK(at_r1[0].promote().server() == "ps");
  CHECK(at_r1[0].promote().old_host() == "s1");
  CHECK(at_r1[0].promote().model_version() == 40);
  CHECK(at_r1[0].promote().reason().find("host s1 is down: daemon disconnected") !=
        std::string::npos);

  // Waiting: still waiting, for the new host (MarkHostDown left it).
  CHECK(f.state.pushes().count(waiting) == 1);
  CHECK(f.server().pending == std::vector<uint64_t>{waiting});
  // In flight, not at the replica: failed, saying why.
  const auto at_w1 = f.Drain("w1");
  const v1::PushOutcome* lost_outcome = Fixture::OutcomeOf(at_w1, lost);
  REQUIRE(lost_outcome != nullptr);
  CHECK(lost_outcome->outcome() == v1::OUTCOME_FAILED);
  CHECK(lost_outcome->reason().find("failed over from s1 to its replica on r1") !=
        std::string::npos);
  CHECK(lost_outcome->reason().find("push it again") != std::string::npos);
  // In flight, at the replica already: applied.
  auto at_w2 = f.Drain("w2");
  const v1::PushOutcome* held_outcome = Fixture::OutcomeOf(at_w2, held);
  REQUIRE(held_outcome != nullptr);
  CHECK(held_outcome->outcome() == v1::OUTCOME_APPLIED);
  // In flight with its copy moving: undecided until the copy ends.
  CHECK(Fixture::OutcomeOf(at_w2, racing) == nullptr);
  CHECK(f.state.pushes().count(racing) == 0);
  CHECK(f.state.replicas().CountDecidedBy(racing_copy) == 1);
  f.state.ExpireOverdue(2e9);  // nothing expires it meanwhile
  CHECK(f.Drain("w2").empty());
  f.state.EndReplicaCopy(racing_copy, /*applied=*/true, "", 43);
  at_w2 = f.Drain("w2");
  const v1::PushOutcome* racing_outcome = Fixture::OutcomeOf(at_w2, racing);
  REQUIRE(racing_outcome != nullptr);
  CHECK(racing_outcome->outcome() == v1::OUTCOME_APPLIED);
  CHECK(racing_outcome->applied_version() == 43);
  CHECK(f.server().model_version == 43);  // the promoted replica's version is the model's

  const JobState& job = f.state.GetOrAddJob("demo");
  REQUIRE(job.failovers.size() == 1);
  const FailoverView& failover = job.failovers[0];
  CHECK(failover.from_host == "s1");
  CHECK(failover.to_host == "r1");
  CHECK(failover.model_version == 40);
  CHECK(failover.in_flight_applied == 1);
  CHECK(failover.in_flight_failed == 1);
  CHECK(failover.in_flight_awaiting == 1);
  CHECK(failover.lost_updates == 0);
  CHECK(job.applied == 2);
  CHECK(job.failed == 1);
}

TEST_CASE("pushes in flight whose copies were summed into one held aggregate end as it does") {
  for (bool applied : {true, false}) {
    CAPTURE(applied);
    Fixture f;
    f.state.hosts().Register("a1").alive = true;
    const uint64_t a = f.Push("w1", /*in_flight=*/true);
    const uint64_t b = f.Push("w2", /*in_flight=*/true);
    const uint64_t aggregate = f.state.NewTransferId();
    ReplicaCopy copy{"demo", "ps", 0, "a1", "r1", f.server().replica.next_sequence++};
    copy.constituents = {a, b};
    copy.norms = {1, 1};
    copy.feeders = {"w1", "w2"};
    copy.unsettled = {a, b};
    copy.held = true;
    f.state.replicas().AddCopy(aggregate, copy);
    f.server().replica.in_flight[aggregate] = 2;

    REQUIRE(FailOverServersOn(&f.state, "s1", "daemon disconnected") == 1);
    f.state.MarkHostDown("s1", "daemon disconnected");
    // Both wait for the aggregate, which the promoted replica may now apply.
    CHECK(f.state.replicas().CountDecidedBy(aggregate) == 2);
    bool released = false;
    for (const v1::DaemonCommand& c : f.Drain("r1")) {
      released = released || (c.has_release() && c.release().transfer_id() == aggregate);
    }
    CHECK(released);
    f.state.EndReplicaCopy(aggregate, applied, applied ? "" : "aggregator a1 is down", 42);
    CHECK(f.state.replicas().decided_count() == 0);
    const auto at_w1 = f.Drain("w1");
    const auto at_w2 = f.Drain("w2");
    REQUIRE(Fixture::OutcomeOf(at_w1, a) != nullptr);
    REQUIRE(Fixture::OutcomeOf(at_w2, b) != nullptr);
    const v1::Outcome expected = applied ? v1::OUTCOME_APPLIED : v1::OUTCOME_FAILED;
    CHECK(Fixture::OutcomeOf(at_w1, a)->outcome() == expected);
    CHECK(Fixture::OutcomeOf(at_w2, b)->outcome() == expected);
    if (!applied) {
      // Both were in the old server's model maybe, and are in none now.
      CHECK(f.state.GetOrAddJob("demo").failovers.back().lost_updates == 2);
    }
  }
}

TEST_CASE("updates the old server applied reach the new one from their sources, or count lost") {
  Fixture f;
  ServerState& server = f.server();
  server.replica.pending.push_back({501, "w1", "w1", 64, 38, 2.0});  // punted
  server.replica.pending.push_back({502, "w2", "w2", 64, 39, 5.0});  // punted, source gone
  const uint64_t moving = f.Copy(503, "w1", 7.0);                    // copy still moving
  f.state.hosts().Register("w2").alive = false;

  REQUIRE(PromoteReplica(&f.state, "demo", "ps", "server application left"));
  // 501 goes to the new server as its next delivery, named by the server.
  const auto at_r1 = f.Drain("r1");
  REQUIRE(at_r1.size() == 2);
  CHECK(at_r1[0].has_promote());
  REQUIRE(at_r1[1].has_expect());
  CHECK(at_r1[1].expect().server() == "ps");
  CHECK(at_r1[1].expect().sequence() == 32);  // after the moving copy (31)
  CHECK(at_r1[1].expect().version() == 38);
  const auto at_w1 = f.Drain("w1");
  REQUIRE(at_w1.size() == 1);
  REQUIRE(at_w1[0].has_send());
  CHECK(at_w1[0].send().source_transfer_id() == 501);
  CHECK(at_w1[0].send().dst_host() == "r1");
  CHECK(at_w1[0].send().segments_size() == 1);
  CHECK(server.replica.pending.empty());

  const FailoverView* failover = &f.state.GetOrAddJob("demo").failovers.back();
  CHECK(failover->catch_up_copies == 1);
  CHECK(failover->lost_updates == 1);  // 502: its source is gone too
  CHECK(failover->lost_norm == 5.0);
  // A copy that was moving fails after all: its update is lost too.
  f.state.EndReplicaCopy(moving, /*applied=*/false, "source host w1 is down", 0);
  failover = &f.state.GetOrAddJob("demo").failovers.back();
  CHECK(failover->lost_updates == 2);
  CHECK(failover->lost_norm == 12.0);
  // And the promoted daemon is told to skip its position, by the server's name.
  const auto cancels = f.Drain("r1");
  REQUIRE(cancels.size() == 1);
  CHECK(cancels[0].cancel().sequence() == 31);
}

TEST_CASE("no live replica: nothing moves, and the server's pushes fail as before") {
  Fixture f;
  f.state.hosts().Register("r1").alive = false;
  const uint64_t in_flight = f.Push("w1", /*in_flight=*/true);
  CHECK_FALSE(PromoteReplica(&f.state, "demo", "ps", "gone"));
  CHECK(FailOverServersOn(&f.state, "s1", "gone") == 0);
  CHECK(f.server().host == "s1");
  CHECK(f.state.GetOrAddJob("demo").failovers.empty());
  f.state.MarkHostDown("s1", "gone");
  const auto at_w1 = f.Drain("w1");
  const v1::PushOutcome* outcome = Fixture::OutcomeOf(at_w1, in_flight);
  REQUIRE(outcome != nullptr);
  CHECK(outcome->reason().find("server host s1 is down") != std::string::npos);

  Fixture same_host;
  same_host.state.GetOrAddJob("demo").replica_hosts["ps"] = "s1";  // nowhere to go
  CHECK_FALSE(PromoteReplica(&same_host.state, "demo", "ps", "gone"));
}

TEST_CASE("a push whose transfer failed while its replica holds its copy waits for a failover") {
  Fixture f;
  const uint64_t held = f.Push("w1", /*in_flight=*/true);
  f.state.FindPush(held)->replica_ahead = true;
  const uint64_t racing = f.Push("w2", /*in_flight=*/true);
  const uint64_t racing_copy = f.Copy(racing, "w2", 2);
  const uint64_t plain = f.Push("w1", /*in_flight=*/true);
  // The server's daemon died; its peers noticed before the scheduler did.
  f.state.FailTransfer(held, "connection refused by s1", 5);
  f.state.FailTransfer(racing, "connection refused by s1", 5);
  f.state.FailTransfer(plain, "connection refused by s1", 5);
  const auto early = f.Drain("w1");
  REQUIRE(Fixture::OutcomeOf(early, plain) != nullptr);  // nothing at the replica: fails now
  CHECK(Fixture::OutcomeOf(early, held) == nullptr);     // waits
  CHECK(f.Drain("w2").empty());

  // The failover comes: the replica's model is served, and holds them.
  REQUIRE(FailOverServersOn(&f.state, "s1", "daemon disconnected") == 1);
  const auto at_w1 = f.Drain("w1");
  REQUIRE(Fixture::OutcomeOf(at_w1, held) != nullptr);
  CHECK(Fixture::OutcomeOf(at_w1, held)->outcome() == v1::OUTCOME_APPLIED);
  f.state.EndReplicaCopy(racing_copy, /*applied=*/true, "", 41);
  const auto at_w2 = f.Drain("w2");
  REQUIRE(Fixture::OutcomeOf(at_w2, racing) != nullptr);
  CHECK(Fixture::OutcomeOf(at_w2, racing)->outcome() == v1::OUTCOME_APPLIED);

  // Without a failover the push fails once the grace is over, and its copy
  // is stopped at the replica if it can be.
  Fixture g;
  const uint64_t lone = g.Push("w2", /*in_flight=*/true);
  const uint64_t lone_copy = g.Copy(lone, "w2", 2);
  g.state.FailTransfer(lone, "connection reset", 5);
  g.state.ExpireOverdue(g.clock.NowSeconds() + 1);
  CHECK(g.Drain("w2").empty());
  g.state.ExpireOverdue(g.clock.NowSeconds() + 6);
  const auto late = g.Drain("w2");
  REQUIRE(Fixture::OutcomeOf(late, lone) != nullptr);
  CHECK(Fixture::OutcomeOf(late, lone)->outcome() == v1::OUTCOME_FAILED);
  CHECK(Fixture::OutcomeOf(late, lone)->reason() == "connection reset");
  CHECK_FALSE(g.state.replicas().HasCopy(lone_copy));
  const auto at_r1 = g.Drain("r1");
  REQUIRE(at_r1.size() == 1);
  CHECK(at_r1[0].cancel().transfer_id() == lone_copy);
}

TEST_CASE("a held copy is released when its push applies and cancelled when it fails") {
  Fixture f;
  const uint64_t good = f.Push("w1", /*in_flight=*/true);
  const uint64_t good_copy = f.Copy(good, "w1", 1, /*held=*/true);
  const uint64_t bad = f.Push("w2", /*in_flight=*/true);
  const uint64_t bad_copy = f.Copy(bad, "w2", 1, /*held=*/true);

  f.state.Complete(good, v1::OUTCOME_APPLIED, "", 41);
  auto at_r1 = f.Drain("r1");
  REQUIRE(at_r1.size() == 1);
  REQUIRE(at_r1[0].has_release());
  REQUIRE(f.state.replicas().HasCopy(good_copy));
  CHECK(at_r1[0].release().transfer_id() == good_copy);
  CHECK(at_r1[0].release().sequence() == f.state.replicas().FindCopy(good_copy)->sequence);
  CHECK_FALSE(f.state.replicas().FindCopy(good_copy)->held);

  // The server never applied `bad` (its aggregate failed, say): the replica
  // must not either.
  f.state.Complete(bad, v1::OUTCOME_FAILED, "its in-network aggregate failed", 0);
  at_r1 = f.Drain("r1");
  REQUIRE(at_r1.size() == 1);
  REQUIRE(at_r1[0].has_cancel());
  CHECK(at_r1[0].cancel().transfer_id() == bad_copy);
  CHECK(at_r1[0].cancel().server() == "replica:ps");
  CHECK_FALSE(f.state.replicas().HasCopy(bad_copy));
  CHECK(f.server().replica.in_flight.count(bad_copy) == 0);
}

TEST_CASE("at a failover, held copies of undecided pushes are released after the promotion") {
  Fixture f;
  const uint64_t racing = f.Push("w2", /*in_flight=*/true);
  const uint64_t racing_copy = f.Copy(racing, "w2", 1, /*held=*/true);
  REQUIRE(FailOverServersOn(&f.state, "s1", "daemon disconnected") == 1);
  const auto at_r1 = f.Drain("r1");
  REQUIRE(at_r1.size() == 2);
  CHECK(at_r1[0].has_promote());
  REQUIRE(at_r1[1].has_release());
  CHECK(at_r1[1].release().transfer_id() == racing_copy);
  CHECK(f.state.replicas().CountDecidedBy(racing_copy) == 1);
  f.state.EndReplicaCopy(racing_copy, /*applied=*/true, "", 41);
  // Kept: OutcomeOf points into the drained commands.
  const std::vector<v1::DaemonCommand> at_w2 = f.Drain("w2");
  const v1::PushOutcome* outcome = Fixture::OutcomeOf(at_w2, racing);
  REQUIRE(outcome != nullptr);
  CHECK(outcome->outcome() == v1::OUTCOME_APPLIED);
}

TEST_CASE("a held copy whose source went down waits for its push; if applied, only if whole") {
  Fixture f;
  const uint64_t push = f.Push("w2", /*in_flight=*/true);
  const uint64_t copy = f.Copy(push, "w2", 2, /*held=*/true);
  f.state.MarkHostDown("w2", "daemon disconnected");
  // The copy may be whole at r1: kept; the push waits for s1's daemon.
  REQUIRE(f.state.replicas().HasCopy(copy));
  CHECK(f.state.replicas().FindCopy(copy)->source_down);
  CHECK(f.Drain("r1").empty());
  const auto at_s1 = f.Drain("s1");
  REQUIRE(at_s1.size() == 1);
  CHECK(at_s1[0].cancel().confirm());
  // s1's application had it already: applied. r1 is told to deliver the
  // copy only if all of it arrived.
  f.state.Complete(push, v1::OUTCOME_APPLIED, "", 41);
  const auto at_r1 = f.Drain("r1");
  REQUIRE(at_r1.size() == 1);
  REQUIRE(at_r1[0].has_release());
  CHECK(at_r1[0].release().cancel_if_incomplete());
  // It had not: r1's daemon reports the copy failed, and the replica is
  // known to lack the update, which a failover would count lost.
  f.state.EndReplicaCopy(copy, /*applied=*/false, "its source went away", 0);
  CHECK(f.server().replica.missed == 1);
  CHECK(f.server().replica.missed_norm == 2);
  REQUIRE(FailOverServersOn(&f.state, "s1", "daemon disconnected") == 1);
  CHECK(f.state.GetOrAddJob("demo").failovers[0].lost_updates == 1);
}

}  // namespace
}  // namespace mlfabric
