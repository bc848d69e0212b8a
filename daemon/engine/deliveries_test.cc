#include "daemon/engine/deliveries.h"

#include <chrono>
#include <cstring>

#include <catch2/catch.hpp>

#include "daemon/control/fake_scheduler_client.h"
#include "daemon/engine/fake_app.h"

namespace mlfabric::daemon {
namespace {

struct Fixture {
  ReceiveLock lock;
  BufferPool pool;
  std::atomic<bool> stopping{false};
  FakeSchedulerClient scheduler;
  CompletionReporter reporter{&scheduler, "h1"};
  IncomingTransfers incoming{&pool};
  ServerEndpoints servers{&lock, &pool, &stopping};
  Deliveries deliveries{"h1", &incoming, &servers, &reporter};
  FakeApp ps{1, "ps", v1::ROLE_SERVER};

  Fixture() {
    ReceiveLock::Hold guard(&lock);
    servers.PublishLocked(ServerKey(1, "ps"), ps.session);
  }
  static v1::ExpectDelivery Expect(uint64_t transfer, uint64_t sequence, int64_t bytes = 16,
                                   const std::string& server = "ps") {
    v1::ExpectDelivery expect;
    expect.set_transfer_id(transfer);
    expect.set_job_id(1);
    expect.set_server(server);
    expect.set_sequence(sequence);
    expect.set_bytes(bytes);
    expect.set_worker("w0");
    return expect;
  }
  // Transfer `transfer` of `bytes` bytes, each `fill`, arrived (whole if `whole`).
  void Arrive(uint64_t transfer, uint64_t bytes, uint8_t fill, bool whole = true,
              uint32_t job = 1) {
    auto buffer = SharedBuffer::Create(bytes);
    REQUIRE(buffer.ok());
    std::memset(buffer->data(), fill, bytes);
    Incoming& in = incoming.Add(transfer, job, bytes,
                                std::make_shared<SharedBuffer>(std::move(*buffer)));
    in.received = whole ? bytes : bytes / 2;
    if (whole) deliveries.ArrivedLocked(transfer);
  }
  // The next update the server got: its transfer id and first byte.
  std::pair<uint64_t, uint8_t> Next() {
    v1::LocalMessage message;
    int fd = -1;
    REQUIRE(ps.Next(&message, &fd));
    REQUIRE(message.has_update());
    REQUIRE(fd >= 0);
    auto mapped = SharedBuffer::Map(fd, static_cast<size_t>(message.update().bytes()));
    REQUIRE(mapped.ok());
    return {message.update().transfer_id(), mapped->data()[0]};
  }
};

TEST_CASE("updates are handed over in commit order, each once its bytes are in") {
  Fixture f;
  {
    ReceiveLock::Hold guard(&f.lock);
    f.deliveries.ExpectLocked(Fixture::Expect(10, 1));
    f.deliveries.ExpectLocked(Fixture::Expect(20, 2));
    f.Arrive(20, 16, 0xbb);  // second first: held back
  }
  CHECK(f.ps.Quiet());
  {
    ReceiveLock::Hold guard(&f.lock);
    f.Arrive(10, 16, 0xaa);
  }
  CHECK(f.Next() == std::make_pair(uint64_t{10}, uint8_t{0xaa}));
  CHECK(f.Next() == std::make_pair(uint64_t{20}, uint8_t{0xbb}));
  CHECK(f.deliveries.delivered() == 2);
  ReceiveLock::Hold guard(&f.lock);
  CHECK(f.incoming.size() == 0);  // handed over: the server holds the bytes now
}

TEST_CASE("an update for a server that is not connected fails at once") {
  Fixture f;
  {
    ReceiveLock::Hold guard(&f.lock);
    f.deliveries.ExpectLocked(Fixture::Expect(30, 1, 16, "absent"));
  }
  REQUIRE(f.scheduler.WaitForCompletions(1, std::chrono::seconds(30)));
  const v1::CompletionReport report = f.scheduler.completions()[0];
  CHECK(report.transfer_id() == 30);
  CHECK_FALSE(report.applied());
  CHECK(report.error() == "server 'absent' is not connected to h1's daemon");
}

TEST_CASE("an update for a server still registering waits for its endpoint") {
  Fixture f;
  FakeApp late{1, "late", v1::ROLE_SERVER};
  {
    ReceiveLock::Hold guard(&f.lock);
    // The scheduler has the registration; the daemon has not published
    // the endpoint yet.
    f.servers.BeginRegistrationLocked("late");
    f.deliveries.ExpectLocked(Fixture::Expect(40, 1, 16, "late"));
    f.Arrive(40, 16, 0xdd);
  }
  CHECK(late.Quiet());
  CHECK(f.scheduler.completions().empty());
  {
    ReceiveLock::Hold guard(&f.lock);
    f.servers.PublishLocked(ServerKey(1, "late"), late.session);
    f.servers.EndRegistrationLocked("late");
    f.deliveries.RegistrationEndedLocked("late");
  }
  v1::LocalMessage message;
  int fd = -1;
  REQUIRE(late.Next(&message, &fd));
  REQUIRE(message.has_update());
  CHECK(message.update().transfer_id() == 40);
  CHECK(f.deliveries.delivered() == 1);
  CHECK(f.scheduler.completions().empty());
}

TEST_CASE("an update waiting for a registration that fails fails as not connected") {
  Fixture f;
  {
    ReceiveLock::Hold guard(&f.lock);
    f.servers.BeginRegistrationLocked("refused");
    f.deliveries.ExpectLocked(Fixture::Expect(50, 1, 16, "refused"));
    f.Arrive(50, 16, 0xee);
  }
  CHECK(f.scheduler.completions().empty());
  {
    ReceiveLock::Hold guard(&f.lock);
    f.servers.EndRegistrationLocked("refused");
    f.deliveries.RegistrationEndedLocked("refused");
    // Later announcements fail at once, as for any absent server.
    f.deliveries.ExpectLocked(Fixture::Expect(60, 2, 16, "refused"));
  }
  REQUIRE(f.scheduler.WaitForCompletions(2, std::chrono::seconds(30)));
  for (const v1::CompletionReport& report : f.scheduler.completions()) {
    CHECK((report.transfer_id() == 50 || report.transfer_id() == 60));
    CHECK_FALSE(report.applied());
    CHECK(report.error() == "server 'refused' is not connected to h1's daemon");
  }
  ReceiveLock::Hold guard(&f.lock);
  CHECK(f.incoming.size() == 0);  // the failed update's bytes are let go
}

TEST_CASE("a cancelled position is skipped and the next one delivered") {
  Fixture f;
  {
    ReceiveLock::Hold guard(&f.lock);
    f.deliveries.ExpectLocked(Fixture::Expect(10, 1));
    f.deliveries.ExpectLocked(Fixture::Expect(20, 2));
    f.Arrive(20, 16, 0xbb);
    v1::CancelDelivery cancel;
    cancel.set_transfer_id(10);
    cancel.set_sequence(1);
    cancel.set_reason("dropped: too stale");
    cancel.set_confirm(true);
    f.deliveries.CancelLocked(cancel);
  }
  CHECK(f.Next().first == 20);
  REQUIRE(f.scheduler.WaitForCompletions(1, std::chrono::seconds(30)));
  CHECK(f.scheduler.completions()[0].transfer_id() == 10);
  CHECK(f.scheduler.completions()[0].error() == "dropped: too stale");
}

TEST_CASE("an update of the wrong size or job is refused, not handed over") {
  Fixture f;
  {
    ReceiveLock::Hold guard(&f.lock);
    f.deliveries.ExpectLocked(Fixture::Expect(10, 1, /*bytes=*/32));
    f.deliveries.ExpectLocked(Fixture::Expect(20, 2));
    f.deliveries.ExpectLocked(Fixture::Expect(30, 3));
    f.Arrive(10, 16, 0xaa);
    f.Arrive(20, 16, 0xbb, true, /*job=*/2);
    f.Arrive(30, 16, 0xcc);
  }
  CHECK(f.Next().first == 30);
  REQUIRE(f.scheduler.WaitForCompletions(2, std::chrono::seconds(30)));
  const auto reports = f.scheduler.completions();
  CHECK(reports[0].transfer_id() == 10);
  CHECK(reports[0].error() == "received 16 bytes but the schedule said 32");
  CHECK(reports[1].transfer_id() == 20);
  CHECK(reports[1].error().find("arrived as job 2's data but is job 1's") != std::string::npos);
}

TEST_CASE("a held replica copy waits for its release, or is cancelled if its source left") {
  Fixture f;
  FakeApp replica{1, "ps", v1::ROLE_REPLICA};
  v1::ExpectDelivery held = Fixture::Expect(40, 1, 16, "replica:ps");
  held.set_held(true);
  held.set_source_transfer_id(4);
  v1::ExpectDelivery second = Fixture::Expect(41, 2, 16, "replica:ps");
  second.set_held(true);
  second.set_source_transfer_id(5);
  {
    ReceiveLock::Hold guard(&f.lock);
    f.servers.PublishLocked(ServerKey(1, "replica:ps"), replica.session);
    f.deliveries.ExpectLocked(held);
    f.deliveries.ExpectLocked(second);
    f.Arrive(40, 16, 0x11);
  }
  CHECK(replica.Quiet());
  {
    ReceiveLock::Hold guard(&f.lock);
    v1::ReleaseDelivery release;
    release.set_transfer_id(40);
    release.set_sequence(1);
    f.deliveries.ReleaseLocked(release);
  }
  v1::LocalMessage message;
  int fd = -1;
  REQUIRE(replica.Next(&message, &fd));
  ::close(fd);
  CHECK(message.update().transfer_id() == 40);
  {
    ReceiveLock::Hold guard(&f.lock);
    f.Arrive(41, 16, 0x22, /*whole=*/false);
    v1::ReleaseDelivery release;
    release.set_transfer_id(41);
    release.set_sequence(2);
    release.set_cancel_if_incomplete(true);
    f.deliveries.ReleaseLocked(release);
    CHECK_FALSE(f.incoming.Contains(41));
    // The replica's log names the push whose copy it was handed.
    CHECK(f.servers.replica_log().Report().size() == 1);
  }
  REQUIRE(f.scheduler.WaitForCompletions(1, std::chrono::seconds(30)));
  CHECK(f.scheduler.completions()[0].transfer_id() == 41);
  CHECK(f.scheduler.completions()[0].error() ==
        "its source went away before all its bytes arrived");
}

TEST_CASE("at a lost schedule stream, held copies in are kept for the next scheduler") {
  Fixture f;
  FakeApp replica{1, "ps", v1::ROLE_REPLICA};
  v1::ExpectDelivery whole = Fixture::Expect(50, 1, 16, "replica:ps");
  whole.set_held(true);
  whole.set_source_transfer_id(5);
  v1::ExpectDelivery partial = Fixture::Expect(51, 2, 16, "replica:ps");
  partial.set_held(true);
  partial.set_source_transfer_id(6);
  ReceiveLock::Hold guard(&f.lock);
  f.servers.PublishLocked(ServerKey(1, "replica:ps"), replica.session);
  f.deliveries.ExpectLocked(whole);
  f.deliveries.ExpectLocked(partial);
  f.deliveries.ExpectLocked(Fixture::Expect(60, 1));  // the server's, not here yet
  f.Arrive(50, 16, 0x11);
  f.Arrive(51, 16, 0x22, /*whole=*/false);
  CHECK(f.deliveries.ScheduleLostLocked("gone") == 3);
  v1::RegisterHostRequest request;
  f.deliveries.DescribeHeldCopiesLocked(&request);
  REQUIRE(request.held_copies_size() == 2);
  CHECK(request.held_copies(0).copy().transfer_id() == 50);
  CHECK_FALSE(request.held_copies(0).incomplete());
  CHECK(request.held_copies(1).copy().transfer_id() == 51);
  CHECK(request.held_copies(1).incomplete());
  CHECK(f.incoming.Contains(50));        // its bytes wait for the scheduler's word
  CHECK_FALSE(f.incoming.Contains(51));  // dropped
  f.deliveries.ToldLocked();
  v1::RegisterHostRequest again;
  f.deliveries.DescribeHeldCopiesLocked(&again);
  CHECK(again.held_copies_size() == 1);  // the lost one was told once
  CHECK(f.deliveries.DropHeldCopyLocked(50, "its push did not apply"));
  CHECK_FALSE(f.incoming.Contains(50));
  CHECK_FALSE(f.deliveries.DropHeldCopyLocked(50, "again"));
}

TEST_CASE("a restarted scheduler's positions start afresh") {
  Fixture f;
  {
    ReceiveLock::Hold guard(&f.lock);
    f.deliveries.ExpectLocked(Fixture::Expect(10, 1));
    f.deliveries.ExpectLocked(Fixture::Expect(20, 2));
    f.Arrive(20, 16, 0xbb);
    CHECK(f.deliveries.ResetLocked() == 2);
    CHECK_FALSE(f.incoming.Contains(20));
    // Position 1 again, from the new scheduler.
    f.deliveries.ExpectLocked(Fixture::Expect(70, 1));
    f.Arrive(70, 16, 0x77);
  }
  CHECK(f.Next().first == 70);
}

TEST_CASE("what a departed server expected fails, and its endpoint stays known") {
  Fixture f;
  ReceiveLock::Hold guard(&f.lock);
  f.deliveries.ExpectLocked(Fixture::Expect(10, 1));
  f.deliveries.ExpectLocked(Fixture::Expect(20, 2));
  const std::optional<std::string> key = f.servers.ForgetLocked(f.ps.session);
  REQUIRE(key.has_value());
  const std::vector<uint64_t> cancelled = f.deliveries.CancelAllLocked(*key, "left");
  CHECK(cancelled == std::vector<uint64_t>{10, 20});
  CHECK(f.deliveries.JobExpectingLocked(10) == 1u);  // until the positions are skipped
  f.deliveries.TryDeliverLocked(1, "ps");
  CHECK(f.deliveries.JobExpectingLocked(10) == std::nullopt);
  CHECK(f.deliveries.delivered() == 0);
}

}  // namespace
}  // namespace mlfabric::daemon
