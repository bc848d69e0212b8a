// A new replica's snapshot (replica_sync.h) on a ClusterState with a
// FakeClock, the commands read back as the daemons would.
#include "scheduler/service/replica_sync.h"

#include <catch2/catch.hpp>

#include "scheduler/service/cluster_state_fixture.h"
#include "scheduler/service/failover.h"

namespace mlfabric {
namespace {

struct Fixture : ClusterStateFixture {
  Fixture() : ClusterStateFixture({"s1", "r1", "w1"}) {
    JobState& job = state.GetOrAddJob("demo");
    job.id = 7;
    job.config.name = "demo";
    ServerState& server = job.servers["ps"];
    server.host = "s1";
    server.model_version = 12;
    server.next_sequence = 15;  // positions 1..14 assigned, none copied
    job.replica_hosts["ps"] = "r1";
    server.replica.snapshot_wanted = true;  // as RegisterEntity sets it
    server.replica.synced = false;
  }
  ServerState& server() { return state.GetOrAddJob("demo").servers["ps"]; }
};

TEST_CASE("the snapshot is cut after the last position assigned, first at the replica") {
  Fixture f;
  SendReplicaSnapshots(&f.state);
  const std::vector<v1::DaemonCommand> at_server = f.Drain("s1");
  const std::vector<v1::DaemonCommand> at_replica = f.Drain("r1");
  REQUIRE(at_server.size() == 1);
  REQUIRE(at_server[0].has_snapshot());
  const v1::SnapshotToReplica& take = at_server[0].snapshot();
  CHECK(take.after_sequence() == 14);
  CHECK(take.server() == "ps");
  CHECK(take.job_id() == 7);
  CHECK(take.dst_host() == "r1");
  CHECK(take.dst_address() == "r1:1");
  REQUIRE(at_replica.size() == 1);
  REQUIRE(at_replica[0].has_expect());
  const v1::ExpectDelivery& expect = at_replica[0].expect();
  CHECK(expect.transfer_id() == take.transfer_id());
  CHECK(expect.server() == "replica:ps");
  CHECK(expect.sequence() == 1);  // before every copy
  CHECK(expect.snapshot());
  CHECK(f.server().replica.next_sequence == 2);
  CHECK_FALSE(f.server().replica.snapshot_wanted);
  CHECK_FALSE(f.server().replica.synced);
  // Sent once.
  SendReplicaSnapshots(&f.state);
  CHECK(f.Drain("s1").empty());
}

TEST_CASE("copies punted for an earlier replica do not follow the snapshot") {
  Fixture f;
  // Applied at the server (up to the cut), its copy punted for the replica
  // before; and one in flight whose copy was punted.
  f.server().replica.pending.push_back({301, "w1", "w1", 64, 0, 1.0, v1::DTYPE_FLOAT32});
  UpdateRecord& in_flight = f.AddPush("w1");
  in_flight.replica_punted = true;
  HeldAtSource held;
  held.job = "demo";
  held.server = "ps";
  held.copy.src_host = "w1";
  f.state.restart().HoldAtSource(302, held);
  SendReplicaSnapshots(&f.state);
  CHECK(f.server().replica.pending.empty());
  CHECK_FALSE(in_flight.replica_punted);
  CHECK(f.state.restart().HeldAtSourceCount() == 0);
  int released = 0;
  for (const v1::DaemonCommand& command : f.Drain("w1")) {
    if (command.has_cancel() && command.cancel().release_hold()) ++released;
  }
  CHECK(released == 2);  // the sources free the bytes
}

TEST_CASE("installed, the replica is in sync and may be promoted") {
  Fixture f;
  SendReplicaSnapshots(&f.state);
  const uint64_t id = f.server().replica.snapshot_id;
  REQUIRE(id != 0);
  CHECK_FALSE(PromoteReplica(&f.state, "demo", "ps", "s1 is down"));  // not yet
  CHECK(f.server().host == "s1");
  CHECK(ReplicaSnapshotEnded(&f.state, id, /*applied=*/true, 12, ""));
  CHECK(f.server().replica.synced);
  CHECK(f.state.replicas().snapshot_count() == 0);
  CHECK_FALSE(ReplicaSnapshotEnded(&f.state, 999, true, 0, ""));  // no snapshot's
  CHECK(PromoteReplica(&f.state, "demo", "ps", "s1 is down"));
  CHECK(f.server().host == "r1");
}

TEST_CASE("a failed snapshot is skipped at the replica and taken again at a new cut") {
  Fixture f;
  SendReplicaSnapshots(&f.state);
  const uint64_t first = f.server().replica.snapshot_id;
  f.Drain("s1");
  f.Drain("r1");
  f.server().next_sequence = 20;  // more positions assigned meanwhile (copied)
  f.server().replica.next_sequence = 6;
  CHECK(ReplicaSnapshotEnded(&f.state, first, /*applied=*/false, 0, "server refused"));
  CHECK(f.server().replica.snapshot_wanted);
  CHECK_FALSE(f.server().replica.synced);
  const std::vector<v1::DaemonCommand> cancel = f.Drain("r1");
  REQUIRE(cancel.size() == 1);
  CHECK(cancel[0].cancel().transfer_id() == first);
  CHECK(cancel[0].cancel().sequence() == 1);
  SendReplicaSnapshots(&f.state);
  const std::vector<v1::DaemonCommand> again = f.Drain("s1");
  REQUIRE(again.size() == 1);
  CHECK(again[0].snapshot().after_sequence() == 19);
  CHECK(again[0].snapshot().transfer_id() != first);
  CHECK(f.Drain("r1")[0].expect().sequence() == 6);
}

TEST_CASE("no snapshot while a host is down, and none once the replica left") {
  Fixture f;
  f.state.hosts().Register("r1").alive = false;
  SendReplicaSnapshots(&f.state);
  CHECK(f.server().replica.snapshot_wanted);  // later
  f.state.hosts().Register("r1").alive = true;
  f.state.GetOrAddJob("demo").replica_hosts.erase("ps");
  SendReplicaSnapshots(&f.state);
  CHECK_FALSE(f.server().replica.snapshot_wanted);
  CHECK(f.Drain("s1").empty());
  ForgetReplicaSnapshot(&f.state, &f.server());
  CHECK(f.server().replica.synced);
}

TEST_CASE("a replica that installs snapshots gets one when its server registers after it") {
  Fixture f;
  JobState& job = f.state.GetOrAddJob("demo");
  ServerState& server = f.server();
  ForgetReplicaSnapshot(&f.state, &server);
  job.servers.erase("ps");  // the replica registered first: no server yet
  job.snapshot_replicas.insert("ps");
  CHECK_FALSE(WantReplicaSnapshot(&f.state, &job, "ps", /*replica_registered=*/true));
  job.servers["ps"].host = "s1";  // now its server registers
  CHECK(WantReplicaSnapshot(&f.state, &job, "ps", /*replica_registered=*/false));
  CHECK(f.server().replica.snapshot_wanted);
  CHECK_FALSE(f.server().replica.synced);
  SendReplicaSnapshots(&f.state);
  const uint64_t id = f.server().replica.snapshot_id;
  REQUIRE(id != 0);
  // The server registering again while its snapshot is on the way takes no
  // second one; a replica registering again does.
  CHECK_FALSE(WantReplicaSnapshot(&f.state, &job, "ps", false));
  CHECK(f.server().replica.snapshot_id == id);
  CHECK(WantReplicaSnapshot(&f.state, &job, "ps", true));
  CHECK(f.server().replica.snapshot_id == 0);
  CHECK(f.server().replica.snapshot_wanted);
}

TEST_CASE("a replica without snapshots, or none at all, wants none") {
  Fixture f;
  JobState& job = f.state.GetOrAddJob("demo");
  ForgetReplicaSnapshot(&f.state, &f.server());
  CHECK_FALSE(WantReplicaSnapshot(&f.state, &job, "ps", true));   // it installs none
  CHECK_FALSE(WantReplicaSnapshot(&f.state, &job, "ps", false));
  CHECK(f.server().replica.synced);
  job.snapshot_replicas.insert("ps");
  job.replica_hosts.erase("ps");
  CHECK_FALSE(WantReplicaSnapshot(&f.state, &job, "ps", false));  // no replica
  CHECK_FALSE(WantReplicaSnapshot(&f.state, &job, "nobody", false));
  CHECK(f.server().replica.synced);
}

}  // namespace
}  // namespace mlfabric
