// Server groups (server_groups.h) on a ClusterState with the commands read
// back as the daemons would: registration checks, and a group push's parts
// released only when all are in, cancelled at every shard when one fails.
#include "scheduler/service/server_groups.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "scheduler/service/cluster_state_fixture.h"

namespace mlfabric {
namespace {

struct Fixture : ClusterStateFixture {
  Fixture() : ClusterStateFixture({"s1", "s2", "s3", "w1"}) {
    JobState& job = state.jobs["demo"];
    job.id = 3;
    job.config.name = "demo";
  }
  JobState& job() { return state.jobs["demo"]; }

  absl::Status Register(const std::string& name, const std::string& host, int index, int count,
                        int64_t begin, int64_t end, const std::string& group = "ps") {
    v1::RegisterEntityRequest request;
    request.set_name(name);
    request.set_host(host);
    v1::ShardSpec* shard = request.mutable_shard();
    shard->set_group(group);
    shard->set_index(index);
    shard->set_count(count);
    shard->set_begin(begin);
    shard->set_end(end);
    absl::Status status = RegisterShard(&state, &job(), request);
    if (status.ok()) job().servers[name].host = host;  // as RegisterEntity does next
    return status;
  }

  void RegisterAll() {
    REQUIRE(Register("ps-0", "s1", 0, 3, 0, 100).ok());
    REQUIRE(Register("ps-1", "s2", 1, 3, 100, 200).ok());
    REQUIRE(Register("ps-2", "s3", 2, 3, 200, 300).ok());
  }

