#include "daemon/engine/replica_snapshots.h"

#include <chrono>
#include <cstring>

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>

#include "common/clock.h"
#include "daemon/control/fake_scheduler_client.h"
#include "daemon/engine/aggregation_table.h"
#include "ipc/buffer_pool.h"
#include "daemon/engine/deliveries.h"
#include "daemon/engine/fake_app.h"
#include "daemon/engine/incoming_transfers.h"
#include "daemon/engine/server_endpoints.h"
#include "daemon/transport/peer_connections.h"
#include "daemon/transport/send_watchdog.h"

namespace mlfabric::daemon {
namespace {

SendScheduler::Options SendOptions() {
  SendScheduler::Options options;
  options.payload_bytes = 4096;
  return options;
}

struct Fixture {
  ReceiveLock lock;
  std::atomic<bool> stopping{false};
  BufferPool pool;
  RealClock clock;
  transport::SendWatchdog watchdog{30};
  boost::asio::io_context io;
  transport::PeerConnections peers{io, watchdog, 4096};
  AggregationTable aggregations{4096};
  SendScheduler send{SendOptions(), &clock, &peers, &aggregations,
                     [](uint64_t, const std::string&) {}};
  FakeSchedulerClient scheduler;
  CompletionReporter reporter{&scheduler, "s1"};
  ReplicaSnapshots snapshots{&send, &reporter};
  IncomingTransfers incoming{&pool};
  ServerEndpoints servers{&lock, &pool, &stopping};
  Deliveries deliveries{"s1", &incoming, &servers, &reporter, &snapshots};
  FakeApp ps{1, "ps", v1::ROLE_SERVER};

