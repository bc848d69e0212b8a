// Unit tests of AppRequests: what a local application asks, carried out
// against a fake scheduler, with the application on a socketpair
// (engine/fake_app.h) instead of the daemon's socket.
#include "daemon/app_requests.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>

#include "common/clock.h"
#include "daemon/apps/push_table.h"
#include "daemon/control/completion_reporter.h"
#include "daemon/control/fake_scheduler_client.h"
#include "daemon/engine/aggregation_table.h"
#include "ipc/buffer_pool.h"
#include "daemon/engine/send_scheduler.h"
#include "daemon/engine/fake_app.h"
#include "daemon/engine/incoming_transfers.h"
#include "daemon/engine/round_service.h"
#include "daemon/engine/server_endpoints.h"
#include "daemon/transport/peer_connections.h"
#include "daemon/transport/send_watchdog.h"

namespace mlfabric::daemon {
namespace {

const auto kWait = std::chrono::seconds(10);

SendScheduler::Options SendOptions() {
  SendScheduler::Options options;
  options.payload_bytes = 32 * 1024;
  return options;
}

// AppRequests wired as the daemon wires it (daemon.cc), with no model
// server or fetcher (gets of registered applications are not exercised
// here: tests/push_get_test does, through real daemons).
struct Rig {
  Rig()
      : rounds(RoundService::Options{}, &lock, &stopping, &incoming, &servers, &send, &reporter,
               &watchdog, &pool),
        requests(AppRequests::Options{"h1", 32 * 1024}, &lock,
                 &clock, &stopping,
                 AppRequests::Parts{&scheduler, &reporter, &pushes, &keys, &servers, &rounds,
                                    nullptr, nullptr, nullptr, &registering, nullptr, nullptr,
                                    [this](v1::SendTransfer send) {
                                      std::lock_guard<std::mutex> guard(granted_mu);
                                      granted.push_back(std::move(send));
                                    }},
                 [this](const std::shared_ptr<AppSession>& app) {
                   ++forgotten;
                   std::optional<v1::EntityGoneReport> report;
                   if (servers.ForgetLocked(app).has_value()) {
                     report.emplace();
                     report->set_name(app->name);
                     report->set_role(app->role);
                   }
                   return report;
                 }) {}

  // A fresh (unregistered) application.
  static std::unique_ptr<FakeApp> NewApp(const std::string& name, v1::Role role) {
    auto app = std::make_unique<FakeApp>(0, name, role);
    app->session->registered = false;
    app->session->job_id = 0;
    return app;
  }
  v1::LocalMessage Register(FakeApp& app, v1::Role role) {
    v1::LocalRegister request;
    request.set_job("job");
    request.set_job_token("token");
    request.set_name(app.session->name);
    request.set_role(role);
    requests.HandleRegister(app.session, request);
    return Next(app);
  }
  static v1::LocalMessage Next(FakeApp& app) {
    v1::LocalMessage message;
    int fd = -1;
    REQUIRE(app.Next(&message, &fd));
    if (fd >= 0) ::close(fd);
    return message;
  }
  // Pushes `bytes` bytes to "ps" (in shared memory unless `fd_less`),
  // naming the tensor shape `shape` if given.
  void Push(FakeApp& app, uint64_t request_id, int64_t bytes, bool fd_less = false,
            const std::optional<std::vector<int64_t>>& shape = std::nullopt) {
    v1::LocalPush push;
    push.set_request_id(request_id);
    push.set_server("ps");
    push.set_bytes(bytes);
    push.set_version(3);
    if (shape.has_value()) {
      v1::TensorShape* dims = push.mutable_shape();  // set even when a scalar's []
      for (int64_t dim : *shape) dims->add_dims(dim);
    }
    if (fd_less) {
      requests.HandlePush(app.session, push, -1);
      return;
    }
    auto buffer = SharedBuffer::Create(static_cast<size_t>(bytes));
    REQUIRE(buffer.ok());
    requests.HandlePush(app.session, push, ::dup(buffer->fd()));
  }