  // A push of the whole model from w1, dispatched at group sequence 5: one
  // held part per shard, as plan_dispatcher.cc leaves it.
  uint64_t InFlight() {
    UpdateRecord& record = AddPush("w1");
    record.server = "ps";
    record.bytes = 300;
    record.state = UpdateState::kInFlight;
    record.sequence = 5;
    record.planned.deadline_s = 1e9;
    ServerState& group = job().servers["ps"];
    group.pending.clear();
    ++group.in_flight;
    GroupPush& push = state.group_pushes[record.transfer_id];
    for (int i = 0; i < 3; ++i) {
      GroupPart part;
      part.id = state.NewTransferId();
      part.server = "ps-" + std::to_string(i);
      part.host = "s" + std::to_string(i + 1);
      part.begin = 100 * i;
      part.end = 100 * (i + 1);
      state.group_parts[part.id] = record.transfer_id;
      push.parts.push_back(part);
    }
    return record.transfer_id;
  }
  uint64_t Part(uint64_t push, int i) { return state.group_pushes.at(push).parts[i].id; }
};

TEST_CASE("shards register into a group whose ranges must tile the model") {
  Fixture f;
  REQUIRE(f.Register("ps-1", "s2", 1, 3, 100, 200).ok());
  CHECK(GroupIncomplete(f.state, f.job(), f.job().servers["ps"]) ==
        "shard 0 is not registered; shard 2 is not registered");
  // Conflicts name the field and the shard they clash with.
  absl::Status s = f.Register("ps-0", "s1", 0, 3, 0, 120);
  CHECK_THAT(std::string(s.message()), Catch::Contains("shard.end of server 'ps-0'"));
  CHECK_THAT(std::string(s.message()), Catch::Contains("begins at byte 100"));
  s = f.Register("ps-0", "s1", 0, 4, 0, 100);
  CHECK_THAT(std::string(s.message()), Catch::Contains("group 'ps' has 3 shards, this one says 4"));
  s = f.Register("other", "s1", 1, 3, 100, 200);
  CHECK_THAT(std::string(s.message()), Catch::Contains("shard 1 of group 'ps' is 'ps-1' already"));
  s = f.Register("ps-0", "s1", 0, 3, 4, 100);
  CHECK_THAT(std::string(s.message()), Catch::Contains("shard 0 must begin at byte 0"));
  s = f.Register("ps-0", "s1", 3, 3, 0, 100);
  CHECK_THAT(std::string(s.message()), Catch::Contains("shard.index"));
  s = f.Register("ps-0", "s1", 0, 3, 0, 0);
  CHECK_THAT(std::string(s.message()), Catch::Contains("not a non-empty byte range"));
  s = f.Register("ps", "s1", 0, 3, 0, 100);
  CHECK_THAT(std::string(s.message()), Catch::Contains("must differ from the shard's own name"));
  f.job().servers["plain"].host = "s1";
  s = f.Register("p-0", "s1", 0, 1, 0, 100, "plain");
  CHECK_THAT(std::string(s.message()), Catch::Contains("not a server group"));

  REQUIRE(f.Register("ps-0", "s1", 0, 3, 0, 100).ok());
  REQUIRE(f.Register("ps-2", "s3", 2, 3, 200, 300).ok());
  const ServerState& group = f.job().servers["ps"];
  CHECK(GroupIncomplete(f.state, f.job(), group).empty());
  CHECK(GroupBytes(group) == 300);
  CHECK(group.host == "s1");  // shard 0's
  CHECK(f.job().servers["ps-2"].group == "ps");
  f.state.hosts["s3"].alive = false;
  CHECK(GroupIncomplete(f.state, f.job(), group) == "shard 2 ('ps-2') is down");
}

TEST_CASE("a group push is released when every part is in, applied when every shard applied") {
  Fixture f;
  f.RegisterAll();
  const uint64_t push = f.InFlight();
  GroupPartReady(&f.state, f.Part(push, 0));
  GroupPartReady(&f.state, f.Part(push, 2));
  for (const char* host : {"s1", "s2", "s3"}) CHECK(f.Drain(host).empty());  // not yet
  GroupPartReady(&f.state, f.Part(push, 1));
  for (int i = 0; i < 3; ++i) {
    const std::vector<v1::DaemonCommand> commands = f.Drain("s" + std::to_string(i + 1));
    REQUIRE(commands.size() == 1);
    CHECK(commands[0].release().transfer_id() == f.Part(push, i));
    CHECK(commands[0].release().sequence() == 5);
  }
  GroupPartEnded(&f.state, f.Part(push, 0), true, 5, "");
  GroupPartEnded(&f.state, f.Part(push, 1), true, 5, "");
  CHECK(f.Drain("w1").empty());  // one shard still to apply it
  GroupPartEnded(&f.state, f.Part(push, 2), true, 5, "");
  const std::vector<v1::DaemonCommand> outcome = f.Drain("w1");
  REQUIRE(outcome.size() == 1);
  CHECK(outcome[0].outcome().outcome() == v1::OUTCOME_APPLIED);
  CHECK(outcome[0].outcome().applied_version() == 5);
  CHECK(f.job().servers["ps"].model_version == 5);
  CHECK(f.job().servers["ps-1"].model_version == 5);
  CHECK(f.state.group_pushes.empty());
  CHECK(f.state.group_parts.empty());
}

TEST_CASE("a part that fails before the release fails the push at every shard") {
  Fixture f;
  f.RegisterAll();
  const uint64_t push = f.InFlight();
  GroupPartReady(&f.state, f.Part(push, 0));
  const std::vector<uint64_t> parts = {f.Part(push, 0), f.Part(push, 1), f.Part(push, 2)};
  GroupPartEnded(&f.state, parts[2], false, 0, "connection reset by peer");
  const std::vector<v1::DaemonCommand> outcome = f.Drain("w1");
  REQUIRE(outcome.size() == 1);
  CHECK(outcome[0].outcome().outcome() == v1::OUTCOME_FAILED);
  CHECK_THAT(outcome[0].outcome().reason(),
             Catch::Contains("part 2 (bytes [200, 300) to shard 'ps-2' on s3)"));
  CHECK_THAT(outcome[0].outcome().reason(), Catch::Contains("no shard applied the push"));
  for (int i = 0; i < 3; ++i) {
    const std::vector<v1::DaemonCommand> commands = f.Drain("s" + std::to_string(i + 1));
    REQUIRE(commands.size() == 1);  // skip the held position, never release it
    CHECK(commands[0].cancel().transfer_id() == parts[i]);
    CHECK(commands[0].cancel().sequence() == 5);
    CHECK(commands[0].cancel().server() == "ps-" + std::to_string(i));
  }
  CHECK(f.state.group_parts.empty());
  // A late ready report of a part of the failed push changes nothing.
  GroupPartReady(&f.state, parts[1]);
  CHECK(f.Drain("s2").empty());
}

TEST_CASE("a shard host going down fails its unreleased pushes; a released one outlives its source") {
  Fixture f;
  f.RegisterAll();
  const uint64_t held = f.InFlight();
  f.state.MarkHostDown("s2", "daemon disconnected");
  std::vector<v1::DaemonCommand> outcome = f.Drain("w1");
  REQUIRE(outcome.size() == 1);
  CHECK(outcome[0].outcome().transfer_id() == held);
  CHECK(outcome[0].outcome().outcome() == v1::OUTCOME_FAILED);
  CHECK_THAT(outcome[0].outcome().reason(), Catch::Contains("server host s2 is down"));
  CHECK(f.Drain("s1").size() == 1);  // cancelled there
  CHECK(f.Drain("s3").size() == 1);

  Fixture g;
  g.RegisterAll();
  const uint64_t released = g.InFlight();
  for (int i = 0; i < 3; ++i) GroupPartReady(&g.state, g.Part(released, i));
  g.state.MarkHostDown("w1", "daemon disconnected");
  CHECK(g.state.updates.count(released) == 1);  // every part is at its shard already
  for (int i = 0; i < 3; ++i) GroupPartEnded(&g.state, g.Part(released, i), true, 5, "");
  CHECK(g.state.updates.count(released) == 0);
  CHECK(g.job().servers["ps"].model_version == 5);
}

}  // namespace
}  // namespace mlfabric