  Fixture() {
    ReceiveLock::Hold guard(&lock);
    servers.PublishLocked(ServerKey(1, "ps"), ps.session);
  }
  static v1::SnapshotToReplica Command(uint64_t id, uint64_t after) {
    v1::SnapshotToReplica command;
    command.set_transfer_id(id);
    command.set_job_id(1);
    command.set_server("ps");
    command.set_after_sequence(after);
    command.set_dst_host("r1");
    command.set_dst_address("127.0.0.1:1");
    return command;
  }
  static v1::ExpectDelivery Expect(uint64_t transfer, uint64_t sequence, int64_t bytes = 16) {
    v1::ExpectDelivery expect;
    expect.set_transfer_id(transfer);
    expect.set_job_id(1);
    expect.set_server("ps");
    expect.set_sequence(sequence);
    expect.set_bytes(bytes);
    return expect;
  }
  void Arrive(uint64_t transfer, std::vector<uint8_t> bytes) {
    auto buffer = SharedBuffer::Create(bytes.size());
    REQUIRE(buffer.ok());
    std::memcpy(buffer->data(), bytes.data(), bytes.size());
    Incoming& in = incoming.Add(transfer, 1, bytes.size(),
                                std::make_shared<SharedBuffer>(std::move(*buffer)));
    in.received = bytes.size();
    deliveries.ArrivedLocked(transfer);
  }
  v1::LocalMessage Next() {
    v1::LocalMessage message;
    int fd = -1;
    REQUIRE(ps.Next(&message, &fd));
    if (fd >= 0) ::close(fd);
    return message;
  }
};

TEST_CASE("the snapshot is asked for right after the cut, before the next update") {
  Fixture f;
  {
    ReceiveLock::Hold guard(&f.lock);
    f.deliveries.ExpectLocked(Fixture::Expect(10, 1));
    f.deliveries.ExpectLocked(Fixture::Expect(20, 2));
    f.snapshots.AddLocked(Fixture::Command(500, /*after=*/1));
    f.deliveries.TryDeliverLocked(1, "ps");
  }
  CHECK(f.ps.Quiet());  // position 1 not handed over yet: nothing asked
  {
    ReceiveLock::Hold guard(&f.lock);
    f.Arrive(20, std::vector<uint8_t>(16, 2));
    f.Arrive(10, std::vector<uint8_t>(16, 1));
  }
  CHECK(f.Next().update().transfer_id() == 10);
  const v1::LocalMessage ask = f.Next();
  REQUIRE(ask.has_model_request());
  CHECK((ask.model_request().request_id() & kSnapshotRequestBit) != 0);
  CHECK(f.Next().update().transfer_id() == 20);

  // The answer goes out as one transfer: the version, then the model.
  auto model = SharedBuffer::Create(64);
  REQUIRE(model.ok());
  CHECK(f.snapshots.Answer(ask.model_request().request_id(), 7,
                           std::make_shared<SharedBuffer>(std::move(*model)), ""));
  // Answered again: a snapshot id still, ignored (never the model server's).
  CHECK(f.snapshots.Answer(ask.model_request().request_id(), 7, nullptr, ""));
  CHECK_FALSE(f.snapshots.Answer(3, 7, nullptr, ""));  // a get's: not ours
  // Nor a group get's fresh read or a shard's kept snapshot (they once
  // shared the bit, and a fresh read then waited 30 s for its answer).
  CHECK_FALSE(f.snapshots.Answer(kSoloRequestBit | 1, 7, nullptr, ""));
  CHECK_FALSE(f.snapshots.Answer(kHistoryRequestBit | 1, 7, nullptr, ""));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(f.scheduler.completions().empty());  // scheduled, nothing failed
}

TEST_CASE("a cut already passed is asked for at once; one never answered fails") {
  Fixture f;
  {
    ReceiveLock::Hold guard(&f.lock);
    f.snapshots.AddLocked(Fixture::Command(501, /*after=*/0));  // before any update
    f.deliveries.TryDeliverLocked(1, "ps");
  }
  const v1::LocalMessage ask = f.Next();
  REQUIRE(ask.has_model_request());
  CHECK(f.snapshots.Answer(ask.model_request().request_id(), 0, nullptr, "model is busy"));
  REQUIRE(f.scheduler.WaitForCompletions(1, std::chrono::seconds(10)));
  CHECK(f.scheduler.completions()[0].transfer_id() == 501);
  CHECK(f.scheduler.completions()[0].error().find("model is busy") != std::string::npos);

  // The server leaves before a cut is reached: that snapshot fails.
  {
    ReceiveLock::Hold guard(&f.lock);
    f.snapshots.AddLocked(Fixture::Command(502, /*after=*/5));
    f.snapshots.FailServerLocked(ServerKey(1, "ps"), "server 'ps' disconnected");
  }
  REQUIRE(f.scheduler.WaitForCompletions(2, std::chrono::seconds(10)));
  CHECK(f.scheduler.completions()[1].transfer_id() == 502);
}

TEST_CASE("a replica is handed its snapshot: the version, then the model") {
  Fixture f;
  FakeApp replica{1, "ps", v1::ROLE_REPLICA};
  v1::ExpectDelivery snapshot = Fixture::Expect(600, 1, /*bytes=*/0);
  snapshot.set_server("replica:ps");
  snapshot.set_snapshot(true);
  std::vector<uint8_t> bytes(8 + 32, 0xab);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(uint64_t{0x0102} >> (8 * i));
  {
    ReceiveLock::Hold guard(&f.lock);
    f.servers.PublishLocked(ServerKey(1, "replica:ps"), replica.session);
    f.deliveries.ExpectLocked(snapshot);
    f.Arrive(600, bytes);
  }
  v1::LocalMessage message;
  int fd = -1;
  REQUIRE(replica.Next(&message, &fd));
  REQUIRE(message.has_update());
  CHECK(message.update().snapshot());
  CHECK(message.update().version() == 0x0102);
  CHECK(message.update().data_offset() == 8);
  CHECK(message.update().bytes() == 32);
  auto mapped = SharedBuffer::Map(fd, 40);
  REQUIRE(mapped.ok());
  CHECK(mapped->data()[8] == 0xab);
}

}  // namespace
}  // namespace mlfabric::daemon
