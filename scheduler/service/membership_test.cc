// Job membership through the scheduler service's handlers (no sockets): a
// sync job's workers join and leave, every change is a generation, and the
// round a leaver held open follows the job's member_loss. The batch loop is
// not started: each test cuts batches itself (RunBatchCycle). Across real
// processes: tests/sync_round_test ("a worker's host dies").
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "scheduler/core/fifo_planner.h"
#include "scheduler/service/scheduler_service.h"

namespace mlfabric {
namespace {

struct SyncJob {
  // `round_size` > 0: ps0 is registered with it (as an AllReduce root is);
  // `loss_written`: the config writes member_loss (JobConfig::member_loss_explicit).
  explicit SyncJob(MemberLoss loss, JobMode mode = JobMode::kSync, int32_t round_size = 0,
                   bool loss_written = false)
      : service(Config(loss, mode, loss_written), &clock, Planner()) {
    for (const char* host : {"s1", "w1", "w2", "w3", "w4"}) {
      v1::RegisterHostRequest request;
      request.set_protocol_version(1);
      request.set_host(host);
      request.set_data_address("127.0.0.1:1");
      v1::RegisterHostReply reply;
      REQUIRE(service.RegisterHost(request, &reply).ok());
      incarnations[host] = reply.incarnation();
    }
    REQUIRE(Register(v1::ROLE_SERVER, "ps0", "s1", round_size).ok());
    for (const char* w : {"w1", "w2", "w3"}) REQUIRE(Register(v1::ROLE_WORKER, w, w).ok());
  }
  static SchedulerConfig Config(MemberLoss loss, JobMode mode, bool loss_written) {
    SchedulerConfig config;
    config.batch_interval_ms = 3600e3;  // batches are cut by the test only
    // Long enough that a get held back by a worker that left cannot pass
    // for one that was let go (it would come back timed out).
    config.ssp_max_wait_s = 120;
    JobConfig job{"demo", "demo-token", 30, mode};
    job.member_loss = loss;
    job.member_loss_explicit = loss_written;
    job.staleness_k = 1;
    config.jobs = {job};
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
  // Worker `worker` (on the host of its name unless `host` is given)
  // pushes round `round`; its transfer id, or 0 if refused (*status says).
  uint64_t Push(const std::string& worker, int64_t round, absl::Status* status = nullptr,
                const std::string& host = "") {
    v1::SubmitUpdateRequest request;
    request.set_job("demo");
    request.set_src_host(host.empty() ? worker : host);
    request.set_worker(worker);
    request.set_server("ps0");
    request.set_bytes(4096);
    request.set_version(round);
    v1::SubmitUpdateReply reply;
    absl::Status submitted = service.SubmitUpdate(request, &reply);
    if (status != nullptr) *status = submitted;
    return submitted.ok() ? reply.transfer_id() : 0;
  }
  absl::Status AppGone(const std::string& worker, v1::Role role = v1::ROLE_WORKER) {
    v1::EntityGoneReport report;
    report.set_job("demo");
    report.set_host(worker);
    report.set_role(role);
    report.set_name(worker);
    report.set_reason("its connection to the daemon closed");
    return service.ReportEntityGone(report);
  }
  JobView Job() const { return service.Snapshot().jobs.at(0); }
  // How push `id` ended ("" while it has not).
  DropView Ended(uint64_t id) const {
    for (const DropView& d : service.Snapshot().recent_drops) {
      if (d.transfer_id == id) return d;
    }
    return {};
  }
  size_t InFlight() const { return service.Snapshot().in_flight.size(); }

  FakeClock clock{10.0};
  SchedulerService service;
  std::map<std::string, uint64_t> incarnations;
};

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Waits for `done` (polled), up to 30 s; false if it never came.
template <typename Done>
bool WaitFor(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST_CASE("Membership: each join and leave is a generation, with when and why") {
  SyncJob f(MemberLoss::kShrink);
  JobView job = f.Job();
  CHECK(job.members == std::vector<std::string>{"w1", "w2", "w3"});
  CHECK(job.generation == 4);  // 1, then three joins
  // Registering again (an application reconnecting) changes nothing.
  REQUIRE(f.Register(v1::ROLE_WORKER, "w1", "w1").ok());
  CHECK(f.Job().generation == 4);

  f.clock.Advance(1.0);
  REQUIRE(f.AppGone("w3").ok());
  job = f.Job();
  CHECK(job.members == std::vector<std::string>{"w1", "w2"});
  CHECK(job.generation == 5);
  REQUIRE(job.membership_changes.size() == 4);
  const MembershipChange& left = job.membership_changes.back();
  CHECK(left.worker == "w3");
  CHECK_FALSE(left.joined);
  CHECK(left.at_s == 11.0);
  CHECK(Has(left.reason, "its application left host w3"));
  CHECK(left.generation == 5);

  // Its host's stream ends: the worker on it leaves.
  f.service.EndStream("w2", f.incarnations["w2"], "daemon disconnected");
  job = f.Job();
  CHECK(job.members == std::vector<std::string>{"w1"});
  CHECK(job.generation == 6);
  CHECK(Has(job.membership_changes.back().reason, "its host w2 is down: daemon disconnected"));

  // A worker that left is refused until it registers again.
  absl::Status refused;
  CHECK(f.Push("w3", 0, &refused) == 0);
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Has(std::string(refused.message()), "worker 'w3' is no member of job 'demo'"));
  CHECK(Has(std::string(refused.message()), "(generation 5)"));
  REQUIRE(f.Register(v1::ROLE_WORKER, "w3", "w3").ok());
  CHECK(f.Job().generation == 7);
  CHECK(f.Push("w3", 0) != 0);
}

TEST_CASE("Membership: reports about workers that are not there are refused with the reason") {
  SyncJob f(MemberLoss::kShrink);
  v1::EntityGoneReport report;
  report.set_job("demo");
  report.set_host("w1");
  report.set_role(v1::ROLE_WORKER);
  report.set_name("w2");  // registered from host w2, not w1
  absl::Status wrong_host = f.service.ReportEntityGone(report);
  CHECK(wrong_host.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Has(std::string(wrong_host.message()), "worker 'w2' of job 'demo' is not registered "
                                               "from host w1"));
  report.set_name("nobody");
  CHECK(f.service.ReportEntityGone(report).code() == absl::StatusCode::kFailedPrecondition);
  report.set_role(v1::ROLE_UNSPECIFIED);
  CHECK(f.service.ReportEntityGone(report).code() == absl::StatusCode::kInvalidArgument);
  CHECK(f.Job().generation == 4);
}

TEST_CASE("shrink: a round whose pushes still wait completes with the members left") {
  SyncJob f(MemberLoss::kShrink);
  const uint64_t a = f.Push("w1", 0), b = f.Push("w2", 0);
  const uint64_t leavers = f.Push("w3", 0);  // then its application goes
  REQUIRE(f.AppGone("w3").ok());
  // The leaver's push waiting for a batch fails: it would take a place in
  // a round sized without it.
  CHECK(f.Ended(leavers).outcome == "failed");
  CHECK(Has(f.Ended(leavers).reason, "worker 'w3' left the job"));
  f.service.RunBatchCycle();
  CHECK(f.InFlight() == 2);
  CHECK(f.Ended(a).outcome.empty());
  CHECK(f.Ended(b).outcome.empty());
  // Round 0 closed with the two: a third push is surplus.
  const uint64_t surplus = f.Push("extra", 0, nullptr, "w1");
  f.service.RunBatchCycle();
  CHECK(f.Ended(surplus).category == "late_for_round");
  CHECK(Has(f.Ended(surplus).reason, "round 0 closed with its first 2 pushes"));
}

TEST_CASE("shrink: a round the leaver already pushed to goes on at its size") {
  SyncJob f(MemberLoss::kShrink);
  const uint64_t leavers = f.Push("w3", 0);
  f.service.RunBatchCycle();  // announced: round 0 sums 3 pushes
  REQUIRE(f.AppGone("w3").ok());
  CHECK(f.Ended(leavers).outcome.empty());  // its bytes may still come
  const uint64_t a = f.Push("w1", 0), b = f.Push("w2", 0);
  f.service.RunBatchCycle();
  CHECK(f.InFlight() == 3);
  CHECK(f.Ended(a).outcome.empty());
  CHECK(f.Ended(b).outcome.empty());
}

// The commands queued for `host` (incarnation `f.incarnations[host]`) so far.
std::vector<v1::DaemonCommand> Queued(SyncJob& f, const std::string& host) {
  std::vector<v1::DaemonCommand> out;
  v1::DaemonCommand command;
  while (f.service.outbox().Pop(host, f.incarnations[host], std::chrono::milliseconds(0),
                                &command) == CommandOutbox::PopResult::kCommand) {
    out.push_back(command);
  }
  return out;
}

TEST_CASE("shrink: an announced round closes with the pushes in and the members left") {
  SyncJob f(MemberLoss::kShrink);
  const uint64_t a = f.Push("w1", 0);
  f.service.RunBatchCycle();  // announced to the server's daemon with size 3
  std::vector<v1::DaemonCommand> at_s1 = Queued(f, "s1");
  int expects = 0;
  for (const v1::DaemonCommand& c : at_s1) {
    if (c.has_expect()) {
      ++expects;
      CHECK(c.expect().round_size() == 3);
    }
  }
  REQUIRE(expects == 1);
  REQUIRE(f.AppGone("w3").ok());
  CHECK(f.Ended(a).outcome.empty());  // not failed: the round goes on with two
  // The server's daemon is told, after the member it was announced.
  at_s1 = Queued(f, "s1");
  REQUIRE(at_s1.size() == 1);
  REQUIRE(at_s1[0].has_shrink_round());
  const v1::ShrinkRound& shrink = at_s1[0].shrink_round();
  CHECK(shrink.server() == "ps0");
  CHECK(shrink.round() == 0);
  CHECK(shrink.size() == 2);
  INFO(shrink.reason());
  CHECK(Has(shrink.reason(), "worker 'w3' left the job"));
  CHECK(Has(shrink.reason(), "at membership generation 5"));
  CHECK(Has(shrink.reason(), "round 0 closes with 2 of its 3 pushes (member_loss shrink)"));
  // w2's push joins the round announced with the new size; a third is surplus.
  const uint64_t b = f.Push("w2", 0);
  f.service.RunBatchCycle();
  CHECK(f.Ended(b).outcome.empty());
  for (const v1::DaemonCommand& c : Queued(f, "s1")) {
    if (c.has_expect()) CHECK(c.expect().round_size() == 2);
  }
  CHECK(f.InFlight() == 2);
  // A second leaver: the round, with both its pushes in, is full and not shrunk again.
  REQUIRE(f.AppGone("w2").ok());
  for (const v1::DaemonCommand& c : Queued(f, "s1")) CHECK_FALSE(c.has_shrink_round());
}

TEST_CASE("fail: the open round fails once with the reason; the next has the new size") {
  SyncJob f(MemberLoss::kFail);
  const uint64_t a = f.Push("w1", 0), b = f.Push("w2", 0);
  f.service.RunBatchCycle();
  REQUIRE(f.InFlight() == 2);
  REQUIRE(f.AppGone("w3").ok());
  for (uint64_t id : {a, b}) {
    const DropView ended = f.Ended(id);
    INFO(ended.reason);
    CHECK(ended.outcome == "failed");
    CHECK(Has(ended.reason, "round 0 failed: worker 'w3' left the job (its application left "
                            "host w3"));
    CHECK(Has(ended.reason, "at membership generation 5"));
    CHECK(Has(ended.reason, "member_loss is fail"));
    CHECK(Has(ended.reason, "the next one has size 2"));
    CHECK(Has(ended.reason, "(round 0 opened at membership generation 4)"));
  }
  // Once: another member leaving later finds no round 0 to fail again.
  CHECK(f.InFlight() == 0);
  const uint64_t c = f.Push("w1", 1), d = f.Push("w2", 1);
  f.service.RunBatchCycle();
  CHECK(f.InFlight() == 2);
  CHECK(f.Ended(c).outcome.empty());
  CHECK(f.Ended(d).outcome.empty());
  const uint64_t surplus = f.Push("extra", 1, nullptr, "w1");
  f.service.RunBatchCycle();
  CHECK(Has(f.Ended(surplus).reason, "round 1 closed with its first 2 pushes"));
}

TEST_CASE("ssp: a slowest worker that leaves no longer holds the others back") {
  SyncJob f(MemberLoss::kShrink, JobMode::kSsp);  // K = 1
  for (int i = 0; i < 3; ++i) {
    REQUIRE(f.Push("w1", i) != 0);
    REQUIRE(f.Push("w2", i) != 0);
  }
  // w3 has pushed nothing: w1, three ahead, waits at its get for it.
  v1::AwaitClockReply reply;
  absl::Status awaited;
  std::thread get([&] {
    v1::AwaitClockRequest request;
    request.set_job("demo");
    request.set_worker("w1");
    awaited = f.service.AwaitClock(request, &reply);
  });
  const bool waiting = WaitFor([&] { return !f.Job().ssp_waiting.empty(); });
  CHECK(waiting);
  if (waiting) {
    const JobView::SspWait wait = f.Job().ssp_waiting.at(0);
    CHECK(wait.slowest_worker == "w3");
    CHECK(wait.slowest_clock == 0);
  }
  // Its application goes (its daemon lives on): it is no member now, and
  // the waiting get goes ahead, within K of the slowest live member.
  REQUIRE(f.AppGone("w3").ok());
  get.join();
  REQUIRE(awaited.ok());
  CHECK_FALSE(reply.timed_out());
  CHECK(reply.clock() == 3);
  CHECK(reply.slowest_clock() == 3);
  CHECK(reply.slowest_worker() != "w3");
  CHECK(f.Job().ssp_waiting.empty());
}

TEST_CASE("A worker that leaves is out of the job's straggler figures") {
  SyncJob f(MemberLoss::kShrink);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(f.Push("w1", i) != 0);
    REQUIRE(f.Push("w2", i) != 0);
    REQUIRE(f.Push("w3", i) != 0);
  }
  const auto listed = [&f](const std::string& worker) {
    for (const WorkerTiming& w : f.Job().workers) {
      if (w.worker == worker) return true;
    }
    return false;
  };
  CHECK(listed("w3"));
  REQUIRE(f.AppGone("w3").ok());
  CHECK_FALSE(listed("w3"));
  CHECK(listed("w1"));
  CHECK(listed("w2"));
}

TEST_CASE("A worker that joins while a round is open counts from the next round") {
  SyncJob f(MemberLoss::kShrink);
  const uint64_t a = f.Push("w1", 0);  // round 0 opens: size 3, generation 4
  REQUIRE(f.Register(v1::ROLE_WORKER, "w4", "w4").ok());  // generation 5
  CHECK(f.Job().generation == 5);
  const uint64_t joiner = f.Push("w4", 0);  // pushed before the others: there is room
  const uint64_t b = f.Push("w2", 0), c = f.Push("w3", 0);
  f.service.RunBatchCycle();
  // Round 0 is summed over the three of its generation; the newcomer's
  // push is refused, naming both generations, not summed.
  CHECK(f.InFlight() == 3);
  for (uint64_t id : {a, b, c}) CHECK(f.Ended(id).outcome.empty());
  const DropView refused = f.Ended(joiner);
  INFO(refused.reason);
  CHECK(refused.outcome == "dropped");
  CHECK(refused.category == "stale_generation");
  CHECK(Has(refused.reason, "worker 'w4' joined job 'demo' at membership generation 5, after "
                            "round 0 opened at generation 4"));
  CHECK(Has(refused.reason, "push round 1"));
  // Round 1 opens at generation 5: it counts all four.
  std::vector<uint64_t> next;
  for (const char* w : {"w1", "w2", "w3", "w4"}) next.push_back(f.Push(w, 1));
  const uint64_t surplus = f.Push("extra", 1, nullptr, "w1");
  f.service.RunBatchCycle();
  for (uint64_t id : next) CHECK(f.Ended(id).outcome.empty());
  CHECK(f.InFlight() == 7);
  CHECK(Has(f.Ended(surplus).reason, "round 1 closed with its first 4 pushes"));
}

TEST_CASE("A round announced before a worker joined does not take its push") {
  SyncJob f(MemberLoss::kShrink);
  const uint64_t a = f.Push("w1", 0);
  f.service.RunBatchCycle();  // announced: size 3, generation 4
  REQUIRE(f.Register(v1::ROLE_WORKER, "w4", "w4").ok());
  const uint64_t joiner = f.Push("w4", 0);
  f.service.RunBatchCycle();
  CHECK(f.Ended(joiner).category == "stale_generation");
  const uint64_t b = f.Push("w2", 0), c = f.Push("w3", 0);
  f.service.RunBatchCycle();
  CHECK(f.InFlight() == 3);
  for (uint64_t id : {a, b, c}) CHECK(f.Ended(id).outcome.empty());
}

TEST_CASE("A worker that left and joined again is refused by the round opened before") {
  SyncJob f(MemberLoss::kShrink);
  const uint64_t a = f.Push("w1", 0);  // round 0 opens at generation 4, size 3
  REQUIRE(f.AppGone("w3").ok());      // generation 5: round 0, not announced, has size 2
  REQUIRE(f.Register(v1::ROLE_WORKER, "w3", "w3").ok());  // generation 6
  const uint64_t rejoined = f.Push("w3", 0);
  f.service.RunBatchCycle();
  const DropView refused = f.Ended(rejoined);
  INFO(refused.reason);
  CHECK(refused.category == "stale_generation");
  CHECK(Has(refused.reason, "joined job 'demo' at membership generation 6, after round 0 "
                            "opened at generation 4"));
  const uint64_t b = f.Push("w2", 0);
  f.service.RunBatchCycle();
  CHECK(f.InFlight() == 2);  // round 0: w1 and w2, its generation's members left
  CHECK(f.Ended(a).outcome.empty());
  CHECK(f.Ended(b).outcome.empty());
  // A worker that never registered is no member of any generation.
  const uint64_t stranger = f.Push("w9", 1, nullptr, "w1");
  f.service.RunBatchCycle();
  CHECK(f.Ended(stranger).category == "not_a_member");
  CHECK(Has(f.Ended(stranger).reason, "worker 'w9' is no member of job 'demo'"));
}

TEST_CASE("An AllReduce root's rounds follow its ranks when member_loss is written shrink") {
  SyncJob f(MemberLoss::kShrink, JobMode::kAsync, /*round_size=*/3, /*loss_written=*/true);
  for (const char* w : {"w1", "w2", "w3"}) REQUIRE(f.Push(w, 0) != 0);
  f.service.RunBatchCycle();  // round 0: its three ranks are known
  REQUIRE(f.InFlight() == 3);
  const uint64_t a = f.Push("w1", 1);  // round 1 opens with size 3
  REQUIRE(f.AppGone("w3").ok());
  const uint64_t b = f.Push("w2", 1);
  const uint64_t surplus = f.Push("extra", 1, nullptr, "w1");
  f.service.RunBatchCycle();
  // Round 1, not yet announced when rank w3 left, is summed over two.
  CHECK(f.Ended(a).outcome.empty());
  CHECK(f.Ended(b).outcome.empty());
  CHECK(f.InFlight() == 5);
  CHECK(Has(f.Ended(surplus).reason, "round 1 closed with its first 2 pushes"));
  // Its rank joining again counts from a round opened after.
  REQUIRE(f.Register(v1::ROLE_WORKER, "w3", "w3").ok());
  const uint64_t late = f.Push("w3", 1);
  f.service.RunBatchCycle();
  CHECK(f.Ended(late).outcome == "dropped");
}

TEST_CASE("An AllReduce root keeps its size by default: a rank leaving fails its round once") {
  SyncJob f(MemberLoss::kShrink, JobMode::kAsync, /*round_size=*/3);  // member_loss not written
  for (const char* w : {"w1", "w2", "w3"}) REQUIRE(f.Push(w, 0) != 0);
  f.service.RunBatchCycle();
  const uint64_t a = f.Push("w1", 1);
  f.service.RunBatchCycle();
  REQUIRE(f.AppGone("w3").ok());
  const DropView ended = f.Ended(a);
  INFO(ended.reason);
  CHECK(ended.outcome == "failed");
  CHECK(Has(ended.reason, "round 1 failed: worker 'w3' left the job"));
  CHECK(Has(ended.reason, "registered with round size 3 (an AllReduce root)"));
  CHECK(Has(ended.reason, "the next one waits for all 3 again"));
  // Round 2 waits for three: a third push is no surplus.
  std::vector<uint64_t> next;
  for (const char* w : {"w1", "w2"}) next.push_back(f.Push(w, 2));
  next.push_back(f.Push("extra", 2, nullptr, "w1"));
  f.service.RunBatchCycle();
  for (uint64_t id : next) CHECK(f.Ended(id).outcome.empty());
}

}  // namespace
}  // namespace mlfabric
