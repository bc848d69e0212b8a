// Server groups (server_groups.h) on a ClusterState with the commands read
// back as the daemons would: registration checks, and a group push's parts
// released only when all are in, cancelled at every shard when one fails.
#include "scheduler/service/server_groups.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "scheduler/service/cluster_state_fixture.h"
#include "scheduler/service/plan_dispatcher.h"

namespace mlfabric {
namespace {

struct Fixture : ClusterStateFixture {
  Fixture() : ClusterStateFixture({"s1", "s2", "s3", "w1", "w2", "a1"}) {
    JobState& job = state.GetOrAddJob("demo");
    job.id = 3;
    job.config.name = "demo";
  }
  JobState& job() { return state.GetOrAddJob("demo"); }

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
    for (int i = 0; i < 3; ++i) {
      GroupPart part;
      part.id = state.NewTransferId();
      part.server = "ps-" + std::to_string(i);
      part.host = "s" + std::to_string(i + 1);
      part.begin = 100 * i;
      part.end = 100 * (i + 1);
      state.groups().AddPart(record.transfer_id, part);
    }
    return record.transfer_id;
  }
  uint64_t Part(uint64_t push, int i) { return state.groups().Find(push)->parts.at(i).id; }
};

TEST_CASE("a group has 1 to kMaxShards shards") {
  Fixture f;
  CHECK(f.Register("ps-0", "s1", 0, kMaxShards, 0, 100).ok());
  const absl::Status s = f.Register("qs-0", "s1", 0, kMaxShards + 1, 0, 100, "qs");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("must be in [1, 128], got 129"));
  CHECK(f.Register("rs-0", "s1", 0, 0, 0, 100, "rs").code() ==
        absl::StatusCode::kInvalidArgument);
}

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
  f.state.hosts().Register("s3").alive = false;
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
  CHECK(f.state.groups().empty());
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
  CHECK(f.state.groups().empty());
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
  CHECK(g.state.pushes().count(released) == 1);  // every part is at its shard already
  for (int i = 0; i < 3; ++i) GroupPartEnded(&g.state, g.Part(released, i), true, 5, "");
  CHECK(g.state.pushes().count(released) == 0);
  CHECK(g.job().servers["ps"].model_version == 5);
}

// A group batch of pushes from w1 and w2 (300 bytes each) planned as one
// aggregate at a1 (core: every part of each push to a1, then one sum per
// shard), dispatched as plan_dispatcher does.
struct AggregateFixture : Fixture {
  uint64_t u1 = 0, u2 = 0;
  AggregateFixture() {
    RegisterAll();
    job().config.aggregators = {"a1"};
    for (const char* src : {"w1", "w2"}) {
      UpdateRecord& record = AddPush(src, 4);
      record.bytes = 300;
      (u1 == 0 ? u1 : u2) = record.transfer_id;
    }
    core::Plan plan;
    plan.order = {std::to_string(u1), std::to_string(u2)};
    auto transfer = [](const std::string& update, const std::string& src,
                       const std::string& dst, core::TransferKind kind) {
      core::Transfer t;
      t.update = update;
      t.src = src;
      t.dst = dst;
      t.kind = kind;
      t.bytes = 100;
      t.start_s = 100;
      t.end_s = 101;
      t.segments = {{100, 101, 800}};
      return t;
    };
    for (uint64_t u : {u1, u2}) {
      for (int part = 0; part < 3; ++part) {
        plan.transfers.push_back(transfer(std::to_string(u), u == u1 ? "w1" : "w2", "a1",
                                          core::TransferKind::kToAggregator));
      }
    }
    for (int shard = 0; shard < 3; ++shard) {
      core::Transfer sum = transfer("agg:" + std::to_string(shard + 1), "a1",
                                    "s" + std::to_string(shard + 1), core::TransferKind::kAggregate);
      sum.constituents = plan.order;
      plan.transfers.push_back(sum);
    }
    BatchWork work;
    work.job = "demo";
    work.server = "ps";
    work.batch.server = "s1";
    work.plan = plan;
    PlanDispatcher(config, &state, &history).Apply(work, "mlfabric");
  }
  uint64_t Group() const {
    REQUIRE(state.groups().size() == 1);
    uint64_t group = 0;
    state.groups().ForEach([&](uint64_t id, const GroupPush&) { group = id; });
    return group;
  }
  const GroupPush& Sums() const { return *state.groups().Find(Group()); }
};

