// The replica's side of a batch: what the planner is given to keep the
// server's and the replica's models within the divergence bound.
#include "scheduler/service/replica_tracker.h"

#include <catch2/catch.hpp>

#include "scheduler/service/cluster_state_fixture.h"

namespace mlfabric {
namespace {

struct Fixture : ClusterStateFixture {
  Fixture() : ClusterStateFixture({"s1", "r1", "w1"}) {
    JobState& job = state.GetOrAddJob("demo");
    job.config.name = "demo";
    job.config.divergence_max = 100;
    job.servers["ps"].host = "s1";
    job.replica_hosts["ps"] = "r1";
  }

  uint64_t Update(double norm, bool punted, bool ahead, const std::string& server = "ps") {
    UpdateRecord record;
    record.transfer_id = state.NewTransferId();
    record.job = "demo";
    record.server = server;
    record.src_host = "w1";
    record.norm = norm;
    record.replica_punted = punted;
    record.replica_ahead = ahead;
    state.AddPush(record);
    return record.transfer_id;
  }

  double Budget() {
    JobState& job = state.GetOrAddJob("demo");
    auto spec = ReplicaSpecFor(&state, job, "ps", &job.servers["ps"]);
    REQUIRE(spec.has_value());
    return spec->divergence_bound;
  }
};

TEST_CASE("the batch gets the bound less what stays outstanding through it") {
  Fixture f;
  CHECK(f.Budget() == 100);
  f.Update(10, /*punted=*/false, /*ahead=*/false);  // both copies in this or a later stream
  f.Update(25, /*punted=*/false, /*ahead=*/false, "other");  // another server's
  CHECK(OutstandingNorm(f.state, "demo", "ps") == 0);
  CHECK(f.Budget() == 100);

  // Punted while the server's outcome is still to come: the server may
  // hold it at any moment, the replica not before a later batch.
  f.Update(30, /*punted=*/true, /*ahead=*/false);
  CHECK(OutstandingNorm(f.state, "demo", "ps") == 30);
  CHECK(f.Budget() == 70);
  // Applied at the replica first: the replica holds it, the server not yet.
  f.Update(20, /*punted=*/false, /*ahead=*/true);
  CHECK(f.Budget() == 50);

  // With momentum an update's effect grows, up to 1 / (1 - gamma).
  f.state.GetOrAddJob("demo").config.momentum = 0.5;
  CHECK(f.Budget() == 0);  // 100 - 2 x 50, never below zero
  f.state.GetOrAddJob("demo").config.momentum = 0;
  f.Update(60, /*punted=*/true, /*ahead=*/false);
  CHECK(f.Budget() == 0);

  // No bound: copies go as they can, whatever is outstanding.
  f.state.GetOrAddJob("demo").config.divergence_max = 0;
  CHECK(f.Budget() > 1e29);
}

TEST_CASE("strict bound: pushes are planned only while the replica has room for them") {
  Fixture f;
  JobState& job = f.state.GetOrAddJob("demo");
  ServerState& server = job.servers["ps"];
  auto push = [&](double norm) {
    server.pending.push_back(f.Update(norm, /*punted=*/false, /*ahead=*/false));
  };
  push(40);
  push(40);
  push(40);
  // Nothing outstanding: 40 + 40 fit within 100, the third waits.
  CHECK(StrictReplicaAdmits(f.state, job, "ps", server) == 2);

  // Copies the replica has not applied count until it has.
  server.replica.in_flight[901] = 30;
  CHECK(StrictReplicaAdmits(f.state, job, "ps", server) == 1);
  server.replica.pending.push_back(PendingReplica{902, "w1", "w", 1, 0, 31, v1::DTYPE_FLOAT32});
  CHECK(StrictReplicaAdmits(f.state, job, "ps", server) == 0);
  // The replica applied them: room again, in arrival order.
  server.replica.in_flight.clear();
  server.replica.pending.clear();
  CHECK(StrictReplicaAdmits(f.state, job, "ps", server) == 2);

  // Momentum: each update weighs 1 / (1 - gamma) = 2.
  job.config.momentum = 0.5;
  CHECK(StrictReplicaAdmits(f.state, job, "ps", server) == 1);
  job.config.momentum = 0;

  // A push larger than the bound alone still moves when nothing is
  // outstanding, and only then.
  server.pending.clear();
  push(150);
  push(1);
  CHECK(StrictReplicaAdmits(f.state, job, "ps", server) == 1);
  server.replica.in_flight[903] = 1;
  CHECK(StrictReplicaAdmits(f.state, job, "ps", server) == 0);
  server.replica.in_flight.clear();

  // No bound, or no live replica on another host: every push.
  job.config.divergence_max = 0;
  CHECK(StrictReplicaAdmits(f.state, job, "ps", server) == 2);
  job.config.divergence_max = 100;
  job.replica_hosts["ps"] = "s1";  // on the server's own host
  CHECK(StrictReplicaAdmits(f.state, job, "ps", server) == 2);
  job.replica_hosts.erase("ps");
  CHECK(StrictReplicaAdmits(f.state, job, "ps", server) == 2);
}

TEST_CASE("the divergence estimate counts copies in flight, punted and outstanding, with momentum") {
  Fixture f;
  JobState& job = f.state.GetOrAddJob("demo");
  ServerState& server = job.servers["ps"];
  CHECK(DivergenceEstimate(f.state, job, "ps", server) == 0);
  server.replica.in_flight[901] = 10;
  server.replica.pending.push_back(PendingReplica{902, "w1", "w", 1, 0, 20, v1::DTYPE_FLOAT32});
  f.Update(30, /*punted=*/true, /*ahead=*/false);
  f.Update(40, /*punted=*/false, /*ahead=*/false);  // its copy may go with it: not counted
  CHECK(DivergenceEstimate(f.state, job, "ps", server) == 60);
  job.config.momentum = 0.5;  // each update's effect up to 1 / (1 - 0.5) = 2 times
  CHECK(DivergenceEstimate(f.state, job, "ps", server) == 120);
}

}  // namespace
}  // namespace mlfabric
