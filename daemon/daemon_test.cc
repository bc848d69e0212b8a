// The daemon in-process with a fake scheduler (no gRPC, no scheduler
// process), its applications on its real local socket: what a push
// becomes, and that a submission the scheduler holds up does not hold up
// the command stream (no lock is held across the SubmitUpdate RPC that
// every command would also take).
#include "daemon/daemon.h"

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <catch2/catch.hpp>

#include "daemon/control/fake_scheduler_client.h"

namespace mlfabric {
namespace {

using daemon::FakeSchedulerClient;

// A local application on the daemon's socket, speaking the protocol the
// C++ API speaks (ipc/local_ipc.h).
class App {
 public:
  App(const std::string& socket, const std::string& name, v1::Role role = v1::ROLE_WORKER) {
    auto fd = LocalChannel::Connect(socket, 10.0);
    REQUIRE(fd.ok());
    channel_ = std::make_unique<LocalChannel>(*fd);
    v1::LocalMessage hello;
    v1::LocalRegister* reg = hello.mutable_register_();
    reg->set_job("job");
    reg->set_job_token("token");
    reg->set_name(name);
    reg->set_role(role);
    REQUIRE(channel_->Send(hello).ok());
    v1::LocalMessage reply = Next();
    REQUIRE(reply.has_registered());
    REQUIRE(reply.registered().error().empty());
  }
  // Pushes `bytes` bytes (in shared memory unless `no_buffer`).
  void Push(uint64_t request_id, int64_t bytes, bool no_buffer = false) {
    v1::LocalMessage message;
    v1::LocalPush* push = message.mutable_push();
    push->set_request_id(request_id);
    push->set_server("ps");
    push->set_bytes(bytes);
    if (no_buffer) {
      REQUIRE(channel_->Send(message).ok());
      return;
    }
    auto buffer = SharedBuffer::Create(static_cast<size_t>(bytes));
    REQUIRE(buffer.ok());
    REQUIRE(channel_->Send(message, buffer->fd()).ok());
  }
  void Send(const v1::LocalMessage& message) { REQUIRE(channel_->Send(message).ok()); }
  absl::Status Receive(v1::LocalMessage* message, int* fd) {
    return channel_->Receive(message, fd);
  }
  v1::LocalMessage Next() {
    v1::LocalMessage message;
    int fd = -1;
    REQUIRE(channel_->Receive(&message, &fd).ok());
    if (fd >= 0) ::close(fd);
    return message;
  }

 private:
  std::unique_ptr<LocalChannel> channel_;
};

struct Fixture {
  Fixture() {
    DaemonConfig config;
    config.host = "w1";
    // A directory of its own in /tmp (Bazel's TEST_TMPDIR is too long for a
    // socket path, and sandboxed runs share one pid).
    char dir[] = "/tmp/mlfabric-daemon-test-XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    config.local_socket = std::string(dir) + "/d.sock";
    config.register_timeout_s = 5;
    auto owned = std::make_unique<FakeSchedulerClient>();
    scheduler = owned.get();
    scheduler->submit_hook = [this](const v1::SubmitUpdateRequest& request,
                                    v1::SubmitUpdateReply* reply) {
      if (request.worker() == "slow") {
        std::unique_lock<std::mutex> lock(mu);
        held = true;
        cv.notify_all();
        cv.wait(lock, [&] { return released; });
      }
      reply->set_transfer_id(request.worker() == "slow" ? 100 : 200 + request.local_id());
      return absl::OkStatus();
    };
    daemon = std::make_unique<Daemon>(config, nullptr, std::move(owned));
    REQUIRE(daemon->Start().ok());
    socket = config.local_socket;
  }
  ~Fixture() {
    Release();
    daemon->Stop();
  }
  void AwaitHeld() {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return held; }));
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    cv.notify_all();
  }
  // Returns once every failure report that the commands pushed so far (and
  // what the daemon handled before them) cause has reached the fake. The
  // daemon handles commands in order, under the lock its other handlers
  // (an application leaving, ...) take too, and sends failure reports from
  // one FIFO queue. A send naming a push the daemon does not have
  // (`marker`) is handled after everything before it and reported failed
  // through that queue: once its report is in, any report queued before
  // it is in too.
  void AwaitEarlierReports(uint64_t marker) {
    v1::DaemonCommand command;
    v1::SendTransfer* send = command.mutable_send();
    send->set_transfer_id(marker);
    send->set_dst_host("s1");
    send->set_dst_address("127.0.0.1:1");
    send->set_bytes(4096);
    scheduler->PushCommand(command);
    REQUIRE(scheduler->WaitForCompletionOf(marker, std::chrono::seconds(30)));
  }
  static v1::DaemonCommand Outcome(uint64_t transfer, uint64_t local_id, v1::Outcome outcome,
                                   const std::string& reason = "") {
    v1::DaemonCommand command;
    v1::PushOutcome* body = command.mutable_outcome();
    body->set_transfer_id(transfer);
    body->set_local_id(local_id);
    body->set_outcome(outcome);
    body->set_reason(reason);
    return command;
  }

  FakeSchedulerClient* scheduler = nullptr;
  std::unique_ptr<Daemon> daemon;
  std::string socket;
  std::mutex mu;
  std::condition_variable cv;
  bool held = false;
  bool released = false;
};

