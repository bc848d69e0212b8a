// The outcome state machine without sockets or gRPC: a FakeClock, a real
// CommandOutbox read back as the daemons would, and hand-made state.
#include "scheduler/service/cluster_state.h"

#include <algorithm>
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"

#include "scheduler/core/network.h"
#include "scheduler/service/cluster_state_fixture.h"
#include "scheduler/service/plan_dispatcher.h"

namespace mlfabric {
namespace {

struct Fixture : ClusterStateFixture {
  Fixture() : ClusterStateFixture({"s1", "w1", "w2", "a1"}) {
    state.GetOrAddJob("demo").servers["ps"].host = "s1";
  }

  uint64_t Push(const std::string& src, int64_t version = 5) {
    return AddPush(src, version).transfer_id;
  }

  // Pushes `constituents`, in flight, summed at a1 into aggregate 77,
  // which s1's daemon expects at commit position 3.
  AggregateRecord& Aggregate77(const std::vector<uint64_t>& constituents) {
    AggregateRecord& aggregate = state.aggregates().Open(77);
    aggregate = {77, "demo", "ps", "a1", constituents, 3, {}, {}};
    for (uint64_t id : constituents) {
      state.FindPush(id)->state = UpdateState::kInFlight;
      state.FindPush(id)->aggregate_id = 77;
      state.FindPush(id)->sequence = 3;
    }
    return aggregate;
  }
  // A push from w1 in flight to s1, planned over [100, 101) s with
  // deadline 110.
  uint64_t PlannedPush() {
    const uint64_t id = Push("w1");
    UpdateRecord& record = *state.FindPush(id);
    record.state = UpdateState::kInFlight;
    record.planned.src = "w1";
    record.planned.dst = "s1";
    record.planned.deadline_s = 110;
    record.planned.segments = {{100, 101, 1e9}};
    return id;
  }
  // Hop 78 of aggregate 77's chain: the partial sum summed at w2, sent to a1.
  void AddHop78() {
    AggregateRecord::Hop hop;
    hop.id = 78;
    hop.host = "w2";
    hop.planned.src = "w2";
    hop.planned.dst = "a1";
    hop.planned.segments = {{0.0, 1.0, 1e9}};
    state.aggregates().AddHop(77, hop);
  }
};

TEST_CASE("the pushes not yet ended: found, taken out once, and gone after Complete") {
  Fixture f;
  const uint64_t a = f.Push("w1"), b = f.Push("w2");
  REQUIRE(f.state.FindPush(a) != nullptr);
  CHECK(f.state.FindPush(a)->src_host == "w1");
  CHECK(f.state.pushes().size() == 2);
  std::optional<UpdateRecord> taken = f.state.TakePush(b);  // a failover's hand-over
  REQUIRE(taken.has_value());
  CHECK(taken->src_host == "w2");
  CHECK_FALSE(f.state.TakePush(b).has_value());
  CHECK(f.state.FindPush(b) == nullptr);
  int visited = 0;
  f.state.ForEachPush([&](UpdateRecord& record) {
    ++visited;
    record.norm = 2.5;  // changed in place
  });
  CHECK(visited == 1);
  CHECK(f.state.FindPush(a)->norm == 2.5);
  f.state.Complete(a, v1::OUTCOME_APPLIED, "", 1);
  CHECK(f.state.pushes().empty());
}

TEST_CASE("jobs come from the configuration; every server can be changed in place") {
  SchedulerConfig config;
  config.jobs.push_back(JobConfig{});
  config.jobs.back().name = "demo";
  FakeClock clock{100.0};
  CommandOutbox outbox;
  AdminHistory history{8};
  ClusterState state{config, &clock, &outbox, &history};
  REQUIRE(state.FindJob("demo") != nullptr);
  CHECK(state.FindJob("demo")->id == 1);
  CHECK(state.FindJob("other") == nullptr);
  CHECK(state.jobs().size() == 1);
  state.FindJob("demo")->servers["ps"].host = "s1";
  state.FindJob("demo")->servers["ps2"].host = "s2";
  std::vector<std::string> seen;
  state.ForEachServer([&](const std::string& job_name, JobState& job,
                          const std::string& server_name, ServerState& server) {
    seen.push_back(job_name + "/" + server_name);
    server.model_version = 7;
  });
  CHECK(seen == std::vector<std::string>{"demo/ps", "demo/ps2"});
  CHECK(state.FindJob("demo")->servers["ps2"].model_version == 7);
}

TEST_CASE("a push ends exactly once, and its source is told how") {
  Fixture f;
  const uint64_t id = f.Push("w1", 5);
  f.state.FindPush(id)->state = UpdateState::kInFlight;
  f.state.GetOrAddJob("demo").servers["ps"].in_flight = 1;
  f.state.Complete(id, v1::OUTCOME_APPLIED, "", 9);
  f.state.Complete(id, v1::OUTCOME_FAILED, "late report", 0);  // ignored: it has ended
  const auto commands = f.Drain("w1");
  REQUIRE(commands.size() == 1);
  const v1::PushOutcome& outcome = commands[0].outcome();
  CHECK(outcome.outcome() == v1::OUTCOME_APPLIED);
  CHECK(outcome.local_id() == 40 + id);
  CHECK(outcome.applied_version() == 9);
  CHECK(outcome.delay() == 3);  // versions 6, 7 and 8 came in between
  CHECK(f.state.stats.applied == 1);
  CHECK(f.state.stats.failed == 0);
  CHECK(f.state.GetOrAddJob("demo").servers["ps"].in_flight == 0);
  ClusterSnapshot snap;
  f.history.CopyInto(&snap);
  REQUIRE(snap.recent_delays.size() == 1);
  CHECK(snap.recent_delays[0].latency_s == 100.0);
}

TEST_CASE("an applied push's latency splits into queued, planned and late") {
  Fixture f;
  // Submitted at 100 (the fixture's clock), planned at 100.25 to reach the
  // server at 100.75, reported applied at 100.875.
  const uint64_t direct = f.Push("w1");
  f.state.FindPush(direct)->state = UpdateState::kInFlight;
  f.state.FindPush(direct)->planned.planned_at_s = 100.25;
  f.state.FindPush(direct)->planned.end_s = 100.75;
  // Two pushes summed at a1: each is timed by the aggregate's transfer to
  // the server, not by its own hop to a1.
  const uint64_t first = f.Push("w1"), second = f.Push("w2");
  AggregateRecord& aggregate = f.Aggregate77({first, second});
  aggregate.planned.planned_at_s = 100.5;
  aggregate.planned.end_s = 101.0;
  f.state.FindPush(first)->planned.planned_at_s = 100.5;
  f.state.FindPush(first)->planned.end_s = 100.625;
  // Never planned (as after a failover): in the recent list, not the means.
  const uint64_t unplanned = f.Push("w2");
  for (uint64_t id : {direct, first, second, unplanned}) f.state.FindPush(id)->submitted_s = 100;
  f.clock.Set(100.875);
  f.state.Complete(direct, v1::OUTCOME_APPLIED, "", 6);
  f.clock.Set(101.25);
  f.state.Complete(first, v1::OUTCOME_APPLIED, "", 7);
  f.state.Complete(second, v1::OUTCOME_APPLIED, "", 8);
  f.state.Complete(unplanned, v1::OUTCOME_APPLIED, "", 9);
  ClusterSnapshot snap;
  f.history.CopyInto(&snap);
  REQUIRE(snap.recent_delays.size() == 4);
  const DelayView& d = snap.recent_delays[0];
  CHECK(d.queued_s == 0.25);
  CHECK(d.planned_s == 0.5);
  CHECK(d.late_s == 0.125);
  CHECK(d.queued_s + d.planned_s + d.late_s == d.latency_s);
  for (int i : {1, 2}) {
    CHECK(snap.recent_delays[i].queued_s == 0.5);
    CHECK(snap.recent_delays[i].planned_s == 0.5);
    CHECK(snap.recent_delays[i].late_s == 0.25);
  }
  CHECK(snap.recent_delays[3].planned_s == 0);
  const PushPhases& phases = snap.push_phases.at("demo");
  CHECK(phases.count == 3);
  CHECK(phases.queued_s == 1.25);
  CHECK(phases.planned_s == 1.5);
  CHECK(phases.late_s == 0.625);
  CHECK(phases.latency_s == 0.875 + 1.25 + 1.25);
}

TEST_CASE("a failed in-flight push frees its commit position at the server") {
  Fixture f;
  const uint64_t id = f.Push("w1");
  f.state.FindPush(id)->state = UpdateState::kInFlight;
  f.state.FindPush(id)->sequence = 4;
  f.state.Complete(id, v1::OUTCOME_FAILED, "connection reset", 0);
  const auto at_server = f.Drain("s1");
  REQUIRE(at_server.size() == 1);
  CHECK(at_server[0].cancel().sequence() == 4);
  CHECK(at_server[0].cancel().reason() == "connection reset");
  ClusterSnapshot snap;
  f.history.CopyInto(&snap);
  REQUIRE(snap.recent_drops.size() == 1);
  CHECK(snap.recent_drops[0].category == "connection_lost");
}

TEST_CASE("a push at its server's daemon fails only once that daemon confirms it skipped it") {
  Fixture f;
  auto in_flight = [&](uint64_t sequence) {
    const uint64_t id = f.Push("w1");
    UpdateRecord& record = *f.state.FindPush(id);
    f.state.GetOrAddJob("demo").servers["ps"].pending.clear();
    record.state = UpdateState::kInFlight;
    record.sequence = sequence;
    record.planned.deadline_s = 1e9;
    return id;
  };
  const uint64_t skipped = in_flight(4);
  const uint64_t handed = in_flight(5);
  f.state.MarkHostDown("w1", "daemon disconnected");
  // Both wait: the server's daemon is asked to skip their positions.
  CHECK(f.state.pushes().count(skipped) == 1);
  CHECK(f.state.pushes().count(handed) == 1);
  const auto at_server = f.Drain("s1");
  REQUIRE(at_server.size() == 2);
  CHECK(at_server[0].cancel().transfer_id() == skipped);
  CHECK(at_server[0].cancel().sequence() == 4);
  CHECK(at_server[0].cancel().confirm());
  CHECK(at_server[0].cancel().reason() == "source host w1 is down: daemon disconnected");
  // It skipped one (reporting it not applied) ...
  f.state.FailTransfer(skipped, "source host w1 is down: daemon disconnected", 0);
  REQUIRE(f.state.outcomes().Find(skipped) != nullptr);
  CHECK(f.state.outcomes().Find(skipped)->outcome == v1::OUTCOME_FAILED);
  CHECK(f.state.outcomes().Find(skipped)->reason ==
        "source host w1 is down: daemon disconnected");
  // ... and had handed the other to the application, which applied it.
  f.state.Complete(handed, v1::OUTCOME_APPLIED, "", 12);
  CHECK(f.state.outcomes().Find(handed)->outcome == v1::OUTCOME_APPLIED);
  CHECK(f.state.stats.failed == 1);
  CHECK(f.state.stats.applied == 1);

  // A daemon that never answers is not waited for forever.
  const uint64_t unanswered = in_flight(6);
  f.state.FailWhenCancelled(unanswered, "timed out");
  f.state.ExpireOverdue(f.clock.NowSeconds() + 1);
  CHECK(f.state.pushes().count(unanswered) == 1);
  f.state.ExpireOverdue(f.clock.NowSeconds() + 2 * f.config.keepalive_s +
                        f.config.transfer_slack_s + 1);
  REQUIRE(f.state.outcomes().Find(unanswered) != nullptr);
  CHECK(f.state.outcomes().Find(unanswered)->reason.find("did not confirm") !=
        std::string::npos);
}

TEST_CASE("a host going down fails every push from or to it, once, with the reason") {
  Fixture f;
  const uint64_t from_w1 = f.Push("w1");
  const uint64_t from_w2 = f.Push("w2");
  f.state.MarkHostDown("w1", "daemon disconnected");
  CHECK(f.state.pushes().count(from_w1) == 0);
  CHECK(f.state.pushes().count(from_w2) == 1);
  CHECK(f.state.GetOrAddJob("demo").servers["ps"].pending == std::vector<uint64_t>{from_w2});
  CHECK(f.state.stats.failed == 1);
  // The dead host's queue is closed: nothing waits there for a stream.
  CHECK(f.outbox.Queued("w1") == 0);

  f.state.MarkHostDown("s1", "daemon disconnected");  // the server: w2's push fails too
  CHECK(f.state.pushes().empty());
  const auto at_w2 = f.Drain("w2");
  REQUIRE(at_w2.size() == 1);
  CHECK(at_w2[0].outcome().outcome() == v1::OUTCOME_FAILED);
  CHECK(at_w2[0].outcome().reason() == "server host s1 is down: daemon disconnected");
}

// A replica aggregate (90) of two punted copies, pushes 11 (from w1, norm
// 1) and 12 (from w2, norm 2), fed to a1 as transfers 91 and 92 and
// expected at r1's replica endpoint at position 1.
struct ReplicaAggregateFixture : ClusterStateFixture {
  ReplicaAggregateFixture() : ClusterStateFixture({"s1", "r1", "w1", "w2", "a1"}) {
    JobState& job = state.GetOrAddJob("demo");
    job.servers["ps"].host = "s1";
    job.replica_hosts["ps"] = "r1";
    ReplicaCopy copy{"demo", "ps", 0, "a1", "r1", 1};
    copy.constituents = {11, 12};
    copy.norms = {1.0, 2.0};
    copy.applied_members = {{11, 1.0}, {12, 2.0}};
    copy.feeders = {"w1", "w2"};
    state.replicas().AddCopy(90, copy);
    state.replicas().AddFeed(91, 90);
    state.replicas().AddFeed(92, 90);
    job.servers["ps"].replica.in_flight[90] = 3.0;
  }
  ReplicaTrack& replica() { return state.GetOrAddJob("demo").servers["ps"].replica; }
};

TEST_CASE("a replica copy's planned transfers stay reserved on their links while it lasts") {
  ReplicaAggregateFixture f;
  f.state.replicas().FindCopy(90)->legs = {{"w1", "a1", {{100, 101, 5e8}}},
                                            {"a1", "r1", {{101, 102, 1e9}}}};
  std::map<std::string, std::vector<core::RateSegment>> up, down;
  f.state.Reservations(&up, &down);
  REQUIRE(down.count("r1") == 1);
  CHECK(core::RateAt(down["r1"], 101.5) == 1e9);
  CHECK(core::RateAt(up["w1"], 100.5) == 5e8);
  CHECK(core::RateAt(down["a1"], 100.5) == 5e8);
  f.state.EndReplicaCopy(90, /*applied=*/true, "", 7);
  up.clear();
  down.clear();
  f.state.Reservations(&up, &down);
  CHECK(down.count("r1") == 0);
}

TEST_CASE("a replica aggregate applied counts every update it carries") {
  ReplicaAggregateFixture f;
  f.state.EndReplicaCopy(90, /*applied=*/true, "", 7);
  CHECK(f.replica().applied == 2);
  CHECK(f.replica().in_flight.empty());
  CHECK(f.state.replicas().feed_count() == 0);
  CHECK(f.Drain("r1").empty());
}

TEST_CASE("a replica aggregate whose feeder goes down is cancelled and its updates counted missed") {
  ReplicaAggregateFixture f;
  f.state.MarkHostDown("w2", "daemon disconnected");
  CHECK(f.state.replicas().copy_count() == 0);
  CHECK(f.state.replicas().feed_count() == 0);
  // Both pushes are in the server's model and now never in the replica's.
  CHECK(f.replica().missed == 2);
  CHECK(f.replica().missed_norm == 3.0);
  const auto at_replica = f.Drain("r1");
  REQUIRE(at_replica.size() == 1);
  CHECK(at_replica[0].cancel().transfer_id() == 90);
  CHECK(at_replica[0].cancel().sequence() == 1);
  CHECK(at_replica[0].cancel().reason().find("source host w2 is down") == 0);
}

// The same aggregate made of copies of two pushes still in flight: held at
// the replica until both apply.
struct HeldAggregateFixture : ReplicaAggregateFixture {
  uint64_t a = 0, b = 0;
  HeldAggregateFixture() {
    a = Push("w1");
    b = Push("w2");
    for (uint64_t id : {a, b}) {
      state.FindPush(id)->state = UpdateState::kInFlight;
      state.FindPush(id)->norm = 1.0;
    }
    ReplicaCopy& copy = *state.replicas().FindCopy(90);
    copy.constituents = {a, b};
    copy.norms = {1.0, 1.0};
    copy.applied_members.clear();
    copy.unsettled = {a, b};
    copy.held = true;
  }
  uint64_t Push(const std::string& src) { return AddPush(src, 5).transfer_id; }
};

TEST_CASE("a held replica aggregate is released only once every push in it applied") {
  HeldAggregateFixture f;
  f.state.Complete(f.a, v1::OUTCOME_APPLIED, "", 6);
  CHECK(f.Drain("r1").empty());  // b is still in flight
  f.state.Complete(f.b, v1::OUTCOME_APPLIED, "", 7);
  const auto at_replica = f.Drain("r1");
  REQUIRE(at_replica.size() == 1);
  CHECK(at_replica[0].release().transfer_id() == 90);
  CHECK(at_replica[0].release().sequence() == 1);
  f.state.EndReplicaCopy(90, /*applied=*/true, "", 7);
  CHECK(f.replica().applied == 2);
  CHECK(f.replica().missed == 0);
}

TEST_CASE("a held replica aggregate is cancelled when one of its pushes fails") {
  HeldAggregateFixture f;
  f.state.Complete(f.a, v1::OUTCOME_APPLIED, "", 6);
  f.state.Complete(f.b, v1::OUTCOME_FAILED, "timed out", 0);
  CHECK(f.state.replicas().copy_count() == 0);
  const auto at_replica = f.Drain("r1");
  REQUIRE(at_replica.size() == 1);
  CHECK(at_replica[0].cancel().transfer_id() == 90);
  // a applied at the server and its copy went with the aggregate.
  CHECK(f.replica().missed == 1);
  CHECK(f.replica().missed_norm == 1.0);
}

TEST_CASE("a push of a cancelled held aggregate still in flight gets a copy of its own later") {
  HeldAggregateFixture f;
  f.state.MarkHostDown("a1", "daemon disconnected");  // held: its pushes decide
  REQUIRE(f.state.replicas().HasCopy(90));
  CHECK(f.state.replicas().FindCopy(90)->source_down);
  f.state.Complete(f.a, v1::OUTCOME_FAILED, "timed out", 0);
  CHECK(f.state.replicas().copy_count() == 0);
  // b, still in flight, is punted: once applied its source keeps the bytes
  // for a copy in a later batch.
  REQUIRE(f.state.pushes().count(f.b) == 1);
  CHECK(f.state.FindPush(f.b)->replica_punted);
  CHECK(f.replica().missed == 0);
  f.state.Complete(f.b, v1::OUTCOME_APPLIED, "", 6);
  REQUIRE(f.replica().pending.size() == 1);
  CHECK(f.replica().pending[0].id == f.b);
}

TEST_CASE("a replica aggregate whose aggregator goes down names it") {
  ReplicaAggregateFixture f;
  f.state.MarkHostDown("a1", "daemon disconnected");
  CHECK(f.state.replicas().copy_count() == 0);
  CHECK(f.replica().missed == 2);
  const auto at_replica = f.Drain("r1");
  REQUIRE(at_replica.size() == 1);
  CHECK(at_replica[0].cancel().reason().find("aggregator host a1 is down") == 0);
}

TEST_CASE("an aggregate's failure fails its constituents and cancels it at both ends") {
  Fixture f;
  const uint64_t a = f.Push("w1"), b = f.Push("w2");
  f.Aggregate77({a, b});
  f.state.Complete(a, v1::OUTCOME_FAILED, "w1 vanished", 0);
  CHECK(f.state.aggregates().size() == 0);
  CHECK(f.state.pushes().empty());  // b went down with its aggregate
  CHECK(f.state.stats.failed == 2);
  const auto at_aggregator = f.Drain("a1");
  REQUIRE(at_aggregator.size() == 1);
  CHECK(at_aggregator[0].cancel().transfer_id() == 77);
  CHECK(f.Drain("s1").size() == 1);  // the aggregate's cancel; no per-constituent cancels
  const auto at_w2 = f.Drain("w2");
  REQUIRE(at_w2.size() == 1);
  CHECK(at_w2[0].outcome().reason().find("its in-network aggregate failed") == 0);
  // It names the host whose push failed, not only the reason reported.
  CHECK(at_w2[0].outcome().reason().find(absl::StrCat("constituent ", a, " from w1 failed: w1 vanished")) !=
        std::string::npos);
}

TEST_CASE("a chain hop's host going down fails the chain's aggregate and cancels every hop") {
  // w1's and w2's updates stream w1 -> w2 -> a1 -> s1: hop 78 is the
  // partial sum summed at w2 and sent to a1, which sends aggregate 77.
  Fixture f;
  const uint64_t a = f.Push("w1"), b = f.Push("w2");
  f.Aggregate77({a, b});
  f.AddHop78();
  // The hop's reservation is part of the network the planner sees.
  std::map<std::string, std::vector<core::RateSegment>> up, down;
  f.state.Reservations(&up, &down);
  CHECK(up["w2"].size() == 1);
  CHECK(down["a1"].size() == 1);

  f.state.MarkHostDown("w2", "connection lost");
  // The sum may be at s1's daemon already: it is asked to skip it and
  // confirm; nothing has failed yet.
  REQUIRE(f.state.aggregates().Find(77) != nullptr);
  CHECK(f.state.pushes().size() == 2);
  const auto at_s1 = f.Drain("s1");
  REQUIRE(at_s1.size() == 1);
  CHECK(at_s1[0].cancel().transfer_id() == 77);
  CHECK(at_s1[0].cancel().confirm());
  // It skipped it (the completion report the handler turns into this).
  const std::string asked = f.state.aggregates().Find(77)->cancel_pending;
  f.state.FailAggregate(77, asked);
  CHECK(f.state.aggregates().size() == 0);
  CHECK(f.state.aggregates().hops() == 0);
  CHECK(f.state.pushes().empty());  // both pushes ended
  const auto at_a1 = f.Drain("a1");
  REQUIRE(at_a1.size() == 1);
  CHECK(at_a1[0].cancel().transfer_id() == 77);
  const auto at_w1 = f.Drain("w1");
  REQUIRE(at_w1.size() == 1);
  CHECK(at_w1[0].outcome().outcome() == v1::OUTCOME_FAILED);
  CHECK(at_w1[0].outcome().reason().find("w2 is down") != std::string::npos);
}

TEST_CASE("an aggregate whose aggregator went down is applied if the server had it already") {
  Fixture f;
  const uint64_t a = f.Push("w1"), b = f.Push("w2");
  f.state.GetOrAddJob("demo").servers["ps"].pending.clear();
  f.Aggregate77({a, b});
  for (uint64_t id : {a, b}) {
    f.state.FindPush(id)->planned.deadline_s = 50;  // past: they are overdue too
  }
  f.state.MarkHostDown("a1", "daemon disconnected");
  REQUIRE(f.state.aggregates().Find(77) != nullptr);
  const auto at_s1 = f.Drain("s1");
  REQUIRE(at_s1.size() == 1);
  CHECK(at_s1[0].cancel().confirm());
  // Timeouts meanwhile do not fail (or count) its constituents again.
  f.state.ExpireOverdue(f.clock.NowSeconds() + 1);
  CHECK(f.state.stats.timed_out == 0);
  CHECK(f.state.pushes().size() == 2);
  // s1's application had the sum: both constituents applied, as versions
  // 9 and 10 (what the completion handler does for an applied aggregate).
  f.state.aggregates().Take(77);
  f.state.Complete(a, v1::OUTCOME_APPLIED, "", 9);
  f.state.Complete(b, v1::OUTCOME_APPLIED, "", 10);
  CHECK(f.state.stats.applied == 2);
  CHECK(f.state.stats.failed == 0);
}

TEST_CASE("a failed round fails every member and moves the server past it") {
  Fixture f;
  f.state.GetOrAddJob("demo").servers["ps"].model_version = 5;
  const uint64_t a = f.Push("w1", 5), b = f.Push("w2", 5), later = f.Push("w2", 6);
  f.state.FailRound("demo", "ps", 5, "mismatch: sizes differ");
  CHECK(f.state.pushes().count(a) == 0);
  CHECK(f.state.pushes().count(b) == 0);
  CHECK(f.state.pushes().count(later) == 1);
  CHECK(f.state.GetOrAddJob("demo").servers["ps"].model_version == 6);
  const auto at_server = f.Drain("s1");
  REQUIRE(at_server.size() == 1);
  CHECK(at_server[0].cancel().fail_round());
  CHECK(at_server[0].cancel().round() == 5);
}

TEST_CASE("reservations restricted to some hosts are theirs in full, and only theirs") {
  // A push w1 -> s1 and a chain hop w2 -> a1: the links a distribution
  // from s1 to w2 asks for are s1's and w2's, with every segment on them.
  Fixture f;
  f.PlannedPush();
  const uint64_t b = f.Push("w2");
  f.Aggregate77({b});
  f.AddHop78();
  std::map<std::string, std::vector<core::RateSegment>> up, down, some_up, some_down;
  f.state.Reservations(&up, &down);
  const absl::flat_hash_set<std::string> hosts = {"s1", "w2"};
  f.state.Reservations(&some_up, &some_down, &hosts);
  for (const auto& [host, segments] : some_up) CHECK(hosts.count(host) == 1);
  for (const auto& [host, segments] : some_down) CHECK(hosts.count(host) == 1);
  auto same = [](const std::vector<core::RateSegment>& a,
                 const std::vector<core::RateSegment>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].from_s != b[i].from_s || a[i].to_s != b[i].to_s ||
          a[i].rate_bps != b[i].rate_bps) {
        return false;
      }
    }
    return true;
  };
  CHECK(some_up["w2"].size() == 1);
  CHECK(some_down["s1"].size() == 1);
  CHECK(same(some_up["w2"], up["w2"]));
  CHECK(same(some_down["s1"], down["s1"]));
  CHECK(up.count("w1") == 1);  // left out above, there in full
}

