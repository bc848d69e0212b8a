// Rounds on the previous round's plan (round_grants.h), through the
// scheduler service's handlers (no sockets): a planned round member's
// command carries its next round's grant, a push sent on it is accounted
// and announced without a plan, and a push whose bytes left on a grant
// that does not hold ends once, its bytes discarded at the root. The batch
// loop is not started: each test cuts batches itself (RunBatchCycle).
// Across real processes: tests/sync_round_test ("rounds run on grants").
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "scheduler/core/fifo_planner.h"
#include "scheduler/service/scheduler_service.h"

namespace mlfabric {
namespace {

// An AllReduce-like root: server "ps0" on s1 sums rounds of two pushes, one
// each from w1 and w2 (on hosts of their names).
struct GrantRig {
  explicit GrantRig(bool grants = true) : service(Config(grants), &clock, Planner()) {
    for (const char* host : {"s1", "w1", "w2"}) {
      v1::RegisterHostRequest request;
      request.set_protocol_version(1);
      request.set_host(host);
      request.set_data_address(std::string(host) + ":1");
      request.set_uplink_bps(1e9);
      request.set_downlink_bps(1e9);
      v1::RegisterHostReply reply;
      REQUIRE(service.RegisterHost(request, &reply).ok());
      incarnations[host] = reply.incarnation();
    }
    REQUIRE(Register(v1::ROLE_SERVER, "ps0", "s1", 2).ok());
    for (const char* w : {"w1", "w2"}) REQUIRE(Register(v1::ROLE_WORKER, w, w).ok());
  }
  static SchedulerConfig Config(bool grants) {
    SchedulerConfig config;
    config.batch_interval_ms = 3600e3;  // batches are cut by the test only
    config.round_grants = grants;
    config.jobs = {JobConfig{"demo", "demo-token", 30, JobMode::kAsync}};
    return config;
  }
  static std::unique_ptr<core::Planner> Planner() { return std::make_unique<core::FifoPlanner>(); }

  absl::Status Register(v1::Role role, const std::string& name, const std::string& host,
                        int32_t round_size = 0) {
    v1::RegisterEntityRequest request;
    request.set_round_size(round_size);
    request.set_job("demo");
    request.set_job_token("demo-token");
    request.set_role(role);
    request.set_name(name);
    request.set_host(host);
    v1::RegisterEntityReply reply;
    return service.RegisterEntity(request, &reply);
  }
  // `worker` pushes round `round`, sent on grant `granted` unless 0.
  v1::SubmitUpdateReply Push(const std::string& worker, int64_t round, uint64_t granted = 0,
                             int64_t bytes = 4096) {
    v1::SubmitUpdateRequest request;
    request.set_job("demo");
    request.set_src_host(worker);
    request.set_worker(worker);
    request.set_server("ps0");
    request.set_bytes(bytes);
    request.set_version(round);
    request.set_granted_transfer_id(granted);
    v1::SubmitUpdateReply reply;
    REQUIRE(service.SubmitUpdate(request, &reply).ok());
    return reply;
  }
  // The commands queued for `host` so far.
  std::vector<v1::DaemonCommand> Queued(const std::string& host) {
    std::vector<v1::DaemonCommand> out;
    v1::DaemonCommand command;
    while (service.outbox().Pop(host, incarnations[host], std::chrono::milliseconds(0),
                                &command) == CommandOutbox::PopResult::kCommand) {
      out.push_back(command);
    }
    return out;
  }
  // The SendTransfer queued for `host`'s push `id` (fails the test if none).
  v1::SendTransfer SendFor(const std::string& host, uint64_t id) {
    for (const v1::DaemonCommand& c : Queued(host)) {
      if (c.has_send() && c.send().transfer_id() == id) return c.send();
    }
    FAIL("no SendTransfer for transfer " << id << " at " << host);
    return {};
  }
  // Round 0 of w1 and w2, planned; w1's grant for round 1 (the commands so
  // far are taken).
  v1::RoundGrant PlanRoundZero() {
    const uint64_t a = Push("w1", 0).transfer_id();
    Push("w2", 0);
    service.RunBatchCycle();
    const v1::RoundGrant grant = SendFor("w1", a).next_round();
    REQUIRE(grant.transfer_id() != 0);
    Queued("s1");
    return grant;
  }
  // How push `id` ended ("" while it has not).
  DropView Ended(uint64_t id) const {
    for (const DropView& d : service.Snapshot().recent_drops) {
      if (d.transfer_id == id) return d;
    }
    return {};
  }
  bool InFlight(uint64_t id) const {
    for (const TransferView& t : service.Snapshot().in_flight) {
      if (t.transfer_id == id) return true;
    }
    return false;
  }

