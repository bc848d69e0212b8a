// The schedule stream (grpc_service.cc's CommandStream) over a real gRPC
// call in this process: a callback stream that writes what the host's
// outbox holds, in order; ends on the daemon's side mark the host down, a
// new registration or the scheduler's stop end it quietly; and an idle
// stream holds no thread.
#include "scheduler/service/grpc_service.h"
#include "scheduler/service/scheduler_service.h"

#include <dirent.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "scheduler/core/fifo_planner.h"
#include "testing/wait_for.h"

namespace mlfabric {
namespace {

using ::mlfabric::testing::WaitFor;

int ThreadsOfThisProcess() {
  int n = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

v1::DaemonCommand Outcome(uint64_t id) {
  v1::DaemonCommand command;
  command.mutable_outcome()->set_transfer_id(id);
  return command;
}

// The service behind a real gRPC server, reached in-process.
struct Fixture {
  Fixture() : service(Config(), &clock, std::make_unique<core::FifoPlanner>()), face(&service) {
    grpc::ServerBuilder builder;
    builder.RegisterService(&face);
    server = builder.BuildAndStart();
    REQUIRE(server != nullptr);
    stub = v1::Scheduler::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
  }
  ~Fixture() {
    service.outbox().Stop();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }
  static SchedulerConfig Config() {
    SchedulerConfig config;
    config.jobs = {{"demo", "demo-token", 30, JobMode::kAsync}};
    return config;
  }

  uint64_t Register(const std::string& host) {
    v1::RegisterHostRequest request;
    request.set_protocol_version(1);
    request.set_host(host);
    request.set_data_address("127.0.0.1:1");
    v1::RegisterHostReply reply;
    grpc::ClientContext context;
    REQUIRE(stub->RegisterHost(&context, request, &reply).ok());
    return reply.incarnation();
  }

  std::unique_ptr<grpc::ClientReader<v1::DaemonCommand>> Open(grpc::ClientContext* context,
                                                              const std::string& host,
                                                              uint64_t incarnation) {
    v1::StreamSchedulesRequest request;
    request.set_host(host);
    request.set_incarnation(incarnation);
    return stub->StreamSchedules(context, request);
  }

  // Whether the scheduler counts `host` as up: a push from it is taken.
  bool Up(const std::string& host) {
    v1::RegisterEntityRequest server;
    server.set_job("demo");
    server.set_job_token("demo-token");
    server.set_role(v1::ROLE_SERVER);
    server.set_name("ps0");
    server.set_host("s1");
    v1::RegisterEntityReply registered;
    (void)service.RegisterEntity(server, &registered);  // once; later calls refused, no matter
    v1::SubmitUpdateRequest push;
    push.set_job("demo");
    push.set_src_host(host);
    push.set_server("ps0");
    push.set_bytes(4096);
    push.set_norm(1.0);
    v1::SubmitUpdateReply reply;
    const absl::Status status = service.SubmitUpdate(push, &reply);
    INFO(status.ToString());
    // Down: refused as such, or as no longer registered.
    CHECK((status.ok() || absl::IsUnavailable(status) || absl::IsFailedPrecondition(status)));
    return status.ok();
  }

  FakeClock clock{100.0};
  SchedulerService service;
  SchedulerGrpcService face;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Scheduler::Stub> stub;
};

TEST_CASE("a stream writes its host's commands in order, those queued before it opened too") {
  Fixture f;
  const uint64_t incarnation = f.Register("w1");
  f.Register("s1");
  f.service.outbox().Push("w1", Outcome(1));
  grpc::ClientContext context;
  auto reader = f.Open(&context, "w1", incarnation);
  std::vector<uint64_t> ids;
  v1::DaemonCommand command;
  while (ids.size() < 3 && reader->Read(&command)) {
    if (command.has_outcome()) ids.push_back(command.outcome().transfer_id());
    if (ids.size() == 1) {  // the rest after the stream began, one under a hold
      f.service.outbox().Push("w1", Outcome(2));
      const CommandOutbox::WakeupHold hold(&f.service.outbox());
      f.service.outbox().Push("w1", Outcome(3));
    }
  }
  CHECK(ids == std::vector<uint64_t>{1, 2, 3});
  CHECK(f.Up("w1"));
  // The daemon goes away: its host is marked down without anything queued
  // to wake the stream.
  context.TryCancel();
  CHECK(WaitFor([&] { return !f.Up("w1"); }, 30));
}

TEST_CASE("a stream of an unregistered incarnation is refused") {
  Fixture f;
  const uint64_t incarnation = f.Register("w1");
  grpc::ClientContext context;
  auto reader = f.Open(&context, "w1", incarnation + 1);
  v1::DaemonCommand command;
  CHECK_FALSE(reader->Read(&command));
  const grpc::Status status = reader->Finish();
  CHECK(status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(status.error_message() == "host 'w1' must RegisterHost before streaming schedules");
}

TEST_CASE("a new registration and the scheduler's stop end streams quietly") {
  Fixture f;
  f.Register("s1");
  const uint64_t first = f.Register("w1");
  grpc::ClientContext old_context;
  auto old_reader = f.Open(&old_context, "w1", first);
  f.service.outbox().Push("w1", Outcome(1));
  v1::DaemonCommand command;
  REQUIRE(old_reader->Read(&command));  // the stream is up

  const uint64_t second = f.Register("w1");
  REQUIRE(second != first);
  // The old stream ends OK, and its end does not mark the new one down.
  while (old_reader->Read(&command)) {
  }
  CHECK(old_reader->Finish().ok());
  CHECK(f.Up("w1"));

  grpc::ClientContext context;
  auto reader = f.Open(&context, "w1", second);
  f.service.outbox().Push("w1", Outcome(2));
  REQUIRE(reader->Read(&command));
  f.service.outbox().Stop();
  while (reader->Read(&command)) {
  }
  CHECK(reader->Finish().ok());
}

TEST_CASE("two hundred idle streams hold no thread each") {
  Fixture f;
  constexpr int kHosts = 200;
  grpc::CompletionQueue cq;
  struct Call {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientAsyncReader<v1::DaemonCommand>> reader;
    v1::DaemonCommand command;
  };
  std::vector<std::unique_ptr<Call>> calls;
  const int threads_before = ThreadsOfThisProcess();
  for (int i = 0; i < kHosts; ++i) {
    const std::string host = "h" + std::to_string(i);
    v1::StreamSchedulesRequest request;
    request.set_host(host);
    request.set_incarnation(f.Register(host));
    auto call = std::make_unique<Call>();
    call->reader = f.stub->PrepareAsyncStreamSchedules(&call->context, request, &cq);
    call->reader->StartCall(call.get());
    calls.push_back(std::move(call));
  }
  auto next = [&cq] {
    void* tag = nullptr;
    bool ok = false;
    REQUIRE(cq.Next(&tag, &ok));
    return std::make_pair(static_cast<Call*>(tag), ok);
  };
  for (int i = 0; i < kHosts; ++i) REQUIRE(next().second);  // every call started
  // Every stream is live: a command for each host reaches it.
  for (int i = 0; i < kHosts; ++i) {
    f.service.outbox().Push("h" + std::to_string(i), Outcome(1000 + i));
    calls[i]->reader->Read(&calls[i]->command, calls[i].get());
  }
  std::vector<uint64_t> got;  // each stream's outcome, after the job's priority class
  while (got.size() < kHosts) {
    auto [call, ok] = next();
    REQUIRE(ok);
    if (call->command.has_outcome()) {
      got.push_back(call->command.outcome().transfer_id());
    } else {
      call->reader->Read(&call->command, call);
    }
  }
  std::sort(got.begin(), got.end());
  std::vector<uint64_t> want;
  for (int i = 0; i < kHosts; ++i) want.push_back(1000 + i);
  CHECK(got == want);
  const int threads_after = ThreadsOfThisProcess();
  INFO(kHosts << " open streams: " << threads_before << " threads before, " << threads_after
              << " after");
  // A thread per stream would add 200; gRPC's own pools stay small.
  CHECK(threads_after - threads_before < kHosts / 4);
  for (auto& call : calls) call->context.TryCancel();
  std::vector<grpc::Status> ends(kHosts);
  for (int i = 0; i < kHosts; ++i) calls[i]->reader->Finish(&ends[i], calls[i].get());
  for (int i = 0; i < kHosts; ++i) next();
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace mlfabric
