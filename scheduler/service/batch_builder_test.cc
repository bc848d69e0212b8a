#include "scheduler/service/batch_builder.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

BatchInputs Inputs() {
  BatchInputs in;
  in.now_s = 2.0;
  in.tau_max = 10;
  in.model_version = 40;
  in.unapplied = 3;
  in.server_host = "s1";
  in.seed = 7;
  for (int i = 1; i <= 3; ++i) {
    PendingUpdate update;
    update.request = {"u" + std::to_string(i), "w" + std::to_string(i), 1000, 39, 0.5, {}};
    update.element_type = 1;
    in.updates.push_back(update);
  }
  in.aggregator_candidates = {"s1", "w9"};
  in.host_link = [](const std::string& host) {
    return core::HostLink{host, 1e9, 2e9, {}, {}};
  };
  return in;
}

std::vector<std::string> HostNames(const core::Batch& batch) {
  std::vector<std::string> names;
  for (const core::HostLink& link : batch.hosts) names.push_back(link.name);
  return names;
}

TEST_CASE("v_init counts earlier unapplied updates only in asynchronous batches") {
  CHECK(InitialVersion(core::Mode::kAsync, 40, 3) == 43);
  CHECK(InitialVersion(core::Mode::kSync, 40, 3) == 40);
  CHECK(BuildBatch(Inputs()).v_init == 43);
}

TEST_CASE("summable updates get the candidate aggregators, never the server itself") {
  const core::Batch batch = BuildBatch(Inputs());
  CHECK(batch.aggregators == std::vector<std::string>{"w9"});
  CHECK(HostNames(batch) == std::vector<std::string>{"s1", "w1", "w2", "w3", "w9"});
  REQUIRE(batch.updates.size() == 3);
  CHECK(batch.updates[0].id == "u1");  // arrival order kept
  CHECK(batch.seed == 7);
  CHECK(batch.hosts[0].downlink_bps == 2e9);
}

TEST_CASE("updates of different types, sizes or rounds are not aggregated") {
  BatchInputs types = Inputs();
  types.updates[1].element_type = 2;
  CHECK(BuildBatch(types).aggregators.empty());
  BatchInputs opaque = Inputs();
  for (PendingUpdate& u : opaque.updates) u.element_type = 0;
  CHECK(BuildBatch(opaque).aggregators.empty());
  BatchInputs sizes = Inputs();
  sizes.updates[2].request.bytes = 999;
  CHECK(BuildBatch(sizes).aggregators.empty());
  BatchInputs rounds = Inputs();
  rounds.updates[0].request.version = 38;
  CHECK(BuildBatch(rounds).aggregators.size() == 1);  // asynchronous: versions may differ
  rounds.synchronous_round = true;
  CHECK(BuildBatch(rounds).aggregators.empty());
  // Unused aggregators are not part of the network view either.
  CHECK(HostNames(BuildBatch(sizes)) == std::vector<std::string>{"s1", "w1", "w2", "w3"});
}

TEST_CASE("the replica and the sources of its punted copies are in the network view") {
  BatchInputs in = Inputs();
  core::ReplicaSpec spec;
  spec.host = "r1";
  spec.pending.push_back({"old", "w7", 1000, 30, 0.1, {}});
  in.replica = spec;
  const core::Batch batch = BuildBatch(in);
  REQUIRE(batch.replica.has_value());
  CHECK(HostNames(batch) == std::vector<std::string>{"r1", "s1", "w1", "w2", "w3", "w7", "w9"});
}

}  // namespace
}  // namespace mlfabric
