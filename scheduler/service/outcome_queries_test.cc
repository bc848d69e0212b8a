#include "scheduler/service/outcome_queries.h"

#include <catch2/catch.hpp>

#include "scheduler/service/cluster_state_fixture.h"

namespace mlfabric {
namespace {

struct Fixture : ClusterStateFixture {
  Fixture() : ClusterStateFixture({"s1", "w1", "w2"}) {
    state.GetOrAddJob("demo").servers["ps"].host = "s1";
    state.GetOrAddJob("other");
  }
  // A push of worker w1 named by `uid`, submitted and not yet ended.
  uint64_t Submit(uint64_t uid, const std::string& worker = "w1") {
    UpdateRecord& push = AddPush(worker);
    push.push_uid = uid;
    state.outcomes().RememberUid(uid, push.transfer_id, "demo", worker);
    return push.transfer_id;
  }
};

TEST_CASE("a push is in flight until it ends, then says how it ended") {
  Fixture f;
  const uint64_t applied = f.Submit(1001);
  const uint64_t dropped = f.Submit(1002);
  auto states = PushStates(f.state, "demo", "w1", {1001, 1002});
  REQUIRE(states.size() == 2);
  CHECK(states[0].state() == v1::PushState::STATE_IN_FLIGHT);
  CHECK(states[0].transfer_id() == applied);
  CHECK(AnyInFlight(states));

  f.state.Complete(applied, v1::OUTCOME_APPLIED, "", /*applied_version=*/7);
  f.state.Complete(dropped, v1::OUTCOME_DROPPED, "stale: delay 40 > tau_max 30", 0);
  states = PushStates(f.state, "demo", "w1", {1001, 1002});
  CHECK_FALSE(AnyInFlight(states));
  CHECK(states[0].state() == v1::PushState::STATE_ENDED);
  CHECK(states[0].outcome() == v1::OUTCOME_APPLIED);
  CHECK(states[0].applied_version() == 7);
  CHECK(states[1].outcome() == v1::OUTCOME_DROPPED);
  CHECK(states[1].reason() == "stale: delay 40 > tau_max 30");
}

TEST_CASE("a push nobody submitted, or another worker's or job's, is unknown") {
  Fixture f;
  f.Submit(2001, "w2");
  const auto states = PushStates(f.state, "demo", "w1", {2001, 2002, 0});
  for (const v1::PushState& push : states) {
    CHECK(push.state() == v1::PushState::STATE_UNKNOWN);
    CHECK(push.transfer_id() == 0);  // nothing about another worker's push
  }
  CHECK(PushStates(f.state, "other", "w2", {2001})[0].state() == v1::PushState::STATE_UNKNOWN);
  CHECK(PushStates(f.state, "demo", "w2", {2001})[0].state() ==
        v1::PushState::STATE_IN_FLIGHT);
}

TEST_CASE("a push in doubt after a scheduler restart is in flight until decided") {
  Fixture f;
  InDoubtPush doubt;
  doubt.transfer_id = 77;
  doubt.src_host = "w1";
  f.state.restart().AddInDoubt(doubt);
  f.state.outcomes().RememberUid(3001, 77, "demo", "w1");
  CHECK(PushStates(f.state, "demo", "w1", {3001})[0].state() == v1::PushState::STATE_IN_FLIGHT);
  f.state.restart().EraseInDoubtIf([](const InDoubtPush& push) { return push.transfer_id == 77; });
  f.state.outcomes().Remember(77, {v1::OUTCOME_FAILED, "its source's stream broke", 0, 0, false});
  const v1::PushState decided = PushStates(f.state, "demo", "w1", {3001})[0];
  CHECK(decided.state() == v1::PushState::STATE_ENDED);
  CHECK(decided.outcome() == v1::OUTCOME_FAILED);
}

}  // namespace
}  // namespace mlfabric
