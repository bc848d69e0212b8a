// A restarted scheduler's decisions on what the daemons kept across it
// (in_doubt.h), on a ClusterState with a FakeClock: here, the replica
// copies a replica's daemon held for their pushes' outcomes.
#include "scheduler/service/in_doubt.h"

#include "scheduler/service/failover.h"
#include "scheduler/service/server_groups.h"

#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "scheduler/service/cluster_state_fixture.h"

namespace mlfabric {
namespace {

struct Fixture : ClusterStateFixture {
  Fixture() : ClusterStateFixture({"s1", "r1", "w1"}) {
    JobState& job = state.GetOrAddJob("demo");
    job.id = 7;
    job.config.name = "demo";
    ServerState& server = job.servers["ps"];
    server.host = "s1";
    server.replica.next_sequence = 3;
    job.replica_hosts["ps"] = "r1";
  }

  // An id the previous scheduler gave out.
  uint64_t OldId(uint64_t n) const {
    return ((state.epoch() - 1) << kEpochShift) + n;
  }

  // s1's daemon registers again, reporting `push` applied before the restart.
  void ServerApplied(uint64_t push, int64_t version) {
    v1::RegisterHostRequest s1;
    s1.set_host("s1");
    v1::AppliedPush* entry = s1.add_applied();
    entry->set_transfer_id(push);
    entry->set_model_version(version);
    entry->set_acknowledged(true);
    AcceptHostReport(&state, s1);
  }

