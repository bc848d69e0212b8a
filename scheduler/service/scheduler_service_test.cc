// Handler-level tests of SchedulerService (no sockets): validation of every
// request a daemon can send. Dispatch across processes is covered by
// tests/push_get_test.
#include "scheduler/service/scheduler_service.h"

#include <catch2/catch.hpp>

#include "scheduler/core/fifo_planner.h"

namespace mlfabric {
namespace {

struct Fixture {
  FakeClock clock{100.0};
  SchedulerService service{SchedulerConfig{}, &clock, std::make_unique<core::FifoPlanner>()};
  grpc::ServerContext context;

  void RegisterHost(const std::string& name) {
    v1::RegisterHostRequest request;
    request.set_protocol_version(1);
    request.set_host(name);
    request.set_data_address("127.0.0.1:1");
    v1::RegisterHostReply reply;
    REQUIRE(service.RegisterHost(&context, &request, &reply).ok());
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
    return service.RegisterEntity(&context, &request, &reply);
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
    grpc::Status status = service.SubmitUpdate(&context, &request, &reply);
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
  auto status = f.service.RegisterEntity(&f.context, &request, &reply);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message().find("unknown job 'nope'") != std::string::npos);

  v1::RegisterHostRequest old_protocol;
  old_protocol.set_protocol_version(7);
  old_protocol.set_host("x");
  v1::RegisterHostReply host_reply;
  CHECK(f.service.RegisterHost(&f.context, &old_protocol, &host_reply).error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);
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
  REQUIRE(f.service.ResolveServer(&f.context, &request, &reply).ok());
  CHECK(reply.host() == "s1");
  CHECK(reply.data_address() == "127.0.0.1:1");
  request.set_server("ps1");
  CHECK(f.service.ResolveServer(&f.context, &request, &reply).error_code() ==
        grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace mlfabric
