// Handler-level tests of SchedulerService (no sockets): validation of every
// request a daemon can send. Dispatch across processes is covered by
// tests/push_get_test.
#include "scheduler/service/grpc_service.h"
#include "scheduler/service/scheduler_service.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "scheduler/core/fifo_planner.h"
#include "testing/wait_for.h"

namespace mlfabric {
namespace {

using ::mlfabric::testing::WaitFor;

// Job "demo" with token "demo-token" (no job ships by default).
SchedulerConfig DemoJob() {
  SchedulerConfig config;
  config.jobs = {{"demo", "demo-token", 30, JobMode::kAsync}};
  return config;
}

SchedulerConfig ShortServerWait() {
  SchedulerConfig config = DemoJob();
  config.server_wait_s = 0.05;
  return config;
}

// The handlers as the gRPC face converts them, without its authentication,
// which needs a real call's metadata (tests/security_test covers it).
struct Handlers {
  SchedulerService* service;
  grpc::Status RegisterHost(grpc::ServerContext*, const v1::RegisterHostRequest* request,
                            v1::RegisterHostReply* reply) {
    return ToGrpcStatus(service->RegisterHost(*request, reply));
  }
  grpc::Status RegisterEntity(grpc::ServerContext*, const v1::RegisterEntityRequest* request,
                              v1::RegisterEntityReply* reply) {
    return ToGrpcStatus(service->RegisterEntity(*request, reply));
  }
  grpc::Status SubmitUpdate(grpc::ServerContext*, const v1::SubmitUpdateRequest* request,
                            v1::SubmitUpdateReply* reply) {
    return ToGrpcStatus(service->SubmitUpdate(*request, reply));
  }
  grpc::Status ReportCompletion(grpc::ServerContext*, const v1::CompletionReport* request,
                                v1::CompletionAck*) {
    return ToGrpcStatus(service->ReportCompletion(*request));
  }
  grpc::Status ReportBandwidth(grpc::ServerContext*, const v1::BandwidthReport* request,
                               v1::BandwidthAck*) {
    return ToGrpcStatus(service->ReportBandwidth(*request));
  }
  grpc::Status ResolveServer(grpc::ServerContext*, const v1::ResolveServerRequest* request,
                             v1::ResolveServerReply* reply) {
    return ToGrpcStatus(service->ResolveServer(*request, reply));
  }
};

struct Fixture {
  explicit Fixture(const SchedulerConfig& config = ShortServerWait())
      : service(config, &clock, std::make_unique<core::FifoPlanner>()) {}
  FakeClock clock{100.0};
  SchedulerService service;
  Handlers rpc{&service};
  grpc::ServerContext context;

  void RegisterHost(const std::string& name) {
    v1::RegisterHostRequest request;
    request.set_protocol_version(1);
    request.set_host(name);
    request.set_data_address("127.0.0.1:1");
    v1::RegisterHostReply reply;
    REQUIRE(rpc.RegisterHost(&context, &request, &reply).ok());
    CHECK(reply.scheduler_time_s() == 100.0);
  }

  grpc::Status RegisterServer(const std::string& token) {
    v1::RegisterEntityRequest request;
    request.set_job("demo");
    request.set_job_token(token);
    request.set_role(v1::ROLE_SERVER);
    request.set_name("ps0");
    request.set_host("s1");
    v1::RegisterEntityReply reply;
    return rpc.RegisterEntity(&context, &request, &reply);
  }

  v1::SubmitUpdateRequest GoodSubmit() {
    v1::SubmitUpdateRequest request;
    request.set_job("demo");
    request.set_src_host("w1");
    request.set_server("ps0");
    request.set_bytes(4096);
    request.set_version(0);
    request.set_norm(1.0);
    return request;
  }