TEST_CASE("in-flight pushes past their deadline time out; planned ones are reserved") {
  Fixture f;
  const uint64_t id = f.PlannedPush();
  std::map<std::string, std::vector<core::RateSegment>> up, down;
  f.state.Reservations(&up, &down);
  CHECK(up["w1"].size() == 1);
  CHECK(down["s1"].size() == 1);
  f.state.ExpireOverdue(105);
  CHECK(f.state.pushes().count(id) == 1);
  f.state.ExpireOverdue(111);
  CHECK(f.state.pushes().count(id) == 0);
  CHECK(f.state.stats.timed_out == 1);
}

TEST_CASE("job policies: round size, delay bound and divergence bound") {
  JobState job;
  ServerState server;
  CHECK(RoundSize(job, server) == 0);
  job.config.mode = JobMode::kSync;
  job.workers["a"] = {};
  job.workers["b"] = {};
  job.workers["c"] = {};
  // Sized by the live members, not every worker that registered.
  for (const char* w : {"a", "b", "c"}) job.membership.Join(w, 1.0, "registered");
  CHECK(RoundSize(job, server) == 3);
  job.membership.Leave("c", 2.0, "its host is down");
  CHECK(RoundSize(job, server) == 2);
  job.config.backup_workers = 1;
  CHECK(RoundSize(job, server) == 1);
  job.membership.Leave("b", 3.0, "its host is down");
  CHECK(RoundSize(job, server) == 1);  // at least one push
  job.membership.Leave("a", 4.0, "its host is down");
  CHECK(RoundSize(job, server) == 1);  // a job whose members all left stays synchronous
  // An exchange server (plan_on_arrival: an Alltoall's) never sums rounds.
  server.plan_on_arrival = true;
  CHECK(RoundSize(job, server) == 0);
  CHECK_FALSE(MemberSizedRounds(job, server));
  server.plan_on_arrival = false;
  job.config.backup_workers = 0;
  server.round_size = 5;
  CHECK(RoundSize(job, server) == 5);
  // The bounds are the live members' too: a worker that left binds no one.
  job.config.tau_max = 30;
  CHECK(DelayBound(job) == 30);
  job.workers["a"].delay_bound = 4;
  CHECK(DelayBound(job) == 30);  // 'a' left
  job.membership.Join("a", 5.0, "registered again");
  CHECK(DelayBound(job) == 4);
  job.config.mode = JobMode::kSsp;
  job.config.staleness_k = 2;
  CHECK(DelayBound(job) == 4);  // K bounds clocks, not versions
  CHECK(DivergenceBound(job) == 0);
  job.workers["b"].divergence_bound = 3.5;
  CHECK(DivergenceBound(job) == 0);  // 'b' left
  job.membership.Join("b", 6.0, "registered again");
  CHECK(DivergenceBound(job) == 3.5);
  job.config.divergence_max = 2.0;
  CHECK(DivergenceBound(job) == 2.0);
  job.config.divergence_max = 5.0;
  CHECK(DivergenceBound(job) == 3.5);
  job.membership.Leave("b", 7.0, "its application left");
  job.membership.Leave("a", 7.0, "its application left");
  CHECK(DivergenceBound(job) == 5.0);
  CHECK(DelayBound(job) == 30);
}

}  // namespace
}  // namespace mlfabric

