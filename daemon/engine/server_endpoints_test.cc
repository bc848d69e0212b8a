#include "daemon/engine/server_endpoints.h"

#include <thread>

#include <catch2/catch.hpp>

#include "daemon/engine/fake_app.h"

namespace mlfabric::daemon {
namespace {

struct Fixture {
  ReceiveLock lock;
  BufferPool pool;
  std::atomic<bool> stopping{false};
  ServerEndpoints servers{&lock, &pool, &stopping};
  FakeApp ps{1, "ps", v1::ROLE_SERVER};
  const std::string key = ServerKey(1, "ps");

  // Hands update `transfer` (sequence `sequence`) over; returns its buffer.
  std::shared_ptr<SharedBuffer> Hand(uint64_t transfer, uint64_t sequence, bool group = false) {
    auto buffer = SharedBuffer::Create(64);
    REQUIRE(buffer.ok());
    auto shared = std::make_shared<SharedBuffer>(std::move(*buffer));
    v1::LocalMessage message;
    message.mutable_update()->set_transfer_id(transfer);
    message.mutable_update()->set_sequence(sequence);
    ReceiveLock::Hold guard(&lock);
    REQUIRE(servers.HandLocked(key, message, shared, group).ok());
    return shared;
  }
  v1::LocalMessage Next() {
    v1::LocalMessage message;
    int fd = -1;
    REQUIRE(ps.Next(&message, &fd));
    if (fd >= 0) ::close(fd);
    return message;
  }
};

TEST_CASE("ServerKey names a job's server") { CHECK(ServerKey(12, "ps") == "12/ps"); }

TEST_CASE("a published server is handed updates, and its acknowledgements count") {
  Fixture f;
  {
    ReceiveLock::Hold guard(&f.lock);
    CHECK(f.servers.AppLocked(f.key) == nullptr);
    f.servers.PublishLocked(f.key, f.ps.session);
    CHECK(f.servers.AppLocked(f.key) == f.ps.session);
    f.servers.applied_log().Handed(100, {11, 12});
  }
  f.Hand(100, 1);
  v1::LocalMessage update = f.Next();
  REQUIRE(update.has_update());
  CHECK(update.update().transfer_id() == 100);
  v1::LocalUpdateAck ack;
  ack.set_transfer_id(100);
  ack.set_model_version(5);
  ReceiveLock::Hold guard(&f.lock);
  const std::vector<uint64_t> pushes = f.servers.AcknowledgedLocked(ack);
  CHECK(pushes == std::vector<uint64_t>{11, 12});
  CHECK(f.servers.VersionLocked(f.key) == 5);
  CHECK(f.servers.applied_log().Contains(11));
}

TEST_CASE("handing an update to no application fails and records nothing") {
  Fixture f;
  auto buffer = SharedBuffer::Create(8);
  REQUIRE(buffer.ok());
  v1::LocalMessage message;
  message.mutable_update()->set_transfer_id(1);
  ReceiveLock::Hold guard(&f.lock);
  CHECK_FALSE(f.servers
                  .HandLocked(f.key, message, std::make_shared<SharedBuffer>(std::move(*buffer)),
                              false)
                  .ok());
}

TEST_CASE("a snapshot of a version not handed yet goes right after the update that makes it") {
  Fixture f;
  {
    ReceiveLock::Hold guard(&f.lock);
    f.servers.PublishLocked(f.key, f.ps.session);
  }
  // Version 0 now: a snapshot at version 2 waits for two updates.
  REQUIRE(f.servers.AskSnapshot(f.key, /*request_id=*/77, /*at_version=*/2).ok());
  CHECK(f.ps.Quiet());
  f.Hand(1, 1);
  CHECK(f.Next().has_update());
  CHECK(f.ps.Quiet());
  f.Hand(2, 2);
  CHECK(f.Next().update().transfer_id() == 2);
  v1::LocalMessage ask = f.Next();
  REQUIRE(ask.has_model_request());
  CHECK(ask.model_request().request_id() == 77);
  // A snapshot of whatever version it has goes at once.
  REQUIRE(f.servers.AskSnapshot(f.key, 78, -1).ok());
  CHECK(f.Next().model_request().request_id() == 78);
  CHECK(f.servers.AskSnapshot(ServerKey(1, "other"), 79, -1).code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("a server that leaves is forgotten with what it was handed") {
  Fixture f;
  FakeApp worker{1, "w0", v1::ROLE_WORKER};
  ReceiveLock::Hold guard(&f.lock);
  f.servers.PublishLocked(f.key, f.ps.session);
  CHECK_FALSE(f.servers.ForgetLocked(worker.session).has_value());  // no endpoint of its own
  CHECK(f.servers.ForgetLocked(f.ps.session) == f.key);
  CHECK(f.servers.AppLocked(f.key) == nullptr);
  CHECK(f.servers.KnownLocked(f.key));  // known, not connected
  CHECK_FALSE(f.servers.ForgetLocked(f.ps.session).has_value());
}

TEST_CASE("a promoted replica serves under the server's key") {
  Fixture f;
  FakeApp replica{1, "ps", v1::ROLE_REPLICA};
  const std::string from = ServerKey(1, "replica:ps");
  ReceiveLock::Hold guard(&f.lock);
  f.servers.PublishLocked(from, replica.session);
  CHECK(f.servers.RenameLocked(from, f.key) == replica.session);
  CHECK(f.servers.AppLocked(f.key) == replica.session);
  CHECK_FALSE(f.servers.KnownLocked(from));
  CHECK(f.servers.RenameLocked(ServerKey(2, "replica:x"), ServerKey(2, "x")) == nullptr);
}

TEST_CASE("AwaitServer waits for a registering server, and gives up") {
  Fixture f;
  CHECK_FALSE(f.servers.AwaitServer(f.key, 0.05));
  std::thread registering([&] {
    ReceiveLock::Hold guard(&f.lock);
    f.servers.PublishLocked(f.key, f.ps.session);
  });
  CHECK(f.servers.AwaitServer(f.key, 30));
  registering.join();
  CHECK(f.servers.JobOf(f.key) == "job");
  CHECK(f.servers.JobOf(ServerKey(9, "none")).empty());
}

TEST_CASE("a round's acknowledgement logs each member applied at the round's version") {
  Fixture f;
  ReceiveLock::Hold guard(&f.lock);
  f.servers.RoundAcknowledgedLocked(f.key, /*delivery=*/500, {21, 22}, /*version=*/4, true);
  CHECK(f.servers.applied_log().Contains(21));
  CHECK(f.servers.applied_log().Contains(22));
  CHECK(f.servers.VersionLocked(f.key) == 4);
  f.servers.RoundAcknowledgedLocked(f.key, 501, {23}, 5, /*applied=*/false);
  CHECK_FALSE(f.servers.applied_log().Contains(23));
  CHECK(f.servers.VersionLocked(f.key) == 4);
}

}  // namespace
}  // namespace mlfabric::daemon