  grpc::Status Submit(const v1::SubmitUpdateRequest& request, uint64_t* id = nullptr) {
    v1::SubmitUpdateReply reply;
    grpc::Status status = rpc.SubmitUpdate(&context, &request, &reply);
    if (id) *id = reply.transfer_id();
    return status;
  }
};

TEST_CASE("Registration checks the job and its token") {
  Fixture f;
  f.RegisterHost("s1");
  CHECK(f.RegisterServer("wrong").error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK(f.RegisterServer("demo-token").ok());

  v1::RegisterEntityRequest request;
  request.set_job("nope");
  v1::RegisterEntityReply reply;
  auto status = f.rpc.RegisterEntity(&f.context, &request, &reply);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message().find("unknown job 'nope'") != std::string::npos);

  v1::RegisterHostRequest old_protocol;
  old_protocol.set_protocol_version(7);
  old_protocol.set_host("x");
  v1::RegisterHostReply host_reply;
  CHECK(f.rpc.RegisterHost(&f.context, &old_protocol, &host_reply).error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("Link rates near zero are refused: a transfer must not be planned to end at infinity") {
  // Found by the grpc_handlers fuzz target (testdata/fuzz/grpc_handlers/denormal_uplink).
  Fixture f;
  v1::RegisterHostRequest request;
  request.set_protocol_version(1);
  request.set_host("w1");
  request.set_data_address("127.0.0.1:1");
  request.set_uplink_bps(6e-320);
  v1::RegisterHostReply reply;
  auto status = f.rpc.RegisterHost(&f.context, &request, &reply);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message().find("uplink_bps") != std::string::npos);
  request.set_uplink_bps(0);  // the scheduler's default
  request.set_downlink_bps(1e14);
  status = f.rpc.RegisterHost(&f.context, &request, &reply);
  CHECK(status.error_message().find("downlink_bps") != std::string::npos);
  request.set_downlink_bps(1e9);
  REQUIRE(f.rpc.RegisterHost(&f.context, &request, &reply).ok());

  v1::BandwidthReport report;
  report.set_host("w1");
  report.set_uplink_bps(1e9);
  report.set_downlink_bps(5e-324);
  v1::BandwidthAck ack;
  status = f.rpc.ReportBandwidth(&f.context, &report, &ack);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message().find("downlink_bps") != std::string::npos);
  report.set_downlink_bps(1e9);
  CHECK(f.rpc.ReportBandwidth(&f.context, &report, &ack).ok());
}

TEST_CASE("A push not yet scheduled cannot complete; it is planned at the next batch") {
  // Found by the grpc_handlers fuzz target (testdata/fuzz/grpc_handlers/complete_pending):
  // completing it left its id pending, and the next batch failed to plan.
  Fixture f;
  f.RegisterHost("s1");
  f.RegisterHost("w1");
  REQUIRE(f.RegisterServer("demo-token").ok());
  uint64_t id = 0;
  REQUIRE(f.Submit(f.GoodSubmit(), &id).ok());
  v1::CompletionReport report;
  report.set_host("s1");
  report.set_transfer_id(id);
  report.set_applied(true);
  report.set_model_version(1);
  v1::CompletionAck ack;
  auto status = f.rpc.ReportCompletion(&f.context, &report, &ack);
  CHECK(status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(status.error_message().find("not scheduled yet") != std::string::npos);
  f.service.RunBatchCycle();
  const ClusterSnapshot snap = f.service.Snapshot();
  CHECK(snap.drops_by_category.count("plan_error") == 0);
  REQUIRE(snap.in_flight.size() == 1);
  CHECK(snap.in_flight[0].transfer_id == id);
  CHECK(f.rpc.ReportCompletion(&f.context, &report, &ack).ok());
  CHECK(f.service.GetStats().applied == 1);
}

TEST_CASE("A batch cycle records where its time went, its parts within its total") {
  Fixture f;
  f.RegisterHost("s1");
  f.RegisterHost("w1");
  REQUIRE(f.RegisterServer("demo-token").ok());
  REQUIRE(f.Submit(f.GoodSubmit()).ok());
  f.service.RunBatchCycle();
  const ClusterSnapshot snap = f.service.Snapshot();
  REQUIRE(snap.recent_cycles.size() == 1);
  const CycleView& cycle = snap.recent_cycles[0];
  CHECK(cycle.batches == 1);
  CHECK(cycle.updates == 1);
  for (double part : {cycle.lock_wait_ms, cycle.cut_ms, cycle.plan_ms, cycle.dispatch_ms}) {
    CHECK(part >= 0);
  }
  CHECK(cycle.cut_ms > 0);  // measured, not left at 0
  CHECK(cycle.dispatch_ms > 0);
  CHECK(cycle.lock_wait_ms + cycle.cut_ms + cycle.plan_ms + cycle.dispatch_ms <= cycle.total_ms);
  // The cycles alone (GET /api/v1/cycles), the same ones.
  const ClusterSnapshot cycles = f.service.CyclesSnapshot();
  REQUIRE(cycles.recent_cycles.size() == 1);
  CHECK(cycles.recent_cycles[0].start_s == cycle.start_s);
  CHECK(cycles.recent_cycles[0].total_ms == cycle.total_ms);
  CHECK(cycles.batch_interval_ms == snap.batch_interval_ms);
  CHECK(cycles.hosts.empty());  // nothing else was copied under the lock
}

TEST_CASE("A batch is planned for its cut plus the plan lead") {
  SchedulerConfig config = ShortServerWait();
  config.plan_lead_ms = 40;
  Fixture f(config);
  f.RegisterHost("s1");
  f.RegisterHost("w1");
  REQUIRE(f.RegisterServer("demo-token").ok());
  REQUIRE(f.Submit(f.GoodSubmit()).ok());
  f.service.RunBatchCycle();
  const ClusterSnapshot snap = f.service.Snapshot();
  REQUIRE(snap.recent_cycles.size() == 1);
  CHECK(snap.recent_cycles[0].start_s == 100.0);
  CHECK(snap.recent_cycles[0].lead_ms == 40);
  REQUIRE(snap.recent_batches.size() == 1);
  CHECK(snap.recent_batches[0].planned_at_s == Approx(100.04));
  REQUIRE(snap.in_flight.size() == 1);
  CHECK(snap.in_flight[0].start_s >= Approx(100.04));
  // -1 estimates the lead from the cycles' times, which the fake clock
  // makes 0: the next batch is planned for its cut.
  SchedulerConfig estimated = ShortServerWait();
  estimated.plan_lead_ms = -1;
  Fixture automatic(estimated);
  automatic.RegisterHost("s1");
  automatic.RegisterHost("w1");
  REQUIRE(automatic.RegisterServer("demo-token").ok());
  for (int i = 0; i < 2; ++i) {
    REQUIRE(automatic.Submit(automatic.GoodSubmit()).ok());
    automatic.service.RunBatchCycle();
  }
  const ClusterSnapshot later = automatic.service.Snapshot();
  REQUIRE(later.recent_batches.size() == 2);
  CHECK(later.recent_batches[1].planned_at_s == 100.0);
  CHECK(later.recent_cycles[1].lead_ms == 0);
}

TEST_CASE("The links' samples show the reservations of the transfers in flight") {
  Fixture f;
  f.RegisterHost("s1");
  f.RegisterHost("w1");
  REQUIRE(f.RegisterServer("demo-token").ok());
  v1::SubmitUpdateRequest push = f.GoodSubmit();
  push.set_bytes(int64_t{1} << 30);
  REQUIRE(f.Submit(push).ok());
  f.service.RunBatchCycle();  // samples the links, then plans the push
  f.clock.Advance(0.3);
  f.service.RunBatchCycle();  // nothing to plan; the next sample is due
  const ClusterSnapshot snap = f.service.Snapshot();
  REQUIRE(snap.in_flight.size() == 1);
  REQUIRE(snap.link_samples.size() == 2);
  auto use = [&](size_t sample, const std::string& host) {
    for (const LinkSample::Use& u : snap.link_samples[sample].links) {
      if (u.host == host) return u;
    }
    FAIL("no sample of " << host);
    return LinkSample::Use{};
  };
  CHECK(use(0, "w1").up_reserved_bps == 0);
  CHECK(use(1, "w1").up_reserved_bps > 0);
  CHECK(use(1, "s1").down_reserved_bps == use(1, "w1").up_reserved_bps);
  CHECK(use(1, "s1").up_reserved_bps == 0);
}

TEST_CASE("ReportCompletions handles each report as ReportCompletion would, in order") {
  Fixture f;
  f.RegisterHost("s1");
  f.RegisterHost("w1");
  REQUIRE(f.RegisterServer("demo-token").ok());
  uint64_t id = 0;
  REQUIRE(f.Submit(f.GoodSubmit(), &id).ok());
  f.service.RunBatchCycle();
  REQUIRE(f.service.Snapshot().in_flight.size() == 1);
  v1::CompletionReports request;
  request.set_host("s1");
  v1::CompletionReport* applied = request.add_reports();
  applied->set_host("s1");
  applied->set_transfer_id(id);
  applied->set_applied(true);
  applied->set_model_version(1);
  *request.add_reports() = *applied;  // twice: the second finds it ended
  v1::CompletionReport* other_host = request.add_reports();
  *other_host = *applied;
  other_host->set_host("w1");
  v1::CompletionAcks acks;
  REQUIRE(f.service.ReportCompletions(request, &acks).ok());
  REQUIRE(acks.results_size() == 3);
  CHECK(acks.results(0).code() == 0);
  CHECK(acks.results(1).code() == static_cast<int>(absl::StatusCode::kNotFound));
  CHECK(acks.results(2).code() == static_cast<int>(absl::StatusCode::kInvalidArgument));
  CHECK(acks.results(2).message() == "reports[2].host: 'w1' is not the call's host 's1'");
  CHECK(f.service.GetStats().applied == 1);

  v1::CompletionReports too_many;
  too_many.set_host("s1");
  for (int i = 0; i <= SchedulerService::kMaxCompletionReports; ++i) {
    *too_many.add_reports() = *applied;
  }
  v1::CompletionAcks none;
  const absl::Status refused = f.service.ReportCompletions(too_many, &none);
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK(refused.message() == "reports: 4097 in one call, at most 4096");
  CHECK(none.results_size() == 0);
}

TEST_CASE("QueryOutcomes waits while a push is in flight and answers once it ended") {
  Fixture f;
  f.RegisterHost("s1");
  f.RegisterHost("w1");
  REQUIRE(f.RegisterServer("demo-token").ok());
  v1::SubmitUpdateRequest submit = f.GoodSubmit();
  submit.set_worker("w1");
  submit.set_push_uid(0xfeed);
  uint64_t id = 0;
  REQUIRE(f.Submit(submit, &id).ok());
  f.service.RunBatchCycle();  // planned: in flight

  v1::QueryOutcomesRequest query;
  query.set_job("demo");
  query.set_worker("w1");
  query.add_push_uids(0xfeed);
  query.add_push_uids(0xbeef);  // never submitted
  query.set_wait_s(0);
  v1::QueryOutcomesReply now;
  REQUIRE(f.service.QueryOutcomes(query, &now).ok());
  REQUIRE(now.pushes_size() == 2);
  CHECK(now.pushes(0).state() == v1::PushState::STATE_IN_FLIGHT);
  CHECK(now.pushes(0).transfer_id() == id);
  CHECK(now.pushes(1).state() == v1::PushState::STATE_UNKNOWN);

  // A waiting query returns as soon as the server's daemon reports it applied.
  query.set_wait_s(30);
  v1::QueryOutcomesReply later;
  absl::Status asked;
  std::thread asking([&] { asked = f.service.QueryOutcomes(query, &later); });
  // The query counts itself and looks at the push under the service's lock,
  // which it gives up only to wait: once GetStats (same lock) sees it
  // counted, it is waiting, and the report below is what ends the wait.
  const bool waiting =
      WaitFor([&] { return f.service.GetStats().outcome_queries == 2; }, 30);
  v1::CompletionReport report;
  report.set_host("s1");
  report.set_transfer_id(id);
  report.set_applied(true);
  report.set_model_version(1);
  v1::CompletionAck ack;
  const bool reported = f.rpc.ReportCompletion(&f.context, &report, &ack).ok();
  asking.join();
  REQUIRE(waiting);
  REQUIRE(reported);
  REQUIRE(asked.ok());
  REQUIRE(later.pushes_size() == 2);
  CHECK(later.pushes(0).state() == v1::PushState::STATE_ENDED);
  CHECK(later.pushes(0).outcome() == v1::OUTCOME_APPLIED);
  CHECK(later.pushes(0).applied_version() == 1);
  CHECK(f.service.GetStats().outcome_queries == 2);

  v1::QueryOutcomesRequest bad = query;
  bad.set_job("nope");
  CHECK(f.service.QueryOutcomes(bad, &later).code() == absl::StatusCode::kNotFound);
  bad = query;
  bad.set_wait_s(-1);
  CHECK(f.service.QueryOutcomes(bad, &later).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("QueryMembership answers the generation and the sorted live workers") {
  Fixture f;
  f.RegisterHost("h1");
  f.RegisterHost("h2");
  auto register_worker = [&](const std::string& name, const std::string& host) {
    v1::RegisterEntityRequest request;
    request.set_job("demo");
    request.set_job_token("demo-token");
    request.set_role(v1::ROLE_WORKER);
    request.set_name(name);
    request.set_host(host);
    v1::RegisterEntityReply reply;
    return f.rpc.RegisterEntity(&f.context, &request, &reply);
  };
  v1::QueryMembershipRequest query;
  query.set_job("demo");
  query.set_worker("w2");
  v1::QueryMembershipReply reply;
  // Before it registered, the asking worker is refused by name.
  absl::Status status = f.service.QueryMembership(query, &reply);
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(status.message() == "worker 'w2' is not registered with job 'demo'");

  REQUIRE(register_worker("w2", "h1").ok());
  REQUIRE(register_worker("w10", "h2").ok());
  REQUIRE(register_worker("w2", "h1").ok());  // again: no change
  REQUIRE(f.service.QueryMembership(query, &reply).ok());
  CHECK(reply.generation() == 3);  // 1, then one per join
  CHECK(std::vector<std::string>(reply.members().begin(), reply.members().end()) ==
        std::vector<std::string>{"w10", "w2"});

  v1::EntityGoneReport gone;
  gone.set_host("h2");
  gone.set_job("demo");
  gone.set_role(v1::ROLE_WORKER);
  gone.set_name("w10");
  gone.set_reason("its connection to the daemon closed");
  REQUIRE(f.service.ReportEntityGone(gone).ok());
  reply.Clear();
  REQUIRE(f.service.QueryMembership(query, &reply).ok());
  CHECK(reply.generation() == 4);
  CHECK(std::vector<std::string>(reply.members().begin(), reply.members().end()) ==
        std::vector<std::string>{"w2"});
  // A worker that left may still ask: it learns it is no member.
  query.set_worker("w10");
  reply.Clear();
  REQUIRE(f.service.QueryMembership(query, &reply).ok());
  CHECK(reply.members_size() == 1);

  v1::QueryMembershipRequest bad = query;
  bad.set_job("nope");
  status = f.service.QueryMembership(bad, &reply);
  CHECK(status.code() == absl::StatusCode::kNotFound);
  CHECK(status.message() == "unknown job 'nope'");
  bad = query;
  bad.set_worker("");
  CHECK(f.service.QueryMembership(bad, &reply).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Bad submits get INVALID_ARGUMENT and good ones still pass") {
  Fixture f;
  f.RegisterHost("s1");
  f.RegisterHost("w1");
  REQUIRE(f.RegisterServer("demo-token").ok());

  auto request = f.GoodSubmit();
  request.set_bytes(-5);
  auto status = f.Submit(request);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message().find("bytes") != std::string::npos);

  request = f.GoodSubmit();
  request.set_bytes(int64_t{1} << 50);
  status = f.Submit(request);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message().find("max_update_bytes") != std::string::npos);

  request = f.GoodSubmit();
  request.set_job("ghost");
  status = f.Submit(request);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message().find("unknown job 'ghost'") != std::string::npos);

  request = f.GoodSubmit();
  request.set_norm(std::nan(""));
  CHECK(f.Submit(request).error_code() == grpc::StatusCode::INVALID_ARGUMENT);

  request = f.GoodSubmit();
  request.add_tensors()->set_bytes(100);
  status = f.Submit(request);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message().find("tensors") != std::string::npos);

  request = f.GoodSubmit();
  request.set_server("ps9");
  CHECK(f.Submit(request).error_code() == grpc::StatusCode::FAILED_PRECONDITION);

  uint64_t first = 0, second = 0;
  REQUIRE(f.Submit(f.GoodSubmit(), &first).ok());
  REQUIRE(f.Submit(f.GoodSubmit(), &second).ok());
  CHECK(second == first + 1);
  CHECK(f.service.GetStats().rejected == 6);
}

TEST_CASE("ResolveServer finds the server's host and address") {
  Fixture f;
  f.RegisterHost("s1");
  REQUIRE(f.RegisterServer("demo-token").ok());
  v1::ResolveServerRequest request;
  request.set_job("demo");
  request.set_server("ps0");
  v1::ResolveServerReply reply;
  REQUIRE(f.rpc.ResolveServer(&f.context, &request, &reply).ok());
  CHECK(reply.host() == "s1");
  CHECK(reply.data_address() == "127.0.0.1:1");
  request.set_server("ps1");
  CHECK(f.rpc.ResolveServer(&f.context, &request, &reply).error_code() ==
        grpc::StatusCode::NOT_FOUND);
}

TEST_CASE("A server whose application leaves fails over to its replica; the old one cannot return") {
  Fixture f;
  f.RegisterHost("s1");
  f.RegisterHost("r1");
  f.RegisterHost("w1");
  REQUIRE(f.RegisterServer("demo-token").ok());
  v1::RegisterEntityRequest replica;
  replica.set_job("demo");
  replica.set_job_token("demo-token");
  replica.set_role(v1::ROLE_REPLICA);
  replica.set_name("ps0");
  replica.set_host("r1");
  v1::RegisterEntityReply registered;
  REQUIRE(f.rpc.RegisterEntity(&f.context, &replica, &registered).ok());
  uint64_t waiting = 0;
  REQUIRE(f.Submit(f.GoodSubmit(), &waiting).ok());

  v1::ResolveServerRequest where;
  where.set_job("demo");
  where.set_server("ps0");
  v1::ResolveServerReply found;
  REQUIRE(f.service.ResolveServer(where, &found).ok());
  CHECK(found.host() == "s1");
  CHECK(found.has_replica());

  v1::EntityGoneReport gone;
  gone.set_host("r1");  // not where the server is: refused, nothing moves
  gone.set_job("demo");
  gone.set_role(v1::ROLE_SERVER);
  gone.set_name("ps0");
  gone.set_reason("connection closed");
  CHECK(f.service.ReportEntityGone(gone).code() == absl::StatusCode::kFailedPrecondition);
  gone.set_host("s1");
  REQUIRE(f.service.ReportEntityGone(gone).ok());

  REQUIRE(f.service.ResolveServer(where, &found).ok());
  CHECK(found.host() == "r1");
  CHECK_FALSE(found.has_replica());
  ClusterSnapshot snap = f.service.Snapshot();
  REQUIRE(snap.jobs.size() == 1);
  REQUIRE(snap.jobs[0].failovers.size() == 1);
  CHECK(snap.jobs[0].failovers[0].from_host == "s1");
  CHECK(snap.jobs[0].failovers[0].to_host == "r1");
  CHECK(snap.jobs[0].failovers[0].reason.find("its application left host s1") != std::string::npos);
  // The push that was waiting is planned to the new server.
  f.clock.Advance(0.2);
  f.service.RunBatchCycle();
  snap = f.service.Snapshot();
  REQUIRE(snap.in_flight.size() == 1);
  CHECK(snap.in_flight[0].transfer_id == waiting);
  CHECK(snap.in_flight[0].dst == "r1");

  // The old server coming back would replace the served model: refused.
  const grpc::Status back = f.RegisterServer("demo-token");
  CHECK(back.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(back.error_message().find("failed over to host r1") != std::string::npos);
  // A replica that leaves just stops the copies.
  replica.set_host("w1");
  REQUIRE(f.rpc.RegisterEntity(&f.context, &replica, &registered).ok());
  gone.set_host("w1");
  gone.set_role(v1::ROLE_REPLICA);
  REQUIRE(f.service.ReportEntityGone(gone).ok());
  REQUIRE(f.service.ResolveServer(where, &found).ok());
  CHECK_FALSE(found.has_replica());
}

SchedulerConfig TwoJobs() {
  SchedulerConfig config;
  config.planner_threads = 2;
  config.transfer_slack_s = 2.0;
  JobConfig a{"a", "token-a", 10, JobMode::kAsync};
  JobConfig b{"b", "token-b", 5, JobMode::kSsp};
  b.staleness_k = 2;
  b.priority_class = 1;
  config.jobs = {a, b};
  return config;
}

struct MultiJob {
  FakeClock clock{50.0};
  SchedulerService service{TwoJobs(), &clock, std::make_unique<core::FifoPlanner>()};
  Handlers rpc{&service};
  grpc::ServerContext context;

  void Host(const std::string& name) {
    v1::RegisterHostRequest request;
    request.set_protocol_version(1);
    request.set_host(name);
    request.set_data_address("127.0.0.1:1");
    v1::RegisterHostReply reply;
    REQUIRE(rpc.RegisterHost(&context, &request, &reply).ok());
  }
  grpc::Status Server(const std::string& job, const std::string& token, const std::string& name,
                      const std::string& host) {
    v1::RegisterEntityRequest request;
    request.set_job(job);
    request.set_job_token(token);
    request.set_role(v1::ROLE_SERVER);
    request.set_name(name);
    request.set_host(host);
    v1::RegisterEntityReply reply;
    return rpc.RegisterEntity(&context, &request, &reply);
  }
  grpc::Status Push(const std::string& job, const std::string& server, int64_t bytes = 1000000) {
    v1::SubmitUpdateRequest request;
    request.set_job(job);
    request.set_src_host("w1");
    request.set_server(server);
    request.set_bytes(bytes);
    v1::SubmitUpdateReply reply;
    return rpc.SubmitUpdate(&context, &request, &reply);
  }
};

TEST_CASE("Jobs are isolated: own token, own servers") {
  MultiJob f;
  f.Host("s1");
  f.Host("w1");
  CHECK(f.Server("a", "token-b", "psA", "s1").error_code() == grpc::StatusCode::PERMISSION_DENIED);
  REQUIRE(f.Server("a", "token-a", "psA", "s1").ok());
  REQUIRE(f.Server("b", "token-b", "psB", "s1").ok());
  auto status = f.Push("a", "psB");
  CHECK(status.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK(status.error_message().find("belongs to job 'b'") != std::string::npos);
  CHECK(f.Push("a", "psA").ok());
  CHECK(f.Push("b", "psB").ok());

  ClusterSnapshot snap = f.service.Snapshot();
  REQUIRE(snap.jobs.size() == 2);
  CHECK(snap.jobs[1].params.mode == JobMode::kSsp);
  CHECK(snap.jobs[1].params.token.empty());
  CHECK(snap.planner_threads == 2);
}

TEST_CASE("Both servers' batches are planned in one cycle, with timings and the reported view") {
  MultiJob f;
  f.Host("s1");
  f.Host("w1");
  REQUIRE(f.Server("a", "token-a", "psA", "s1").ok());
  REQUIRE(f.Server("b", "token-b", "psB", "s1").ok());
  v1::BandwidthReport report;
  report.set_host("w1");
  report.set_uplink_bps(1e9);
  report.set_downlink_bps(2e9);
  v1::BandwidthAck ack;
  REQUIRE(f.rpc.ReportBandwidth(&f.context, &report, &ack).ok());
  REQUIRE(f.Push("a", "psA").ok());
  REQUIRE(f.Push("b", "psB").ok());
  f.service.RunBatchCycle();
  ClusterSnapshot snap = f.service.Snapshot();
  REQUIRE(snap.recent_batches.size() == 2);
  // Priority class 0 (job a) first.
  CHECK(snap.recent_batches[0].job == "a");
  for (const BatchView& batch : snap.recent_batches) {
    CHECK(batch.compute_ms >= 0);
    REQUIRE(batch.transfers.size() == 1);
    // The planner got the reported uplink and planned at it: 8e6 bits at 1 Gbit/s.
    CHECK(batch.transfers[0].segments.at(0).rate_bps == 1e9);
    CHECK(batch.transfers[0].end_s - batch.transfers[0].start_s == Approx(0.008));
    bool saw_w1 = false;
    for (const core::HostLink& host : batch.network) {
      if (host.name == "w1") saw_w1 = host.uplink_bps == 1e9;
    }
    CHECK(saw_w1);
  }
  CHECK(snap.in_flight.size() == 2);
  CHECK(snap.stats.batches == 1);
}

TEST_CASE("An in-flight transfer past its planned end plus slack fails as timed out") {
  MultiJob f;
  f.Host("s1");
  f.Host("w1");
  REQUIRE(f.Server("a", "token-a", "psA", "s1").ok());
  REQUIRE(f.Push("a", "psA").ok());
  f.service.RunBatchCycle();
  REQUIRE(f.service.Snapshot().in_flight.size() == 1);
  f.clock.Advance(1.0);  // within slack (2 s)
  f.service.RunBatchCycle();
  CHECK(f.service.GetStats().timed_out == 0);
  f.clock.Advance(1.5);
  f.service.RunBatchCycle();
  CHECK(f.service.GetStats().timed_out == 1);
  // Its bytes may be at s1's daemon: it fails once that daemon confirms it
  // skipped it (FailWhenCancelled), not before.
  CHECK(f.service.GetStats().failed == 0);
  REQUIRE(f.service.Snapshot().in_flight.size() == 1);
  v1::CompletionReport skipped;
  skipped.set_host("s1");
  skipped.set_transfer_id(f.service.Snapshot().in_flight[0].transfer_id);
  skipped.set_error("skipped");
  REQUIRE(f.service.ReportCompletion(skipped).ok());
  ClusterSnapshot snap = f.service.Snapshot();
  CHECK(snap.stats.timed_out == 1);
  CHECK(snap.stats.failed == 1);
  CHECK(snap.in_flight.empty());
  CHECK(snap.drops_by_category["timed_out"] == 1);
  REQUIRE(snap.recent_drops.size() == 1);
  CHECK(snap.recent_drops[0].reason.find("timed out") == 0);
  // The server is not stalled: the next push is planned.
  REQUIRE(f.Push("a", "psA").ok());
  f.service.RunBatchCycle();
  CHECK(f.service.Snapshot().in_flight.size() == 1);
}

TEST_CASE("A push waits for its server to register (workers may start first)") {
  MultiJob f;
  f.Host("s1");
  f.Host("w1");
  grpc::Status pushed;
  std::thread push([&] { pushed = f.Push("a", "psA"); });
  // The server registers only once the push is waiting for it: the push
  // counts its wait under the service's lock, which it gives up only to
  // wait, so once GetStats (same lock) sees the count it is waiting.
  const bool waiting =
      WaitFor([&] { return f.service.GetStats().server_waits == 1; }, 30);
  const grpc::Status registered = f.Server("a", "token-a", "psA", "s1");
  push.join();
  REQUIRE(waiting);
  REQUIRE(registered.ok());
  CHECK(pushed.ok());
  CHECK(f.service.GetStats().rejected == 0);
}

TEST_CASE("Admin actions: job parameters and draining") {
  MultiJob f;
  f.Host("s1");
  f.Host("w1");
  REQUIRE(f.Server("a", "token-a", "psA", "s1").ok());
  JobParamsUpdate update;
  update.tau_max = 7;
  update.momentum = 0.9;
  REQUIRE(f.service.UpdateJobParams("a", update).ok());
  CHECK(f.service.Snapshot().jobs[0].params.tau_max == 7);
  update.momentum = 1.5;
  auto status = f.service.UpdateJobParams("a", update);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("momentum") != std::string::npos);
  CHECK(f.service.UpdateJobParams("zzz", {}).code() == absl::StatusCode::kNotFound);
  REQUIRE(f.service.DrainHost("w1", true).ok());
  CHECK(f.Push("a", "psA").error_code() == grpc::StatusCode::UNAVAILABLE);
  REQUIRE(f.service.DrainHost("w1", false).ok());
  CHECK(f.Push("a", "psA").ok());
}

}  // namespace
}  // namespace mlfabric

namespace mlfabric {
namespace {

TEST_CASE("float32 and float64 updates can share in-network aggregates; nothing else can") {
  // DTYPE_FLOAT32 is the proto's 0: it must not read as "not summable".
  CHECK(AggregatableElementType(v1::DTYPE_FLOAT32) != 0);
  CHECK(AggregatableElementType(v1::DTYPE_FLOAT64) != 0);
  CHECK(AggregatableElementType(v1::DTYPE_FLOAT32) !=
        AggregatableElementType(v1::DTYPE_FLOAT64));
  CHECK(AggregatableElementType(v1::DTYPE_INT32) == 0);
  CHECK(AggregatableElementType(v1::DTYPE_INT64) == 0);
  CHECK(AggregatableElementType(v1::DTYPE_OPAQUE) == 0);
}

}  // namespace
}  // namespace mlfabric

namespace mlfabric {
namespace {

// Registers hosts `hosts` (data address 127.0.0.1:1) and job demo's
// synchronous-round server "root" on s1, summing `round_size` pushes.
void RegisterRoundRoot(Handlers& rpc, std::initializer_list<const char*> hosts, int round_size) {
  grpc::ServerContext context;
  for (const char* name : hosts) {
    v1::RegisterHostRequest request;
    request.set_protocol_version(1);
    request.set_host(name);
    request.set_data_address("127.0.0.1:1");
    v1::RegisterHostReply reply;
    REQUIRE(rpc.RegisterHost(&context, &request, &reply).ok());
  }
  v1::RegisterEntityRequest server;
  server.set_job("demo");
  server.set_job_token("demo-token");
  server.set_role(v1::ROLE_SERVER);
  server.set_name("root");
  server.set_host("s1");
  server.set_round_size(round_size);
  v1::RegisterEntityReply registered;
  REQUIRE(rpc.RegisterEntity(&context, &server, &registered).ok());
}

TEST_CASE("A synchronous round is planned as soon as its last push arrives, not at the tick") {
  SchedulerConfig config = DemoJob();
  config.batch_interval_ms = 3600e3;  // an hour: only the early wake-up can plan in time
  FakeClock clock{10.0};
  SchedulerService service{config, &clock, std::make_unique<core::FifoPlanner>()};
  Handlers rpc{&service};
  grpc::ServerContext context;
  RegisterRoundRoot(rpc, {"s1", "w1", "w2"}, 2);
  service.Start();
  auto push = [&](const std::string& worker) {
    v1::SubmitUpdateRequest request;
    request.set_job("demo");
    request.set_src_host(worker);
    request.set_worker(worker);
    request.set_server("root");
    request.set_bytes(4096);
    request.set_version(0);
    v1::SubmitUpdateReply reply;
    REQUIRE(rpc.SubmitUpdate(&context, &request, &reply).ok());
  };
  auto planned = [&] { return service.Snapshot().in_flight.size(); };
  push("w1");
  // One of two: the round is not complete, nothing wakes the loop.
  CHECK(planned() == 0);
  push("w2");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (planned() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(planned() == 2);
  CHECK(service.GetStats().batches == 1);
  service.Stop();
}

}  // namespace
}  // namespace mlfabric

namespace mlfabric {
namespace {

TEST_CASE("A worker pushing much less often than its peers is flagged as a straggler") {
  Fixture f;
  f.RegisterHost("s1");
  f.RegisterHost("w1");
  REQUIRE(f.RegisterServer("demo-token").ok());
  // w0 and w1 push every 100 ms, slow every 400 ms (a straggler at factor 1.5).
  for (int tick = 0; tick < 40; ++tick) {
    for (const char* worker : {"w0", "w1", "slow"}) {
      if (std::string(worker) == "slow" && tick % 4 != 0) continue;
      v1::SubmitUpdateRequest request = f.GoodSubmit();
      request.set_worker(worker);
      REQUIRE(f.Submit(request).ok());
    }
    f.clock.Advance(0.1);
  }
  const ClusterSnapshot snap = f.service.Snapshot();
  REQUIRE(snap.jobs.size() == 1);
  std::map<std::string, WorkerTiming> by_name;
  for (const WorkerTiming& w : snap.jobs[0].workers) by_name[w.worker] = w;
  REQUIRE(by_name.size() == 3);
  CHECK(by_name["slow"].straggler);
  CHECK(by_name["slow"].iterations == 10);
  CHECK(by_name["slow"].iteration_s == Approx(0.4));
  CHECK(by_name["slow"].slowdown == Approx(4.0));
  CHECK_FALSE(by_name["w0"].straggler);
  CHECK(by_name["w0"].iterations == 40);
  CHECK(by_name["w0"].iteration_s == Approx(0.1));
}

}  // namespace
}  // namespace mlfabric

namespace mlfabric {
namespace {

TEST_CASE("Backup workers: a round closes with its first M - b pushes; later ones are late") {
  SchedulerConfig config = DemoJob();
  config.batch_interval_ms = 3600e3;  // only the round's early wake-up plans
  FakeClock clock{10.0};
  SchedulerService service{config, &clock, std::make_unique<core::FifoPlanner>()};
  Handlers rpc{&service};
  grpc::ServerContext context;
  for (const char* name : {"s1", "w1", "w2", "w3"}) {
    v1::RegisterHostRequest request;
    request.set_protocol_version(1);
    request.set_host(name);
    request.set_data_address("127.0.0.1:1");
    v1::RegisterHostReply reply;
    REQUIRE(rpc.RegisterHost(&context, &request, &reply).ok());
  }
  v1::RegisterEntityRequest server;
  server.set_job("demo");
  server.set_job_token("demo-token");
  server.set_role(v1::ROLE_SERVER);
  server.set_name("root");
  server.set_host("s1");
  server.set_round_size(3);
  server.set_backup_workers(3);  // must leave at least one push
  v1::RegisterEntityReply registered;
  grpc::Status bad = rpc.RegisterEntity(&context, &server, &registered);
  CHECK(bad.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(bad.error_message().find("backup_workers 3 must be in [0, round_size 3)") !=
        std::string::npos);
  server.set_backup_workers(1);
  REQUIRE(rpc.RegisterEntity(&context, &server, &registered).ok());
  service.Start();
  auto push = [&](const std::string& worker) {
    v1::SubmitUpdateRequest request;
    request.set_job("demo");
    request.set_src_host(worker);
    request.set_worker(worker);
    request.set_server("root");
    request.set_bytes(4096);
    request.set_version(0);
    v1::SubmitUpdateReply reply;
    REQUIRE(rpc.SubmitUpdate(&context, &request, &reply).ok());
  };
  push("w1");
  push("w2");  // 2 of 3 with one backup: the round is complete and planned
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (service.Snapshot().in_flight.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(service.Snapshot().in_flight.size() == 2);
  push("w3");  // late: dropped when the next batch is cut (cut one now)
  service.Stop();
  service.RunBatchCycle();
  bool late = false;
  for (const DropView& d : service.Snapshot().recent_drops) {
    if (d.category == "late_for_round" &&
        d.reason.find("round 0 closed with its first 2 pushes") != std::string::npos) {
      late = true;
    }
  }
  CHECK(late);
}

TEST_CASE("A member of a failed round hears why, even after later rounds failed too") {
  // A host whose ranks disagree spoils its AllReduce rounds (an opaque push)
  // without waiting: rounds 0 and 1 fail at once and the server moves on to
  // version 2 before the other host's push for round 0 arrives.
  SchedulerConfig config = DemoJob();
  config.batch_interval_ms = 3600e3;
  FakeClock clock{10.0};
  SchedulerService service{config, &clock, std::make_unique<core::FifoPlanner>()};
  Handlers rpc{&service};
  grpc::ServerContext context;
  RegisterRoundRoot(rpc, {"s1", "w1", "w2"}, 2);
  auto push = [&](const std::string& worker, int64_t round, v1::DType dtype) {
    v1::SubmitUpdateRequest request;
    request.set_job("demo");
    request.set_src_host(worker);
    request.set_worker(worker);
    request.set_server("root");
    request.set_bytes(dtype == v1::DTYPE_OPAQUE ? 1 : 4096);
    request.set_version(round);
    request.set_dtype(dtype);
    v1::SubmitUpdateReply reply;
    REQUIRE(rpc.SubmitUpdate(&context, &request, &reply).ok());
    service.RunBatchCycle();
    return reply.transfer_id();
  };
  push("w2", 0, v1::DTYPE_OPAQUE);
  push("w2", 1, v1::DTYPE_OPAQUE);
  const uint64_t late = push("w1", 0, v1::DTYPE_FLOAT32);
  const uint64_t later = push("w1", 1, v1::DTYPE_FLOAT32);
  int told = 0;
  for (const DropView& d : service.Snapshot().recent_drops) {
    if (d.transfer_id != late && d.transfer_id != later) continue;
    INFO(d.reason);
    CHECK(d.outcome == "failed");
    CHECK(d.reason.find("is opaque bytes") != std::string::npos);
    ++told;
  }
  CHECK(told == 2);
}

TEST_CASE("tensor shapes: a round's pushes of equal bytes in different shapes all fail") {
  SchedulerConfig config = DemoJob();
  config.batch_interval_ms = 3600e3;
  FakeClock clock{10.0};
  SchedulerService service{config, &clock, std::make_unique<core::FifoPlanner>()};
  Handlers rpc{&service};
  grpc::ServerContext context;
  RegisterRoundRoot(rpc, {"s1", "w1", "w2", "w3"}, 3);
  // A push of 12 float32 naming `dims` (none when nullopt).
  auto push = [&](const std::string& worker, int64_t round,
                  std::optional<std::vector<int64_t>> dims) -> absl::StatusOr<uint64_t> {
    v1::SubmitUpdateRequest request;
    request.set_job("demo");
    request.set_src_host(worker);
    request.set_worker(worker);
    request.set_server("root");
    request.set_bytes(48);
    request.set_version(round);
    request.set_dtype(v1::DTYPE_FLOAT32);
    if (dims.has_value()) {
      v1::TensorShape* shape = request.mutable_shape();
      for (int64_t d : *dims) shape->add_dims(d);
    }
    v1::SubmitUpdateReply reply;
    grpc::Status status = rpc.SubmitUpdate(&context, &request, &reply);
    if (!status.ok()) return absl::InvalidArgumentError(status.error_message());
    return reply.transfer_id();
  };
  auto reason_of = [&](uint64_t id) -> std::string {
    for (const DropView& d : service.Snapshot().recent_drops) {
      if (d.transfer_id == id) return d.outcome + ": " + d.reason;
    }
    return "";
  };
  // w3 names no shape (it agrees with any); w2's differs from w1's.
  auto none = push("w3", 0, std::nullopt);
  auto first = push("w1", 0, std::vector<int64_t>{2, 6});
  auto odd = push("w2", 0, std::vector<int64_t>{12});
  REQUIRE(none.ok());
  REQUIRE(first.ok());
  REQUIRE(odd.ok());
  service.RunBatchCycle();
  for (uint64_t id : {*none, *first, *odd}) {
    const std::string reason = reason_of(id);
    INFO(id << ": " << reason);
    CHECK(reason.rfind("failed: ", 0) == 0);
    CHECK(reason.find("mismatch: push " + std::to_string(*odd) +
                      " from 'w2' has shape [12] but round 0 sums shape [2, 6] from 'w1'") !=
          std::string::npos);
  }
  // A shape with a negative dimension is refused at submission, naming it.
  auto negative = push("w1", 1, std::vector<int64_t>{3, -4});
  CHECK(!negative.ok());
  CHECK(std::string(negative.status().message()).find("shape: [3, -4] has a negative dimension") !=
        std::string::npos);
}

}  // namespace
TEST_CASE("get_reservations: a planned distribution's streams are reserved until they end") {
  for (bool reserve : {false, true}) {
    SchedulerConfig config = ShortServerWait();
    config.get_reservations = reserve;
    config.default_link_bps = 8e6;  // 1 MB/s: a 100 kB model takes 0.1 s
    Fixture f(config);
    for (const char* name : {"s1", "w1", "w2"}) f.RegisterHost(name);
    REQUIRE(f.RegisterServer("demo-token").ok());
    v1::PlanDistributionRequest request;
    request.set_host("s1");
    request.set_job("demo");
    request.set_server("ps0");
    request.set_model_bytes(100000);
    request.add_requesters("w1");
    request.add_requesters("w2");
    v1::PlanDistributionReply reply;
    REQUIRE(f.service.PlanDistribution(request, &reply).ok());
    auto reserved = [&](const std::string& host, bool up) {
      for (const HostView& h : f.service.Snapshot().hosts) {
        if (h.name == host) return up ? h.reserved_up_bps : h.reserved_down_bps;
      }
      FAIL("no host " << host);
      return 0.0;
    };
    // Both requesters receive, and the server's uplink sends, while the
    // plan's streams last (at most 2 x 0.1 s here).
    f.clock.Set(100.05);
    CHECK((reserved("s1", true) > 0) == reserve);
    CHECK((reserved("w1", false) > 0) == reserve);
    CHECK((reserved("w2", false) > 0) == reserve);
    f.clock.Set(101.0);  // every stream has ended
    CHECK(reserved("s1", true) == 0);
    CHECK(reserved("w1", false) == 0);
  }
}

}  // namespace mlfabric