  ReceiveLock lock;
  std::atomic<bool> stopping{false};
  RealClock clock;
  BufferPool pool;
  IncomingTransfers incoming{&pool};
  ServerEndpoints servers{&lock, &pool, &stopping};
  transport::SendWatchdog watchdog{30};
  boost::asio::io_context io;
  transport::PeerConnections peers{io, watchdog, 32 * 1024};
  AggregationTable aggregations{32 * 1024};
  SendScheduler send{SendOptions(), &clock, &peers, &aggregations,
                     [](uint64_t, const std::string&) {}};
  FakeSchedulerClient scheduler;
  CompletionReporter reporter{&scheduler, "h1"};
  PushTable pushes;
  transport::DataKeys keys;
  RoundService rounds;
  int forgotten = 0;
  std::atomic<bool> registering{false};
  std::mutex granted_mu;
  std::vector<v1::SendTransfer> granted;  // transfers started on round grants
  AppRequests requests;
};

// Pushes `bytes` bytes of round `round` to "ps".
void PushRound(Rig& rig, FakeApp& app, uint64_t request_id, int64_t round, int64_t bytes) {
  v1::LocalPush push;
  push.set_request_id(request_id);
  push.set_server("ps");
  push.set_bytes(bytes);
  push.set_version(round);
  auto buffer = SharedBuffer::Create(static_cast<size_t>(bytes));
  REQUIRE(buffer.ok());
  rig.requests.HandlePush(app.session, push, ::dup(buffer->fd()));
}

v1::RoundGrant Grant(uint64_t transfer_id, int64_t round, int64_t bytes) {
  v1::RoundGrant grant;
  grant.set_transfer_id(transfer_id);
  grant.set_round(round);
  grant.set_bytes(bytes);
  grant.set_rate_bps(8e9);
  grant.set_dst_host("h2");
  grant.set_dst_address("10.0.0.2:7");
  return grant;
}

TEST_CASE("a push its round's grant covers leaves at once; the reply's grant covers the next") {
  Rig rig;
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  rig.scheduler.submit_hook = [](const v1::SubmitUpdateRequest& request,
                                 v1::SubmitUpdateReply* reply) {
    reply->set_transfer_id(request.granted_transfer_id() != 0 ? request.granted_transfer_id()
                                                              : 600 + request.local_id());
    if (request.granted_transfer_id() == 77) *reply->mutable_next_round() = Grant(78, 4, 4096);
    return absl::OkStatus();
  };
  rig.requests.AddGrant(*worker->session, "ps", Grant(77, 3, 4096));
  PushRound(rig, *worker, 1, /*round=*/3, 4096);
  std::vector<v1::SubmitUpdateRequest> submits = rig.scheduler.submits();
  REQUIRE(submits.size() == 1);
  CHECK(submits[0].granted_transfer_id() == 77);
  {
    std::lock_guard<std::mutex> guard(rig.granted_mu);
    REQUIRE(rig.granted.size() == 1);
    const v1::SendTransfer& send = rig.granted[0];
    CHECK(send.transfer_id() == 77);
    CHECK(send.local_id() == submits[0].local_id());
    CHECK(send.dst_host() == "h2");
    CHECK(send.dst_address() == "10.0.0.2:7");
    CHECK(send.bytes() == 4096);
    REQUIRE(send.segments_size() == 1);
    CHECK(send.segments(0).from_s() == 0);
    CHECK(send.segments(0).to_s() == Approx(8.0 * 4096 / 8e9));
    CHECK(send.segments(0).rate_bps() == 8e9);
  }
  CHECK(rig.requests.granted_pushes() == 1);
  CHECK(rig.pushes.Find(77).has_value());  // the push is known by its granted id

  // The reply's grant is for round 4: a push of another size does not use
  // it (and drops it), so the one after is planned too.
  PushRound(rig, *worker, 2, /*round=*/4, 64);
  PushRound(rig, *worker, 3, /*round=*/4, 4096);
  submits = rig.scheduler.submits();
  REQUIRE(submits.size() == 3);
  CHECK(submits[1].granted_transfer_id() == 0);
  CHECK(submits[2].granted_transfer_id() == 0);
  CHECK(rig.requests.granted_pushes() == 1);

  // A grant for a later round is not replaced by an older one, and a grant
  // is for its own round only.
  rig.requests.AddGrant(*worker->session, "ps", Grant(90, 6, 4096));
  rig.requests.AddGrant(*worker->session, "ps", Grant(80, 5, 4096));
  PushRound(rig, *worker, 4, /*round=*/5, 4096);
  CHECK(rig.scheduler.submits().back().granted_transfer_id() == 0);
  rig.requests.AddGrant(*worker->session, "ps", Grant(91, 6, 4096));
  rig.requests.ClearGrants();  // the scheduler that gave it is gone
  PushRound(rig, *worker, 5, /*round=*/6, 4096);
  CHECK(rig.scheduler.submits().back().granted_transfer_id() == 0);
  rig.requests.WaitGets();
}

TEST_CASE("a server registers with the scheduler and is published once answered") {
  Rig rig;
  rig.scheduler.register_hook = [](const v1::RegisterEntityRequest& request,
                                   v1::RegisterEntityReply* reply) {
    CHECK(request.host() == "h1");
    CHECK(request.role() == v1::ROLE_SERVER);
    reply->set_job_id(7);
    reply->set_model_version(12);
    return absl::OkStatus();
  };
  auto ps = Rig::NewApp("ps", v1::ROLE_SERVER);
  const v1::LocalMessage reply = rig.Register(*ps, v1::ROLE_SERVER);
  REQUIRE(reply.has_registered());
  CHECK(reply.registered().error().empty());
  CHECK(reply.registered().model_version() == 12);
  CHECK(reply.registered().host() == "h1");
  CHECK(ps->session->registered);
  CHECK(ps->session->job_id == 7);
  ReceiveLock::Hold guard(&rig.lock);
  CHECK(rig.servers.AppLocked(ServerKey(7, "ps")) == ps->session);
}

TEST_CASE("a replica is published as replica:<server>") {
  Rig rig;
  auto replica = Rig::NewApp("ps", v1::ROLE_REPLICA);
  REQUIRE(rig.Register(*replica, v1::ROLE_REPLICA).registered().error().empty());
  ReceiveLock::Hold guard(&rig.lock);
  CHECK(rig.servers.AppLocked(ServerKey(0, "replica:ps")) == replica->session);
  CHECK(rig.servers.AppLocked(ServerKey(0, "ps")) == nullptr);
}

TEST_CASE("a registration the scheduler refuses, or a second one, is answered with why") {
  Rig rig;
  rig.scheduler.register_hook = [](const v1::RegisterEntityRequest&, v1::RegisterEntityReply*) {
    return absl::PermissionDeniedError("wrong job token");
  };
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  const v1::LocalMessage refused = rig.Register(*worker, v1::ROLE_WORKER);
  CHECK(refused.registered().error().find("scheduler refused the registration") !=
        std::string::npos);
  CHECK(refused.registered().error().find("wrong job token") != std::string::npos);
  CHECK_FALSE(worker->session->registered);
  rig.scheduler.register_hook = nullptr;
  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  CHECK(rig.Register(*worker, v1::ROLE_WORKER).registered().error() ==
        "this connection is already registered");
}

TEST_CASE("a push is recorded, submitted, and waits for its outcome") {
  Rig rig;
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  rig.scheduler.submit_hook = [](const v1::SubmitUpdateRequest&, v1::SubmitUpdateReply* reply) {
    reply->set_transfer_id(501);
    return absl::OkStatus();
  };
  rig.Push(*worker, /*request_id=*/1, 4096);
  const auto submits = rig.scheduler.submits();
  REQUIRE(submits.size() == 1);
  CHECK(submits[0].src_host() == "h1");
  CHECK(submits[0].worker() == "w0");
  CHECK(submits[0].server() == "ps");
  CHECK(submits[0].bytes() == 4096);
  CHECK(submits[0].version() == 3);
  CHECK(submits[0].local_id() > 0);
  CHECK(rig.requests.pushes_submitted() == 1);
  const std::optional<PushTable::Push> push = rig.pushes.Find(501);
  REQUIRE(push.has_value());
  CHECK(push->request_id == 1);
  CHECK(push->buffer->size() == 4096);
  CHECK(worker->Quiet());  // its outcome comes from the command stream
}

TEST_CASE("a push's tensor shape reaches the scheduler; a scalar's differs from none") {
  Rig rig;
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  rig.Push(*worker, /*request_id=*/1, 4096, false, std::vector<int64_t>{32, 32});
  rig.Push(*worker, /*request_id=*/2, 4, false, std::vector<int64_t>{});
  rig.Push(*worker, /*request_id=*/3, 4);
  const auto submits = rig.scheduler.submits();
  REQUIRE(submits.size() == 3);
  REQUIRE(submits[0].has_shape());
  CHECK(std::vector<int64_t>(submits[0].shape().dims().begin(), submits[0].shape().dims().end()) ==
        std::vector<int64_t>{32, 32});
  CHECK(submits[1].has_shape());
  CHECK(submits[1].shape().dims_size() == 0);
  CHECK(!submits[2].has_shape());
}

TEST_CASE("a push buffer sent again reuses its mapping, per application") {
  Rig rig;
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  auto other = Rig::NewApp("w1", v1::ROLE_WORKER);
  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  REQUIRE(rig.Register(*other, v1::ROLE_WORKER).registered().error().empty());
  uint64_t next_transfer = 600;
  rig.scheduler.submit_hook = [&](const v1::SubmitUpdateRequest&, v1::SubmitUpdateReply* reply) {
    reply->set_transfer_id(++next_transfer);
    return absl::OkStatus();
  };
  auto buffer = SharedBuffer::Create(8192);
  REQUIRE(buffer.ok());
  auto push = [&](FakeApp& app, uint64_t request_id, int64_t bytes) {
    v1::LocalPush message;
    message.set_request_id(request_id);
    message.set_server("ps");
    message.set_bytes(bytes);
    rig.requests.HandlePush(app.session, message, ::dup(buffer->fd()));
  };

  buffer->data()[0] = 1;
  push(*worker, 1, 8192);
  std::optional<PushTable::Push> first = rig.pushes.TakeForOutcome(601, false);
  REQUIRE(first.has_value());
  CHECK(first->buffer->data()[0] == 1);
  // What buffer_released asks: the kept mapping is no holder of the push's buffer.
  CHECK(first->buffer.use_count() == 1);
  first.reset();

  buffer->data()[0] = 2;  // the worker refills the released buffer
  push(*worker, 2, 8192);
  CHECK(rig.requests.push_buffers_mapped() == 1);
  CHECK(rig.requests.push_buffers_reused() == 1);
  std::optional<PushTable::Push> second = rig.pushes.Find(602);
  REQUIRE(second.has_value());
  CHECK(second->buffer->data()[0] == 2);
  CHECK(second->buffer->size() == 8192);

  // Another application's descriptor of the same file is not looked up
  // in this one's mappings.
  push(*other, 1, 4096);
  CHECK(rig.requests.push_buffers_mapped() == 2);
  CHECK(worker->session->push_mappings.entries() == 1);
  CHECK(other->session->push_mappings.entries() == 1);

  // A claim beyond the file is refused as before.
  push(*worker, 3, 1 << 20);
  v1::LocalMessage refused = Rig::Next(*worker);
  REQUIRE(refused.has_push_done());
  CHECK(refused.push_done().outcome() == v1::OUTCOME_FAILED);
  CHECK(refused.push_done().reason().find("claims") != std::string::npos);

  // Leaving drops the application's mappings; its push in flight keeps its bytes.
  rig.requests.AppGone(worker->session);
  CHECK(worker->session->push_mappings.entries() == 0);
  CHECK(second->buffer->data()[0] == 2);
}

TEST_CASE("a push that cannot be submitted ends at once, failed, with why") {
  Rig rig;
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  auto done = [&](uint64_t request_id) {
    const v1::LocalMessage message = Rig::Next(*worker);
    REQUIRE(message.has_push_done());
    CHECK(message.push_done().request_id() == request_id);
    CHECK(message.push_done().outcome() == v1::OUTCOME_FAILED);
    return message.push_done().reason();
  };
  rig.Push(*worker, 1, 64);
  CHECK(done(1) == "register as a worker before pushing");
  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  rig.Push(*worker, 2, 64, /*fd_less=*/true);
  CHECK(done(2) == "push carries no shared-memory buffer");
  rig.scheduler.submit_hook = [](const v1::SubmitUpdateRequest&, v1::SubmitUpdateReply*) {
    return absl::ResourceExhaustedError("job over its quota");
  };
  rig.Push(*worker, 3, 64);
  const std::string refused = done(3);
  CHECK(refused.find("scheduler refused the push") != std::string::npos);
  CHECK(refused.find("job over its quota") != std::string::npos);
  CHECK(rig.requests.pushes_submitted() == 0);
  CHECK(rig.pushes.Unresolved().empty());  // nothing left waiting for an outcome
}

TEST_CASE("a push refused while the daemon registers again after a restart says to push again") {
  Rig rig;
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  // A restarted scheduler that does not know this daemon's session yet.
  rig.scheduler.submit_hook = [](const v1::SubmitUpdateRequest&, v1::SubmitUpdateReply*) {
    return absl::UnauthenticatedError("host 'h1': a wrong session token");
  };
  rig.registering = true;
  rig.Push(*worker, 1, 64);
  v1::LocalMessage message = Rig::Next(*worker);
  REQUIRE(message.has_push_done());
  CHECK(message.push_done().outcome() == v1::OUTCOME_FAILED);
  CHECK(message.push_done().reason() ==
        "scheduler refused the push: the scheduler restarted and does not know this daemon "
        "yet (it is registering again, within seconds): push again");
  CHECK(rig.scheduler.submits().size() == 1);  // not submitted twice (rounds fail alike)
  CHECK(rig.pushes.Unresolved().empty());
  // Otherwise the scheduler's own words.
  rig.registering = false;
  rig.Push(*worker, 2, 64);
  message = Rig::Next(*worker);
  REQUIRE(message.has_push_done());
  CHECK(message.push_done().reason().find("a wrong session token") != std::string::npos);
}

TEST_CASE("a push's submission holds up neither the application nor its command") {
  Rig rig;
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  rig.scheduler.defer_submits = true;
  rig.scheduler.submit_hook = [](const v1::SubmitUpdateRequest& request,
                                 v1::SubmitUpdateReply* reply) {
    if (request.version() == 4) return absl::UnavailableError("scheduler unreachable");
    reply->set_transfer_id(700 + request.local_id());
    return absl::OkStatus();
  };
  // Both handled while no reply came: the reader thread goes on at once.
  rig.Push(*worker, /*request_id=*/1, 4096);
  v1::LocalPush second;
  second.set_request_id(2);
  second.set_server("ps");
  second.set_bytes(64);
  second.set_version(4);
  auto buffer = SharedBuffer::Create(64);
  REQUIRE(buffer.ok());
  rig.requests.HandlePush(worker->session, second, ::dup(buffer->fd()));
  // One submission of an application in flight at a time, in its order.
  std::vector<v1::SubmitUpdateRequest> submits = rig.scheduler.submits();
  REQUIRE(submits.size() == 1);
  CHECK(submits[0].version() == 3);
  const uint64_t first_local = submits[0].local_id();
  // The plan overtakes the reply: the command finds the push by local id.
  rig.pushes.Adopt(700 + first_local, first_local);
  REQUIRE(rig.pushes.Find(700 + first_local).has_value());
  REQUIRE(rig.scheduler.CompleteSubmit());
  CHECK(rig.pushes.Find(700 + first_local).has_value());
  CHECK(rig.requests.pushes_submitted() == 1);
  // The reply issued the next one; the scheduler refuses it.
  submits = rig.scheduler.submits();
  REQUIRE(submits.size() == 2);
  CHECK(submits[1].version() == 4);
  CHECK(submits[1].local_id() > first_local);
  CHECK(worker->Quiet());
  REQUIRE(rig.scheduler.CompleteSubmit());
  const v1::LocalMessage message = Rig::Next(*worker);
  REQUIRE(message.has_push_done());
  CHECK(message.push_done().request_id() == 2);
  CHECK(message.push_done().outcome() == v1::OUTCOME_FAILED);
  CHECK(message.push_done().reason().find("scheduler unreachable") != std::string::npos);
  // Only the submitted push waits for its outcome.
  const auto unresolved = rig.pushes.Unresolved();
  REQUIRE(unresolved.size() == 1);
  CHECK(unresolved[0].first == 700 + first_local);
  rig.requests.WaitGets();  // nothing in flight
}

TEST_CASE("pushes still waiting to be submitted when the daemon stops fail") {
  Rig rig;
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  rig.scheduler.defer_submits = true;
  rig.scheduler.submit_hook = [](const v1::SubmitUpdateRequest& request,
                                 v1::SubmitUpdateReply* reply) {
    reply->set_transfer_id(900 + request.local_id());
    return absl::OkStatus();
  };
  rig.Push(*worker, 1, 64);
  rig.Push(*worker, 2, 64);
  rig.Push(*worker, 3, 64);
  REQUIRE(rig.scheduler.submits().size() == 1);
  rig.stopping = true;
  // WaitGets waits for the submission in flight, which the reply ends.
  std::atomic<bool> waited{false};
  std::thread waiter([&] {
    rig.requests.WaitGets();
    waited = true;
  });
  CHECK_FALSE(waited.load());
  REQUIRE(rig.scheduler.CompleteSubmit());
  waiter.join();
  CHECK(rig.scheduler.submits().size() == 1);  // the others were never sent
  CHECK(rig.requests.pushes_submitted() == 1);
  for (uint64_t request_id : {2, 3}) {
    const v1::LocalMessage message = Rig::Next(*worker);
    REQUIRE(message.has_push_done());
    CHECK(message.push_done().request_id() == request_id);
    CHECK(message.push_done().outcome() == v1::OUTCOME_FAILED);
    CHECK(message.push_done().reason().find("the daemon stopped") != std::string::npos);
  }
  CHECK(rig.pushes.Unresolved().size() == 1);
}

TEST_CASE("pushes made or refused while the daemon registers again are submitted once it has") {
  Rig rig;
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  rig.scheduler.defer_submits = true;
  rig.Push(*worker, 1, 64);  // in flight when the scheduler goes away
  REQUIRE(rig.scheduler.submits().size() == 1);
  rig.requests.RegistrationStarted();
  rig.Push(*worker, 2, 64);  // waits behind push 1
  rig.scheduler.submit_hook = [](const v1::SubmitUpdateRequest&, v1::SubmitUpdateReply*) {
    return absl::UnavailableError("recvmsg:Connection reset by peer");
  };
  REQUIRE(rig.scheduler.CompleteSubmit());  // push 1 refused: held, not failed
  CHECK(rig.scheduler.submits().size() == 1);
  CHECK(worker->Quiet());
  // Registered with a scheduler that accepts them: both go, in order.
  rig.scheduler.submit_hook = nullptr;
  rig.requests.RegistrationEnded(absl::OkStatus());
  REQUIRE(rig.scheduler.CompleteSubmit());
  REQUIRE(rig.scheduler.CompleteSubmit());
  const std::vector<v1::SubmitUpdateRequest> submits = rig.scheduler.submits();
  REQUIRE(submits.size() == 3);
  CHECK(submits[1].local_id() == submits[0].local_id());
  CHECK(submits[2].local_id() != submits[0].local_id());
  CHECK(rig.requests.pushes_submitted() == 2);
  CHECK(worker->Quiet());

  // Made while registering, and the daemon could not register: it fails
  // with the registration's error, never submitted.
  rig.requests.RegistrationStarted();
  rig.Push(*worker, 3, 64);
  CHECK(rig.scheduler.submits().size() == 3);
  rig.requests.RegistrationEnded(absl::UnavailableError("could not register again: gone"));
  const v1::LocalMessage message = Rig::Next(*worker);
  REQUIRE(message.has_push_done());
  CHECK(message.push_done().request_id() == 3);
  CHECK(message.push_done().outcome() == v1::OUTCOME_FAILED);
  CHECK(message.push_done().reason().find("could not register again: gone") != std::string::npos);
  CHECK(rig.scheduler.submits().size() == 3);
  rig.requests.WaitGets();  // nothing left running
}

TEST_CASE("a push refused while registering that a command named is not submitted again") {
  Rig rig;
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  rig.scheduler.defer_submits = true;
  rig.Push(*worker, 1, 64);
  REQUIRE(rig.scheduler.submits().size() == 1);
  // The lost scheduler planned it (a command adopted it) before its reply
  // was lost: it is in doubt, and the next scheduler tells its outcome.
  rig.pushes.Adopt(77, rig.scheduler.submits()[0].local_id());
  rig.requests.RegistrationStarted();
  rig.scheduler.submit_hook = [](const v1::SubmitUpdateRequest&, v1::SubmitUpdateReply*) {
    return absl::UnavailableError("recvmsg:Connection reset by peer");
  };
  REQUIRE(rig.scheduler.CompleteSubmit());
  rig.requests.RegistrationEnded(absl::OkStatus());
  CHECK(rig.scheduler.submits().size() == 1);
  CHECK(rig.pushes.Find(77).has_value());
  rig.requests.WaitGets();
}

TEST_CASE("a get before registering is answered with an error") {
  Rig rig;
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  v1::LocalGet get;
  get.set_request_id(9);
  get.set_server("ps");
  rig.requests.HandleGet(worker->session, get);
  const v1::LocalMessage message = Rig::Next(*worker);
  REQUIRE(message.has_get_done());
  CHECK(message.get_done().request_id() == 9);
  CHECK(message.get_done().error() == "register before calling get");
  rig.requests.WaitGets();  // none started
}

TEST_CASE("a server's acknowledgement is reported with the pushes it applied") {
  Rig rig;
  {
    ReceiveLock::Hold guard(&rig.lock);
    rig.servers.applied_log().Handed(700, {71, 72});
  }
  v1::LocalUpdateAck ack;
  ack.set_transfer_id(700);
  ack.set_model_version(9);
  rig.requests.HandleUpdateAck(ack);
  v1::LocalUpdateAck refused;
  refused.set_transfer_id(701);
  refused.set_error("NaN in the update");
  rig.requests.HandleUpdateAck(refused);
  REQUIRE(rig.scheduler.WaitForCompletions(2, kWait));
  const auto reports = rig.scheduler.completions();
  CHECK(reports[0].transfer_id() == 700);
  CHECK(reports[0].applied());
  CHECK(reports[0].model_version() == 9);
  CHECK(std::vector<uint64_t>(reports[0].pushes().begin(), reports[0].pushes().end()) ==
        std::vector<uint64_t>{71, 72});
  CHECK(reports[1].transfer_id() == 701);
  CHECK_FALSE(reports[1].applied());
  CHECK(reports[1].error() == "server refused the update: NaN in the update");
}

TEST_CASE("a worker asks its job's membership; the scheduler's answer or error comes back") {
  Rig rig;
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  v1::LocalMembershipQuery query;
  query.set_request_id(21);
  // Not registered: nobody to ask for.
  rig.requests.HandleMembershipQuery(worker->session, query);
  v1::LocalMessage answer = Rig::Next(*worker);
  REQUIRE(answer.has_membership());
  CHECK(answer.membership().request_id() == 21);
  CHECK(answer.membership().error() ==
        "register as a worker before asking for the job's membership");

  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  std::mutex mu;
  std::vector<v1::QueryMembershipRequest> asked;
  rig.scheduler.membership_hook = [&](const v1::QueryMembershipRequest& request,
                                      v1::QueryMembershipReply* reply) {
    std::lock_guard<std::mutex> guard(mu);
    asked.push_back(request);
    if (asked.size() > 1) return absl::NotFoundError("unknown job 'job'");
    reply->set_generation(7);
    reply->add_members("w0");
    reply->add_members("w1");
    return absl::OkStatus();
  };
  query.set_request_id(22);
  rig.requests.HandleMembershipQuery(worker->session, query);
  answer = Rig::Next(*worker);
  REQUIRE(answer.has_membership());
  CHECK(answer.membership().request_id() == 22);
  CHECK(answer.membership().error().empty());
  CHECK(answer.membership().generation() == 7);
  CHECK(std::vector<std::string>(answer.membership().members().begin(),
                                 answer.membership().members().end()) ==
        std::vector<std::string>{"w0", "w1"});

  query.set_request_id(23);
  rig.requests.HandleMembershipQuery(worker->session, query);
  answer = Rig::Next(*worker);
  CHECK(answer.membership().request_id() == 23);
  CHECK(answer.membership().error().find("unknown job 'job'") != std::string::npos);
  rig.requests.WaitGets();
  std::lock_guard<std::mutex> guard(mu);
  REQUIRE(asked.size() == 2);
  CHECK(asked[0].job() == "job");
  CHECK(asked[0].worker() == "w0");
}

TEST_CASE("a worker that lost its daemon learns how its pushes ended") {
  Rig rig;
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  v1::LocalOutcomeQuery query;
  for (uint64_t i = 1; i <= 3; ++i) {
    v1::LocalOutcomeQuery::Entry* entry = query.add_pushes();
    entry->set_request_id(10 + i);
    entry->set_uid(0xa000 + i);
  }
  // Not registered: nobody to ask for.
  rig.requests.HandleOutcomeQuery(worker->session, query);
  for (int i = 0; i < 3; ++i) {
    const v1::LocalMessage done = Rig::Next(*worker);
    CHECK(done.push_done().outcome() == v1::OUTCOME_FAILED);
    CHECK(done.push_done().reason() == "register as a worker before asking how pushes ended");
  }

  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  std::mutex mu;
  std::vector<v1::QueryOutcomesRequest> asked;
  rig.scheduler.query_hook = [&](const v1::QueryOutcomesRequest& request,
                                 v1::QueryOutcomesReply* reply) {
    std::lock_guard<std::mutex> guard(mu);
    asked.push_back(request);
    for (uint64_t uid : request.push_uids()) {
      v1::PushState* push = reply->add_pushes();
      push->set_push_uid(uid);
      if (uid == 0xa001) {
        push->set_state(v1::PushState::STATE_ENDED);
        push->set_outcome(v1::OUTCOME_APPLIED);
        push->set_applied_version(5);
        push->set_delay(2);
      } else if (uid == 0xa002) {  // in flight the first time asked
        push->set_state(asked.size() == 1 ? v1::PushState::STATE_IN_FLIGHT
                                          : v1::PushState::STATE_ENDED);
        push->set_outcome(v1::OUTCOME_DROPPED);
        push->set_reason("stale");
      } else {
        push->set_state(v1::PushState::STATE_UNKNOWN);
      }
    }
    reply->set_uptime_s(42.5);
    return absl::OkStatus();
  };
  rig.requests.HandleOutcomeQuery(worker->session, query);
  std::map<uint64_t, v1::LocalPushDone> answers;
  for (int i = 0; i < 3; ++i) {
    const v1::LocalMessage done = Rig::Next(*worker);
    REQUIRE(done.has_push_done());
    answers[done.push_done().request_id()] = done.push_done();
  }
  rig.requests.WaitGets();  // the query's thread ended
  CHECK(answers.at(11).outcome() == v1::OUTCOME_APPLIED);
  CHECK(answers.at(11).applied_version() == 5);
  CHECK(answers.at(11).delay() == 2);
  CHECK(answers.at(12).outcome() == v1::OUTCOME_DROPPED);
  CHECK(answers.at(12).reason() == "stale");
  CHECK(answers.at(13).outcome() == v1::OUTCOME_FAILED);
  CHECK(answers.at(13).reason().find("its outcome is unknown") != std::string::npos);
  CHECK(answers.at(13).no_record());  // the application decides by the scheduler's uptime
  CHECK(answers.at(13).scheduler_uptime_s() == 42.5);
  std::lock_guard<std::mutex> guard(mu);
  REQUIRE(asked.size() == 2);
  CHECK(asked[0].job() == "job");
  CHECK(asked[0].worker() == "w0");
  CHECK(asked[0].push_uids_size() == 3);
  CHECK(asked[1].push_uids_size() == 1);  // only the one still in flight
  CHECK(asked[1].push_uids(0) == 0xa002);
}

TEST_CASE("a server that leaves is forgotten and reported to the scheduler") {
  Rig rig;
  auto ps = Rig::NewApp("ps", v1::ROLE_SERVER);
  auto worker = Rig::NewApp("w0", v1::ROLE_WORKER);
  REQUIRE(rig.Register(*ps, v1::ROLE_SERVER).registered().error().empty());
  REQUIRE(rig.Register(*worker, v1::ROLE_WORKER).registered().error().empty());
  rig.requests.AppGone(worker->session);
  CHECK(rig.scheduler.gone().empty());  // a worker leaving is nobody's to take over
  rig.requests.AppGone(ps->session);
  CHECK(rig.forgotten == 2);
  const auto gone = rig.scheduler.gone();
  REQUIRE(gone.size() == 1);
  CHECK(gone[0].name() == "ps");
  CHECK(gone[0].role() == v1::ROLE_SERVER);
  ReceiveLock::Hold guard(&rig.lock);
  CHECK(rig.servers.AppLocked(ServerKey(0, "ps")) == nullptr);
}

}  // namespace
}  // namespace mlfabric::daemon