TEST_CASE("Daemon: a push held by the scheduler does not hold up another push's outcome") {
  Fixture f;
  App slow(f.socket, "slow");
  App fast(f.socket, "fast");
  slow.Push(1, 4096);
  f.AwaitHeld();  // slow's SubmitUpdate is in the scheduler's hands
  fast.Push(2, 4096);
  // Its SubmitUpdate returned at once (the daemon holds no lock across
  // slow's); the scheduler's outcome command reaches fast.
  uint64_t fast_local = 0;
  for (int i = 0; i < 3000 && fast_local == 0; ++i) {
    for (const auto& submit : f.scheduler->submits()) {
      if (submit.worker() == "fast") fast_local = submit.local_id();
    }
    if (fast_local == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(fast_local != 0);
  f.scheduler->PushCommand(
      Fixture::Outcome(200 + fast_local, fast_local, v1::OUTCOME_DROPPED, "too stale"));
  v1::LocalMessage done = fast.Next();
  REQUIRE(done.has_push_done());
  CHECK(done.push_done().request_id() == 2);
  CHECK(done.push_done().outcome() == v1::OUTCOME_DROPPED);
  CHECK(done.push_done().reason() == "too stale");
  // A command naming slow's push by its local id, before its
  // SubmitUpdate returned, finds it.
  uint64_t slow_local = 0;
  for (const auto& submit : f.scheduler->submits()) {
    if (submit.worker() == "slow") slow_local = submit.local_id();
  }
  REQUIRE(slow_local != 0);
  f.scheduler->PushCommand(Fixture::Outcome(100, slow_local, v1::OUTCOME_APPLIED));
  done = slow.Next();
  REQUIRE(done.has_push_done());
  CHECK(done.push_done().request_id() == 1);
  CHECK(done.push_done().outcome() == v1::OUTCOME_APPLIED);
  f.Release();
}

TEST_CASE("Daemon: a push it cannot take fails with the reason, and the daemon goes on") {
  Fixture f;
  App app(f.socket, "w");
  app.Push(5, 4096, /*no_buffer=*/true);
  v1::LocalMessage done = app.Next();
  REQUIRE(done.has_push_done());
  CHECK(done.push_done().request_id() == 5);
  CHECK(done.push_done().outcome() == v1::OUTCOME_FAILED);
  CHECK(done.push_done().reason() == "push carries no shared-memory buffer");
  CHECK(f.scheduler->submits().empty());
  // The next push is submitted as usual.
  app.Push(6, 4096);
  for (int i = 0; i < 3000 && f.scheduler->submits().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(f.scheduler->submits().size() == 1);
  CHECK(f.scheduler->submits()[0].bytes() == 4096);
  CHECK(f.scheduler->submits()[0].src_host() == "w1");
}

TEST_CASE("Daemon: a schedule naming a push it does not have is reported failed") {
  Fixture f;
  v1::DaemonCommand command;
  v1::SendTransfer* send = command.mutable_send();
  send->set_transfer_id(77);
  send->set_dst_host("s1");
  send->set_dst_address("127.0.0.1:1");
  send->set_bytes(4096);
  f.scheduler->PushCommand(command);
  REQUIRE(f.scheduler->WaitForCompletions(1, std::chrono::seconds(30)));
  const v1::CompletionReport report = f.scheduler->completions()[0];
  CHECK(report.transfer_id() == 77);
  CHECK(!report.applied());
  CHECK(report.error().find("no pushed data on w1") != std::string::npos);
}

TEST_CASE("Daemon: a server application that goes away fails what it was to apply, once") {
  Fixture f;
  auto server = std::make_unique<App>(f.socket, "ps", v1::ROLE_SERVER);
  v1::DaemonCommand command;
  v1::ExpectDelivery* expect = command.mutable_expect();
  expect->set_transfer_id(300);
  expect->set_job_id(0);  // the fake scheduler numbers every job 0
  expect->set_server("ps");
  expect->set_sequence(1);
  expect->set_bytes(4096);
  expect->set_src_host("w9");
  f.scheduler->PushCommand(command);
  server.reset();  // before or after the daemon took the expectation
  REQUIRE(f.scheduler->WaitForCompletions(1, std::chrono::seconds(30)));
  // The first report means the daemon has handled both the expectation and
  // the server leaving (whichever came second failed it); a second report
  // of either would be queued by now, ahead of the marker's.
  f.AwaitEarlierReports(9001);
  const std::vector<v1::CompletionReport> reports = f.scheduler->completions();
  REQUIRE(reports.size() == 2);
  CHECK(reports[1].transfer_id() == 9001);
  CHECK(reports[0].transfer_id() == 300);
  CHECK(!reports[0].applied());
  CHECK(reports[0].error().find("server 'ps'") != std::string::npos);
}

TEST_CASE("Daemon: a cancellation to confirm is answered not applied when skipped in time") {
  Fixture f;
  auto server = std::make_unique<App>(f.socket, "ps", v1::ROLE_SERVER);
  v1::DaemonCommand command;
  v1::ExpectDelivery* expect = command.mutable_expect();
  expect->set_transfer_id(400);
  expect->set_job_id(0);
  expect->set_server("ps");
  expect->set_sequence(1);
  expect->set_bytes(4096);
  expect->set_src_host("w9");
  f.scheduler->PushCommand(command);
  // Its bytes never come; the scheduler gives up on it (its source is down).
  v1::DaemonCommand cancel;
  cancel.mutable_cancel()->set_transfer_id(400);
  cancel.mutable_cancel()->set_server("ps");
  cancel.mutable_cancel()->set_sequence(1);
  cancel.mutable_cancel()->set_reason("source host w9 is down");
  cancel.mutable_cancel()->set_confirm(true);
  f.scheduler->PushCommand(cancel);
  REQUIRE(f.scheduler->WaitForCompletions(1, std::chrono::seconds(30)));
  const v1::CompletionReport report = f.scheduler->completions()[0];
  CHECK(report.transfer_id() == 400);
  CHECK_FALSE(report.applied());
  CHECK(report.error() == "source host w9 is down");
  // A cancellation of a position it does not have (handed over already)
  // is not answered: the application's acknowledgement will be.
  cancel.mutable_cancel()->set_transfer_id(401);
  cancel.mutable_cancel()->set_sequence(2);
  f.scheduler->PushCommand(cancel);
  // An answer to it would be queued while the daemon handles the
  // cancellation, ahead of the marker handled after it.
  f.AwaitEarlierReports(9002);
  const std::vector<v1::CompletionReport> reports = f.scheduler->completions();
  REQUIRE(reports.size() == 2);
  CHECK(reports[1].transfer_id() == 9002);
}

TEST_CASE("Daemon: Stop ends a get that waits on a daemon that never answers") {
  Fixture f;
  // A "server daemon" that takes the connection and never answers.
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor silent(
      io, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  const std::string address =
      "127.0.0.1:" + std::to_string(silent.local_endpoint().port());
  f.scheduler->resolve_hook = [address](const v1::ResolveServerRequest&,
                                        v1::ResolveServerReply* where) {
    where->set_host("s9");
    where->set_data_address(address);
    return absl::OkStatus();
  };
  App app(f.socket, "w");
  v1::LocalMessage get;
  get.mutable_get()->set_request_id(1);
  get.mutable_get()->set_server("ps");
  app.Send(get);
  boost::asio::ip::tcp::socket held(io);
  silent.accept(held);  // the get is waiting for the reply now
  f.daemon->Stop();     // returns: the get's connection was shut down
  // The application learns its connection is gone.
  v1::LocalMessage message;
  int fd = -1;
  CHECK(!app.Receive(&message, &fd).ok());
}

}  // namespace
}  // namespace mlfabric