  FakeClock clock{10.0};
  SchedulerService service;
  std::map<std::string, uint64_t> incarnations;
};

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The transfers `commands` tell their daemon to discard.
std::vector<uint64_t> Discarded(const std::vector<v1::DaemonCommand>& commands) {
  std::vector<uint64_t> ids;
  for (const v1::DaemonCommand& c : commands) {
    if (c.has_cancel() && c.cancel().discard()) ids.push_back(c.cancel().transfer_id());
  }
  return ids;
}

TEST_CASE("A planned round member gets its next round's grant; a push on it is not planned") {
  GrantRig rig;
  const uint64_t a = rig.Push("w1", 0).transfer_id();
  const uint64_t b = rig.Push("w2", 0).transfer_id();
  rig.service.RunBatchCycle();
  const v1::SendTransfer sent = rig.SendFor("w1", a);
  REQUIRE(sent.has_next_round());
  const v1::RoundGrant& grant = sent.next_round();
  CHECK(grant.round() == 1);
  CHECK(grant.bytes() == 4096);
  CHECK(grant.dst_host() == "s1");
  CHECK(grant.dst_address() == "s1:1");
  // The rate its plan gave this transfer.
  double sending_s = 0;
  for (const v1::RateSegment& segment : sent.segments()) {
    sending_s += segment.to_s() - segment.from_s();
  }
  CHECK(grant.rate_bps() == Approx(8.0 * 4096 / sending_s));
  CHECK(rig.SendFor("w2", b).has_next_round());
  rig.Queued("s1");
  const int64_t batches = rig.service.GetStats().batches;

  // Round 1 from w1, sent on its grant: in flight and announced at once.
  const v1::SubmitUpdateReply on_grant = rig.Push("w1", 1, grant.transfer_id());
  CHECK(on_grant.transfer_id() == grant.transfer_id());
  CHECK(rig.InFlight(grant.transfer_id()));
  std::vector<v1::DaemonCommand> at_root = rig.Queued("s1");
  REQUIRE(at_root.size() == 1);
  REQUIRE(at_root[0].has_expect());
  CHECK(at_root[0].expect().transfer_id() == grant.transfer_id());
  CHECK(at_root[0].expect().round_size() == 2);
  CHECK(at_root[0].expect().version() == 1);
  CHECK(rig.Queued("w1").empty());  // no SendTransfer: its daemon sends already
  // The grant after: round 2, a new transfer id.
  REQUIRE(on_grant.has_next_round());
  CHECK(on_grant.next_round().round() == 2);
  CHECK(on_grant.next_round().transfer_id() != grant.transfer_id());
  CHECK(on_grant.next_round().rate_bps() == grant.rate_bps());
  // Accounted on the links as its plan was: later batches plan around it.
  bool reserved = false;
  for (const TransferView& t : rig.service.Snapshot().in_flight) {
    if (t.transfer_id != grant.transfer_id()) continue;
    reserved = t.src == "w1" && t.dst == "s1" && !t.segments.empty() &&
               t.segments[0].rate_bps == grant.rate_bps();
  }
  CHECK(reserved);
  rig.service.RunBatchCycle();
  CHECK(rig.service.GetStats().batches == batches);  // nothing was left to plan
  CHECK(rig.service.GetStats().granted_pushes == 1);
  CHECK(rig.service.GetStats().round_grants == 3);
}

TEST_CASE("A grant is honoured once the links moved, but the round after is planned again") {
  GrantRig rig;
  const v1::RoundGrant grant = rig.PlanRoundZero();
  // w1's uplink halves (beyond round_grant_change, 10 %).
  v1::BandwidthReport report;
  report.set_host("w1");
  report.set_uplink_bps(0.5e9);
  report.set_downlink_bps(1e9);
  REQUIRE(rig.service.ReportBandwidth(report).ok());
  const v1::SubmitUpdateReply on_grant = rig.Push("w1", 1, grant.transfer_id());
  CHECK(on_grant.transfer_id() == grant.transfer_id());
  CHECK(rig.InFlight(grant.transfer_id()));  // its bytes left: it counts
  CHECK_FALSE(on_grant.has_next_round());
}

TEST_CASE("Without round_grants no grant is given") {
  GrantRig rig(/*grants=*/false);
  const uint64_t a = rig.Push("w1", 0).transfer_id();
  rig.Push("w2", 0);
  rig.service.RunBatchCycle();
  CHECK_FALSE(rig.SendFor("w1", a).has_next_round());
  CHECK(rig.service.GetStats().round_grants == 0);
}

TEST_CASE("A push on a grant this scheduler did not give fails, its bytes discarded at the root") {
  GrantRig rig;
  const uint64_t foreign = 0x1234;  // as from a scheduler before a restart
  const v1::SubmitUpdateReply reply = rig.Push("w1", 0, foreign);
  CHECK(reply.transfer_id() == foreign);
  CHECK_FALSE(reply.has_next_round());
  CHECK(rig.Ended(foreign).outcome == "failed");
  CHECK(Has(rig.Ended(foreign).reason, "did not give"));
  CHECK(Discarded(rig.Queued("s1")) == std::vector<uint64_t>{foreign});
}

TEST_CASE("A push on a grant that its round refuses ends once; its bytes are discarded") {
  GrantRig rig;
  const v1::RoundGrant grant = rig.PlanRoundZero();
  SECTION("a grant for another size") {
    const v1::SubmitUpdateReply reply = rig.Push("w1", 1, grant.transfer_id(), 8192);
    CHECK(reply.transfer_id() == grant.transfer_id());
    CHECK(rig.Ended(grant.transfer_id()).outcome == "failed");
    CHECK(Has(rig.Ended(grant.transfer_id()).reason, "4096 bytes"));
  }
  SECTION("a grant given again since: the worker's push of that round was planned") {
    rig.Push("w1", 1);  // planned as usual (its plan gives the next grant)
    rig.service.RunBatchCycle();
    rig.Queued("s1");
    rig.Push("w1", 1, grant.transfer_id());
    CHECK(rig.Ended(grant.transfer_id()).outcome == "failed");
    CHECK(Has(rig.Ended(grant.transfer_id()).reason, "given again since"));
  }
  CHECK(Discarded(rig.Queued("s1")) == std::vector<uint64_t>{grant.transfer_id()});
  CHECK_FALSE(rig.InFlight(grant.transfer_id()));
}

}  // namespace
}  // namespace mlfabric