namespace mlfabric {
namespace {

TEST_CASE("a restarted scheduler's transfer ids and incarnations never equal its predecessor's") {
  SchedulerConfig config;
  CommandOutbox outbox;
  AdminHistory history{8};
  // Two schedulers, the second started one second after the first (Unix
  // time 2026-11-25): each hands out many ids; none repeats.
  FakeClock first_clock(1795590000.0), second_clock(1795590001.0);
  ClusterState first(config, &first_clock, &outbox, &history);
  ClusterState second(config, &second_clock, &outbox, &history);
  CHECK(second.epoch() == first.epoch() + 1);
  std::set<uint64_t> ids;
  uint64_t highest_first = 0;
  for (int i = 0; i < 10000; ++i) {
    const uint64_t transfer = first.NewTransferId(), incarnation = first.NewIncarnation();
    highest_first = std::max({highest_first, transfer, incarnation});
    ids.insert(transfer);
  }
  for (int i = 0; i < 10000; ++i) {
    const uint64_t transfer = second.NewTransferId(), incarnation = second.NewIncarnation();
    CHECK(transfer > highest_first);
    CHECK(incarnation > highest_first);
    CHECK(ids.insert(transfer).second);
    // Bits 60-63 are the daemons' own id spaces.
    CHECK((transfer >> 60) == 0);
  }
  // Incarnations are not a counter: 32 random bits below the
  // epoch, never one issued before.
  std::set<uint64_t> incarnations;
  int consecutive = 0;
  uint64_t previous = second.NewIncarnation();
  for (int i = 0; i < 1000; ++i) {
    const uint64_t incarnation = second.NewIncarnation();
    CHECK((incarnation >> 32) == second.epoch());
    CHECK(incarnations.insert(incarnation).second);
    consecutive += incarnation == previous + 1;
    previous = incarnation;
  }
  CHECK(consecutive < 5);
  CHECK(SchedulerEpoch(0) == 0);  // before 2024 (and FakeClocks near 0): plain counters
  CHECK(SchedulerEpoch(1e12) == (uint64_t{1} << 28) - 1);
}

}  // namespace
}  // namespace mlfabric