  // A held copy of push `source` as r1's daemon reports it.
  v1::HeldCopy Held(uint64_t copy, uint64_t source) const {
    v1::HeldCopy held;
    held.set_job("demo");
    v1::ExpectDelivery* e = held.mutable_copy();
    e->set_transfer_id(copy);
    e->set_job_id(3);  // the old scheduler's number for the job
    e->set_server("replica:ps");
    e->set_sequence(40);
    e->set_bytes(64);
    e->set_src_host("w1");
    e->set_norm(2.5);
    e->set_held(true);
    e->set_source_transfer_id(source);
    return held;
  }
};

TEST_CASE("kept replica copies are delivered again if their push applied, dropped if not") {
  Fixture f;
  const uint64_t applied = f.OldId(5), not_applied = f.OldId(6);
  const uint64_t applied_copy = f.OldId(15), not_applied_copy = f.OldId(16);
  v1::RegisterHostRequest r1;
  r1.set_host("r1");
  *r1.add_held_copies() = f.Held(applied_copy, applied);
  *r1.add_held_copies() = f.Held(not_applied_copy, not_applied);
  AcceptHostReport(&f.state, r1);
  // s1's daemon applied one of the two pushes before the restart.
  f.ServerApplied(applied, 12);

  ResolveInDoubt(&f.state, 30);
  const auto at_r1 = f.Drain("r1");
  REQUIRE(at_r1.size() == 2);
  // The applied push's copy: announced again at the replica's next position.
  REQUIRE(at_r1[0].has_expect());
  const v1::ExpectDelivery& again = at_r1[0].expect();
  CHECK(again.transfer_id() == applied_copy);
  CHECK(again.job_id() == 7);
  CHECK(again.server() == "replica:ps");
  CHECK(again.sequence() == 3);
  CHECK_FALSE(again.held());
  CHECK(again.source_transfer_id() == applied);
  REQUIRE(f.state.replicas().HasCopy(applied_copy));
  CHECK(f.state.replicas().FindCopy(applied_copy)->source == applied);
  CHECK(f.state.GetOrAddJob("demo").servers["ps"].replica.in_flight.at(applied_copy) == 2.5);
  // The other: dropped, saying why.
  REQUIRE(at_r1[1].has_cancel());
  CHECK(at_r1[1].cancel().transfer_id() == not_applied_copy);
  CHECK(at_r1[1].cancel().reason().find("did not apply") != std::string::npos);
  CHECK(f.state.restart().HeldAtReplicaCount() == 0);
  // The replica's daemon reporting the copy applied ends it as any copy.
  f.state.EndReplicaCopy(applied_copy, /*applied=*/true, "", 12);
  CHECK(f.state.GetOrAddJob("demo").servers["ps"].replica.applied == 1);
}

TEST_CASE("a kept replica aggregate is delivered again if all its pushes applied") {
  for (bool all_applied : {true, false}) {
    CAPTURE(all_applied);
    Fixture f;
    const uint64_t a = f.OldId(5), b = f.OldId(6), aggregate = f.OldId(15);
    v1::RegisterHostRequest r1;
    r1.set_host("r1");
    v1::HeldCopy held = f.Held(aggregate, 0);
    held.mutable_copy()->add_constituents(a);
    held.mutable_copy()->add_constituents(b);
    *r1.add_held_copies() = held;
    AcceptHostReport(&f.state, r1);
    f.ServerApplied(a, 12);
    if (all_applied) f.ServerApplied(b, 13);  // else s1's daemon did not apply b

    ResolveInDoubt(&f.state, 30);
    const auto at_r1 = f.Drain("r1");
    REQUIRE(at_r1.size() == 1);
    const ReplicaTrack& replica = f.state.GetOrAddJob("demo").servers["ps"].replica;
    if (all_applied) {
      REQUIRE(at_r1[0].has_expect());
      CHECK(at_r1[0].expect().constituents_size() == 2);
      CHECK_FALSE(at_r1[0].expect().held());
      REQUIRE(f.state.replicas().HasCopy(aggregate));
      CHECK(f.state.replicas().FindCopy(aggregate)->Updates() == 2);
      CHECK(replica.missed == 0);
    } else {
      REQUIRE(at_r1[0].has_cancel());
      CHECK(at_r1[0].cancel().transfer_id() == aggregate);
      // a is in the server's model and, with its aggregate gone, never in
      // the replica's.
      CHECK(replica.missed == 1);
      CHECK(replica.missed_norm == Approx(1.25));
    }
    CHECK(f.state.restart().HeldAtReplicaCount() == 0);
  }
}

TEST_CASE("a kept copy waits for its server's host, and for the replica to register again") {
  Fixture f;
  f.state.hosts().Register("s1").alive = false;  // the server's host has not registered yet
  f.state.GetOrAddJob("demo").replica_hosts.clear();  // nor has the replica application
  const uint64_t push = f.OldId(5), copy = f.OldId(15);
  v1::RegisterHostRequest r1;
  r1.set_host("r1");
  *r1.add_held_copies() = f.Held(copy, push);
  AcceptHostReport(&f.state, r1);
  ResolveInDoubt(&f.state, 30);
  CHECK(f.Drain("r1").empty());
  CHECK(f.state.restart().HeldAtReplicaCount() == 1);

  // s1 comes back: it applied the push. The replica is not registered yet.
  f.state.hosts().Register("s1").alive = true;
  f.ServerApplied(push, 3);
  ResolveInDoubt(&f.state, 30);
  CHECK(f.Drain("r1").empty());

  f.state.GetOrAddJob("demo").replica_hosts["ps"] = "r1";
  ResolveInDoubt(&f.state, 30);
  const auto at_r1 = f.Drain("r1");
  REQUIRE(at_r1.size() == 1);
  CHECK(at_r1[0].expect().transfer_id() == copy);
}

TEST_CASE("a kept copy whose replica never registers again is dropped after the wait") {
  Fixture f;
  f.state.GetOrAddJob("demo").replica_hosts.clear();
  const uint64_t push = f.OldId(5), copy = f.OldId(15);
  v1::RegisterHostRequest r1;
  r1.set_host("r1");
  *r1.add_held_copies() = f.Held(copy, push);
  AcceptHostReport(&f.state, r1);
  f.ServerApplied(push, 0);
  ResolveInDoubt(&f.state, 30);
  CHECK(f.Drain("r1").empty());
  f.clock.Advance(31);
  ResolveInDoubt(&f.state, 30);
  const auto at_r1 = f.Drain("r1");
  REQUIRE(at_r1.size() == 1);
  REQUIRE(at_r1[0].has_cancel());
  CHECK(at_r1[0].cancel().transfer_id() == copy);
  CHECK(f.state.restart().HeldAtReplicaCount() == 0);
}

TEST_CASE("a copy dropped while arriving counts against the replica if its push applied") {
  Fixture f;
  const uint64_t applied = f.OldId(5), not_applied = f.OldId(6);
  v1::RegisterHostRequest r1;
  r1.set_host("r1");
  v1::HeldCopy lost = f.Held(f.OldId(15), applied);
  lost.set_incomplete(true);
  *r1.add_held_copies() = lost;
  v1::HeldCopy harmless = f.Held(f.OldId(16), not_applied);
  harmless.set_incomplete(true);
  *r1.add_held_copies() = harmless;
  AcceptHostReport(&f.state, r1);
  f.ServerApplied(applied, 0);
  ResolveInDoubt(&f.state, 30);
  CHECK(f.Drain("r1").empty());  // nothing kept there to deliver or drop
  CHECK(f.state.restart().HeldAtReplicaCount() == 0);
  const ReplicaTrack& replica = f.state.GetOrAddJob("demo").servers["ps"].replica;
  CHECK(replica.missed == 1);
  CHECK(replica.missed_norm == 2.5);
  // A failover now says what the promoted model lacks.
  REQUIRE(FailOverServersOn(&f.state, "s1", "daemon disconnected") == 1);
  REQUIRE(f.state.GetOrAddJob("demo").failovers.size() == 1);
  CHECK(f.state.GetOrAddJob("demo").failovers[0].lost_updates == 1);
  CHECK(f.state.GetOrAddJob("demo").failovers[0].lost_norm == 2.5);
}

// w1's daemon registers again holding applied push `push` for its punted
// replica copy.
v1::RegisterHostRequest HoldingSource(uint64_t push) {
  v1::RegisterHostRequest w1;
  w1.set_host("w1");
  v1::HeldSource* source = w1.add_held_sources();
  source->set_transfer_id(push);
  source->set_job("demo");
  source->set_server("ps");
  source->set_worker("w1");
  source->set_bytes(64);
  source->set_version(9);
  source->set_norm(1.5);
  return w1;
}

TEST_CASE("a punted copy its source held across the restart is planned again, once") {
  Fixture f;
  f.state.GetOrAddJob("demo").replica_hosts.clear();  // the replica has not registered yet
  const uint64_t push = f.OldId(5);
  AcceptHostReport(&f.state, HoldingSource(push));
  ResolveInDoubt(&f.state, 30);
  ReplicaTrack& replica = f.state.GetOrAddJob("demo").servers["ps"].replica;
  CHECK(replica.pending.empty());
  CHECK(f.state.restart().HeldAtSourceCount() == 1);

  f.state.GetOrAddJob("demo").replica_hosts["ps"] = "r1";
  ResolveInDoubt(&f.state, 30);
  REQUIRE(replica.pending.size() == 1);
  CHECK(replica.pending[0].id == push);
  CHECK(replica.pending[0].src_host == "w1");
  CHECK(replica.pending[0].bytes == 64);
  CHECK(replica.pending[0].norm == 1.5);
  CHECK(f.state.restart().HeldAtSourceCount() == 0);
  CHECK(f.state.stats.held_sources_recopied == 1);
  CHECK(f.Drain("w1").empty());  // the source keeps the bytes for the copy

  // Its stream breaks again while this scheduler lives: it reports the same
  // push, which is already pending here, so no second copy.
  AcceptHostReport(&f.state, HoldingSource(push));
  ResolveInDoubt(&f.state, 30);
  CHECK(replica.pending.size() == 1);
  CHECK(f.state.stats.held_sources_recopied == 1);
}

TEST_CASE("a punted copy held at its source is released if the server has no replica") {
  Fixture f;
  f.state.GetOrAddJob("demo").replica_hosts.clear();
  const uint64_t push = f.OldId(5);
  AcceptHostReport(&f.state, HoldingSource(push));
  ResolveInDoubt(&f.state, 30);
  CHECK(f.Drain("w1").empty());
  f.clock.Advance(31);
  ResolveInDoubt(&f.state, 30);
  const auto at_w1 = f.Drain("w1");
  REQUIRE(at_w1.size() == 1);
  REQUIRE(at_w1[0].has_cancel());
  CHECK(at_w1[0].cancel().release_hold());
  CHECK(at_w1[0].cancel().transfer_id() == push);
  CHECK(at_w1[0].cancel().reason().find("no registered replica") != std::string::npos);
  CHECK(f.state.restart().HeldAtSourceCount() == 0);
  const ReplicaTrack& replica = f.state.GetOrAddJob("demo").servers["ps"].replica;
  CHECK(replica.pending.empty());
  CHECK(replica.missed == 1);
  CHECK(replica.missed_norm == 1.5);
}

// w1's daemon registers again with push `push` in doubt.
v1::RegisterHostRequest Doubting(uint64_t push) {
  v1::RegisterHostRequest w1;
  w1.set_host("w1");
  v1::InDoubtPush* doubt = w1.add_in_doubt();
  doubt->set_transfer_id(push);
  doubt->set_local_id(4);
  doubt->set_job("demo");
  doubt->set_server("ps");
  doubt->set_worker("w1");
  doubt->set_bytes(64);
  doubt->set_version(8);
  doubt->set_norm(0.5);
  return w1;
}

TEST_CASE("a push in doubt that applied is held at its source until its replica has a copy") {
  Fixture f;
  const uint64_t copied = f.OldId(5), missing = f.OldId(6), arriving = f.OldId(7);
  AcceptHostReport(&f.state, Doubting(copied));
  AcceptHostReport(&f.state, Doubting(missing));
  AcceptHostReport(&f.state, Doubting(arriving));
  // r1's replica applied the copy of `copied`; the copy of `arriving` was
  // still arriving there; `missing`'s never left (punted).
  v1::RegisterHostRequest r1;
  r1.set_host("r1");
  v1::AppliedPush* has = r1.add_replica_applied();
  has->set_transfer_id(copied);
  v1::HeldCopy lost = f.Held(f.OldId(17), arriving);
  lost.set_incomplete(true);
  *r1.add_held_copies() = lost;
  AcceptHostReport(&f.state, r1);
  f.ServerApplied(copied, 1);
  f.ServerApplied(missing, 2);
  f.ServerApplied(arriving, 3);
  ResolveInDoubt(&f.state, 30);

  std::map<uint64_t, bool> held, released;
  for (const v1::DaemonCommand& c : f.Drain("w1")) {
    if (c.has_outcome()) {
      CHECK(c.outcome().outcome() == v1::OUTCOME_APPLIED);
      held[c.outcome().transfer_id()] = c.outcome().hold_for_replica();
    }
    if (c.has_cancel() && c.cancel().release_hold()) released[c.cancel().transfer_id()] = true;
  }
  CHECK(held.size() == 3);
  CHECK(held[copied]);
  CHECK(released.size() == 1);
  CHECK(released[copied]);  // the replica has it
  const ReplicaTrack& replica = f.state.GetOrAddJob("demo").servers["ps"].replica;
  REQUIRE(replica.pending.size() == 2);  // copied again from w1, in order
  CHECK(replica.pending[0].id == missing);
  CHECK(replica.pending[1].id == arriving);
  CHECK(replica.pending[0].src_host == "w1");
  CHECK(replica.pending[0].bytes == 64);
  CHECK(replica.pending[0].version == 8);
  CHECK(replica.pending[0].norm == 0.5);
  // The copy that was arriving is sent again, so it is not counted lost.
  CHECK(f.state.restart().HeldAtReplicaCount() == 0);
  CHECK(replica.missed == 0);
  CHECK(f.state.restart().HeldAtSourceCount() == 0);
}

TEST_CASE("a push in doubt that applied, with no replica, is released after the wait") {
  Fixture f;
  f.state.GetOrAddJob("demo").replica_hosts.clear();
  const uint64_t push = f.OldId(5);
  AcceptHostReport(&f.state, Doubting(push));
  f.ServerApplied(push, 1);
  ResolveInDoubt(&f.state, 30);
  auto at_w1 = f.Drain("w1");
  REQUIRE(at_w1.size() == 1);
  CHECK(at_w1[0].outcome().hold_for_replica());
  f.clock.Advance(31);
  ResolveInDoubt(&f.state, 30);
  at_w1 = f.Drain("w1");
  REQUIRE(at_w1.size() == 1);
  CHECK(at_w1[0].cancel().release_hold());
  // No replica was known: nothing counted against one.
  CHECK(f.state.GetOrAddJob("demo").servers["ps"].replica.missed == 0);
}

TEST_CASE("an outcome told again keeps its hold for the replica copy") {
  Fixture f;
  UpdateRecord record;
  record.transfer_id = f.state.NewTransferId();
  record.local_id = 4;
  record.job = "demo";
  record.server = "ps";
  record.src_host = "w1";
  record.worker = "w1";
  record.bytes = 64;
  record.replica_punted = true;  // its copy comes in a later batch
  f.state.AddPush(record);
  f.state.Complete(record.transfer_id, v1::OUTCOME_APPLIED, "", 5);
  auto at_w1 = f.Drain("w1");
  REQUIRE(at_w1.size() == 1);
  CHECK(at_w1[0].outcome().hold_for_replica());
  f.state.TakePush(record.transfer_id);

  // w1's stream broke before it heard: it registers with the push in doubt.
  v1::RegisterHostRequest w1;
  w1.set_host("w1");
  v1::InDoubtPush* doubt = w1.add_in_doubt();
  doubt->set_transfer_id(record.transfer_id);
  doubt->set_local_id(4);
  doubt->set_job("demo");
  doubt->set_server("ps");
  AcceptHostReport(&f.state, w1);
  ResolveInDoubt(&f.state, 30);
  at_w1 = f.Drain("w1");
  REQUIRE(at_w1.size() == 1);
  CHECK(at_w1[0].outcome().outcome() == v1::OUTCOME_APPLIED);
  CHECK(at_w1[0].outcome().applied_version() == 5);
  CHECK(at_w1[0].outcome().hold_for_replica());  // else w1 frees the bytes the copy needs
}

// Group "g" of job demo: shard g0 on s1, shard g1 on r1.
void AddGroup(Fixture* f) {
  JobState& job = f->state.GetOrAddJob("demo");
  ServerState& group = job.servers["g"];
  group.host = "s1";
  group.shards = {{"g0", 0, 32}, {"g1", 32, 64}};
  job.servers["g0"].host = "s1";
  job.servers["g0"].group = "g";
  job.servers["g1"].host = "r1";
  job.servers["g1"].group = "g";
}

// A group push's part at shard g0 as s1's daemon kept it.
v1::HeldCopy KeptPart(uint64_t part, uint64_t push) {
  v1::HeldCopy kept;
  kept.set_job("demo");
  v1::ExpectDelivery* e = kept.mutable_copy();
  e->set_transfer_id(part);
  e->set_job_id(3);
  e->set_server("g0");
  e->set_sequence(12);
  e->set_bytes(32);
  e->set_src_host("w1");
  e->set_group_push(push);
  return kept;
}

// w1 registers with push `push` to group g in doubt.
void DoubtToGroup(Fixture* f, uint64_t push) {
  v1::RegisterHostRequest w1;
  w1.set_host("w1");
  v1::InDoubtPush* doubt = w1.add_in_doubt();
  doubt->set_transfer_id(push);
  doubt->set_job("demo");
  doubt->set_server("g");
  AcceptHostReport(&f->state, w1);
}

// s1 registers having kept `push`'s part `part` for shard g0.
void KeepAtShard(Fixture* f, uint64_t part, uint64_t push) {
  v1::RegisterHostRequest s1;
  s1.set_host("s1");
  *s1.add_held_copies() = KeptPart(part, push);
  AcceptHostReport(&f->state, s1);
}

// r1 registers having applied `push` at shard g1 as `version`.
void ShardAppliedAtR1(Fixture* f, uint64_t push, int64_t version) {
  v1::RegisterHostRequest r1;
  r1.set_host("r1");
  v1::AppliedPush* applied = r1.add_applied();
  applied->set_transfer_id(push);
  applied->set_model_version(version);
  applied->set_acknowledged(true);
  AcceptHostReport(&f->state, r1);
}

TEST_CASE("a group part kept at a shard is delivered there if another shard applied its push") {
  Fixture f;
  AddGroup(&f);
  const uint64_t push = f.OldId(5), part = f.OldId(25);
  DoubtToGroup(&f, push);
  // s1 (shard g0, also the group's host) kept the part: the release that
  // r1 had reached it too late. r1 is not back yet: nothing is decided.
  f.state.hosts().Register("r1").alive = false;
  KeepAtShard(&f, part, push);
  ResolveInDoubt(&f.state, 30);
  CHECK(f.Drain("w1").empty());
  CHECK(f.Drain("s1").empty());

  // r1 comes back: shard g1 applied the push.
  f.state.hosts().Register("r1").alive = true;
  ShardAppliedAtR1(&f, push, 7);
  ResolveInDoubt(&f.state, 30);
  const auto at_w1 = f.Drain("w1");
  REQUIRE(at_w1.size() == 1);
  CHECK(at_w1[0].outcome().outcome() == v1::OUTCOME_APPLIED);
  // g0 gets its part at the group's next position; g1 skips that position.
  const auto at_s1 = f.Drain("s1");
  REQUIRE(at_s1.size() == 1);
  CHECK(at_s1[0].expect().transfer_id() == part);
  CHECK(at_s1[0].expect().server() == "g0");
  CHECK(at_s1[0].expect().sequence() == 1);
  CHECK(at_s1[0].expect().job_id() == 7);
  CHECK(!at_s1[0].expect().held());
  const auto at_r1 = f.Drain("r1");
  REQUIRE(at_r1.size() == 2);
  CHECK(at_r1[0].expect().server() == "g1");
  CHECK(at_r1[0].expect().sequence() == 1);
  CHECK(at_r1[1].cancel().transfer_id() == at_r1[0].expect().transfer_id());
  CHECK(at_r1[1].cancel().sequence() == 1);
  CHECK(f.state.GetOrAddJob("demo").servers["g"].next_sequence == 2);
  CHECK(f.state.restart().HeldAtReplicaCount() == 0);
}

TEST_CASE("a group part kept at a shard is dropped when no shard applied its push") {
  Fixture f;
  AddGroup(&f);
  const uint64_t push = f.OldId(5), part = f.OldId(25);
  DoubtToGroup(&f, push);
  KeepAtShard(&f, part, push);
  v1::RegisterHostRequest r1;
  r1.set_host("r1");
  AcceptHostReport(&f.state, r1);
  ResolveInDoubt(&f.state, 30);  // every shard is back, none applied it
  const auto at_w1 = f.Drain("w1");
  REQUIRE(at_w1.size() == 1);
  CHECK(at_w1[0].outcome().outcome() == v1::OUTCOME_FAILED);
  const auto at_s1 = f.Drain("s1");
  REQUIRE(at_s1.size() == 1);
  CHECK(at_s1[0].cancel().transfer_id() == part);
  CHECK(f.Drain("r1").empty());
  CHECK(f.state.GetOrAddJob("demo").servers["g"].next_sequence == 1);
}

TEST_CASE("a shard that registers after a group part was caught up skips that position then") {
  Fixture f;
  AddGroup(&f);
  // A third shard, g2 on w1, has not registered with this scheduler yet.
  JobState& job = f.state.GetOrAddJob("demo");
  job.servers["g"].shards.push_back({"", 64, 96});
  const uint64_t push = f.OldId(5), part = f.OldId(25);
  DoubtToGroup(&f, push);
  KeepAtShard(&f, part, push);
  ShardAppliedAtR1(&f, push, 7);
  ResolveInDoubt(&f.state, 30);
  REQUIRE(f.Drain("s1").size() == 1);  // g0's part at position 1
  REQUIRE(f.Drain("r1").size() == 2);  // g1 skips it
  CHECK(f.Drain("w1").size() == 1);    // the push's outcome, nothing for g2
  REQUIRE(job.servers["g"].shards[2].owed_skips.size() == 1);

  // g2 registers: its daemon is told to pass position 1 as well, once.
  v1::RegisterEntityRequest g2;
  g2.set_job("demo");
  g2.set_name("g2");
  g2.set_host("w1");
  g2.mutable_shard()->set_group("g");
  g2.mutable_shard()->set_index(2);
  g2.mutable_shard()->set_count(3);
  g2.mutable_shard()->set_begin(64);
  g2.mutable_shard()->set_end(96);
  REQUIRE(RegisterShard(&f.state, &job, g2).ok());
  const auto at_w1 = f.Drain("w1");
  REQUIRE(at_w1.size() == 2);
  CHECK(at_w1[0].expect().server() == "g2");
  CHECK(at_w1[0].expect().sequence() == 1);
  CHECK(at_w1[0].expect().job_id() == 7);
  CHECK(at_w1[1].cancel().transfer_id() == at_w1[0].expect().transfer_id());
  CHECK(at_w1[1].cancel().sequence() == 1);
  CHECK_THAT(at_w1[1].cancel().reason(), Catch::Contains("catches up on group push"));
  CHECK(job.servers["g"].shards[2].owed_skips.empty());
  REQUIRE(RegisterShard(&f.state, &job, g2).ok());  // registering again owes nothing
  CHECK(f.Drain("w1").empty());
}

}  // namespace
}  // namespace mlfabric