TEST_CASE("a group aggregate: one sum per shard, held under one position, its pushes applied") {
  AggregateFixture f;
  const uint64_t group = f.Group();
  const GroupPush& sums = f.Sums();
  CHECK(sums.constituents == std::vector<uint64_t>{f.u1, f.u2});
  CHECK(sums.aggregator == "a1");
  REQUIRE(sums.parts.size() == 3);
  CHECK(sums.feeds.size() == 6);
  CHECK(f.state.pushes().at(f.u1).aggregate_id == group);
  // Each shard holds its sum at the group's position, as an aggregate of 2.
  for (int i = 0; i < 3; ++i) {
    const std::vector<v1::DaemonCommand> at_shard = f.Drain("s" + std::to_string(i + 1));
    REQUIRE(at_shard.size() == 1);
    const v1::ExpectDelivery& expect = at_shard[0].expect();
    CHECK(expect.transfer_id() == sums.parts[i].id);
    CHECK(expect.server() == "ps-" + std::to_string(i));
    CHECK(expect.sequence() == sums.sequence);
    CHECK(expect.held());
    CHECK(expect.group_push() == group);
    CHECK(expect.constituents_size() == 2);  // handed over as count 2
    CHECK(expect.bytes() == 100);
  }
  // The aggregator sums each shard's parts and sends the sum to the shard.
  const std::vector<v1::DaemonCommand> at_aggregator = f.Drain("a1");
  REQUIRE(at_aggregator.size() == 3);
  for (int i = 0; i < 3; ++i) {
    const v1::AggregateTask& task = at_aggregator[i].aggregate();
    CHECK(task.aggregate_id() == sums.parts[i].id);
    CHECK(task.dst_host() == "s" + std::to_string(i + 1));
    CHECK(task.constituents_size() == 2);
    CHECK(task.bytes() == 100);
  }
  // Each source sends its push's three slices to the aggregator.
  for (const char* src : {"w1", "w2"}) {
    const std::vector<v1::DaemonCommand> sends = f.Drain(src);
    REQUIRE(sends.size() == 3);
    for (int i = 0; i < 3; ++i) {
      CHECK(sends[i].send().dst_host() == "a1");
      CHECK(sends[i].send().part());
      CHECK(sends[i].send().part_offset() == 100 * i);
      CHECK(sends[i].send().bytes() == 100);
      CHECK(at_aggregator[i].aggregate().constituents(src == std::string("w1") ? 0 : 1) ==
            sends[i].send().transfer_id());
    }
  }
  const std::vector<uint64_t> parts = {sums.parts[0].id, sums.parts[1].id, sums.parts[2].id};
  const uint64_t sequence = sums.sequence;
  GroupPartReady(&f.state, parts[0]);
  GroupPartReady(&f.state, parts[1]);
  CHECK(f.Drain("s1").empty());
  GroupPartReady(&f.state, parts[2]);
  for (int i = 0; i < 3; ++i) {
    const std::vector<v1::DaemonCommand> release = f.Drain("s" + std::to_string(i + 1));
    REQUIRE(release.size() == 1);
    CHECK(release[0].release().transfer_id() == parts[i]);
    CHECK(release[0].release().sequence() == sequence);
  }
  for (uint64_t part : parts) GroupPartEnded(&f.state, part, true, 6, "");
  // Applied as consecutive versions ending at the shards' (5 then 6).
  const std::vector<v1::DaemonCommand> first = f.Drain("w1");
  const std::vector<v1::DaemonCommand> second = f.Drain("w2");
  REQUIRE(first.size() == 1);
  REQUIRE(second.size() == 1);
  CHECK(first[0].outcome().outcome() == v1::OUTCOME_APPLIED);
  CHECK(first[0].outcome().applied_version() == 5);
  CHECK(second[0].outcome().applied_version() == 6);
  CHECK(f.job().servers["ps"].model_version == 6);
  CHECK(f.state.groups().empty());
}

TEST_CASE("a group aggregate fails whole: a feed lost, its aggregator or a source down") {
  auto check_failed = [](AggregateFixture& f, const std::string& why, bool cancelled) {
    for (const char* src : {"w1", "w2"}) {
      if (f.state.AliveHost(src) == nullptr) continue;  // nothing reaches a host that is down
      const std::vector<v1::DaemonCommand> outcome = f.Drain(src);
      REQUIRE(!outcome.empty());
      CHECK(outcome.back().outcome().outcome() == v1::OUTCOME_FAILED);
      CHECK_THAT(outcome.back().outcome().reason(), Catch::Contains(why));
    }
    if (cancelled) {
      for (const char* shard : {"s1", "s2", "s3"}) {
        const std::vector<v1::DaemonCommand> at_shard = f.Drain(shard);
        REQUIRE(!at_shard.empty());
        CHECK(at_shard.back().has_cancel());  // its held position is skipped
      }
    }
    CHECK(f.state.pushes().empty());
    CHECK(f.state.groups().empty());
  };
  SECTION("a part on its way to the aggregator fails") {
    AggregateFixture f;
    f.Drain("w1");
    f.Drain("w2");
    const uint64_t feed = f.Sums().feeds[1].transfer_id;
    GroupPartEnded(&f.state, feed, false, 0, "connection reset by peer");
    check_failed(f, "a part on its way to aggregator a1 failed: connection reset by peer", true);
    std::vector<v1::DaemonCommand> at_aggregator = f.Drain("a1");
    CHECK(at_aggregator.back().has_cancel());  // the sums are no longer built
  }
  SECTION("the aggregator host goes down") {
    AggregateFixture f;
    f.Drain("w1");
    f.Drain("w2");
    f.state.MarkHostDown("a1", "daemon disconnected");
    check_failed(f, "aggregator host a1 is down", true);
  }
  SECTION("a source goes down before every sum is in; after, nothing fails") {
    AggregateFixture f;
    f.Drain("w1");
    f.Drain("w2");
    f.state.MarkHostDown("w1", "daemon disconnected");
    check_failed(f, "source host w1 is down", true);

    AggregateFixture g;
    for (const GroupPart& part : g.Sums().parts) GroupPartReady(&g.state, part.id);
    g.state.MarkHostDown("w1", "daemon disconnected");
    CHECK(g.state.pushes().size() == 2);  // every sum is at its shard already
  }
  SECTION("a shard refuses its sum after the release") {
    AggregateFixture f;
    f.Drain("w1");
    f.Drain("w2");
    for (const GroupPart& part : f.Sums().parts) GroupPartReady(&f.state, part.id);
    const uint64_t part = f.Sums().parts[1].id;
    GroupPartEnded(&f.state, part, false, 0, "server refused the update");
    check_failed(f, "shards that applied theirs keep it", false);
  }
}

}  // namespace
}  // namespace mlfabric
