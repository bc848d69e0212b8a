// NetworkAggregation with its real collaborators: an AggregationTable, the
// receive side's IncomingTransfers, a SendScheduler writing through
// PeerConnections (never Start()ed: the tests that check an aggregate's sum
// run one SendReady pass after another themselves, to a loopback listener
// standing in for the next hop) and a CompletionReporter over a
// FakeSchedulerClient.
#include "daemon/engine/network_aggregation.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <catch2/catch.hpp>

#include "common/clock.h"
#include "daemon/control/completion_reporter.h"
#include "daemon/control/fake_scheduler_client.h"
#include "daemon/engine/aggregation_table.h"
#include "ipc/buffer_pool.h"
#include "daemon/engine/send_scheduler.h"
#include "daemon/engine/incoming_transfers.h"
#include "daemon/transport/framing.h"
#include "daemon/transport/packet.h"
#include "daemon/transport/peer_connections.h"
#include "daemon/transport/send_watchdog.h"

namespace mlfabric::daemon {
namespace {

using boost::asio::ip::tcp;

constexpr uint32_t kPayload = 16;  // bytes: 4 floats a packet (and a grid packet)
constexpr uint32_t kJob = 1;
// Long enough for the reporter's thread to have passed on a failure that
// was queued (reports are asynchronous), short enough to keep the test fast.
constexpr auto kQuiet = std::chrono::milliseconds(100);
constexpr auto kPatience = std::chrono::seconds(5);

std::shared_ptr<SharedBuffer> FloatBuffer(const std::vector<float>& values) {
  auto created = SharedBuffer::Create(values.size() * sizeof(float));
  REQUIRE(created.ok());
  auto buffer = std::make_shared<SharedBuffer>(std::move(*created));
  std::memcpy(buffer->data(), values.data(), buffer->size());
  return buffer;
}

// values[i] = scale * (i + 1)
std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = scale * static_cast<float>(i + 1);
  return values;
}

SendScheduler::Options SendOptions() {
  SendScheduler::Options options;
  options.payload_bytes = kPayload;
  return options;
}

struct Fixture {
  Fixture()
      : acceptor(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)),
        watchdog(5.0),
        peers(io, watchdog, kPayload),
        table(kPayload),
        reporter(&scheduler, "aggregator-host"),
        send(SendOptions(), &clock, &peers, &table,
             [this](uint64_t transfer, const std::string& reason) {
               reporter.ReportFailure(transfer, reason);
             }),
        incoming(&pool),
        aggregation(kPayload, &table, &incoming, &send, &reporter) {}
  ~Fixture() { peers.CloseAll(); }

  std::string NextHop() const {
    const tcp::endpoint endpoint = acceptor.local_endpoint();
    return endpoint.address().to_string() + ":" + std::to_string(endpoint.port());
  }

  // An aggregate of `bytes` float32 bytes, to leave for the loopback
  // listener as soon as it is summed (unpaced, starting now).
  v1::AggregateTask Task(uint64_t id, const std::vector<uint64_t>& constituents,
                         int64_t bytes) const {
    v1::AggregateTask task;
    task.set_aggregate_id(id);
    task.set_job_id(kJob);
    for (uint64_t c : constituents) task.add_constituents(c);
    task.set_bytes(bytes);
    task.set_dtype(v1::DTYPE_FLOAT32);
    task.set_dst_host("next-hop");
    task.set_dst_address(NextHop());
    task.set_start_s(clock.NowSeconds());
    return task;
  }

  // `transfer` begun (as the data receiver does on kBegin) with its bytes
  // already in its receive buffer, none counted as received yet. The test
  // keeps no reference to the buffer, so a recycled buffer is pooled.
  void Begin(uint64_t transfer, const std::vector<float>& values, uint32_t job = kJob) {
    auto buffer = FloatBuffer(values);
    const uint64_t total = buffer->size();
    incoming.Add(transfer, job, total, std::move(buffer));
  }

  // Packets [from, to) of `transfer`'s buffer arrive for `aggregate`, each
  // counted and folded as the data receiver does; false if a fold failed.
  bool Arrive(uint64_t aggregate, uint64_t transfer, uint64_t from, uint64_t to) {
    for (uint64_t offset = from; offset < to; offset += kPayload) {
      Incoming* in = incoming.Find(transfer);
      REQUIRE(in != nullptr);
      const uint32_t length = static_cast<uint32_t>(std::min<uint64_t>(kPayload, to - offset));
      in->received += length;
      if (!aggregation.FoldPacketLocked(aggregate, transfer, in->total,
                                        in->buffer->data() + offset, offset, length)) {
        return false;
      }
    }
    return true;
  }

  // Packets [from, to) of `transfer` arrive before it is known as a
  // constituent: counted and remembered as unfolded.
  void ArriveUnknown(uint64_t transfer, uint64_t from, uint64_t to) {
    Incoming* in = incoming.Find(transfer);
    REQUIRE(in != nullptr);
    for (uint64_t offset = from; offset < to; offset += kPayload) {
      const uint32_t length = static_cast<uint32_t>(std::min<uint64_t>(kPayload, to - offset));
      in->received += length;
      in->unfolded.emplace_back(offset, length);
    }
  }

  // Runs the sender loop's passes until aggregate `id` has left, then reads
  // what reached the next hop: the aggregate's bytes as floats.
  std::vector<float> SentSum(uint64_t id, size_t bytes) {
    const auto deadline = std::chrono::steady_clock::now() + kPatience;
    while (send.Has(id) && std::chrono::steady_clock::now() < deadline) {
      send.SendReady();
      if (send.Has(id)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(!send.Has(id));
    if (accepted == nullptr) {
      accepted = std::make_unique<tcp::socket>(io);
      acceptor.accept(*accepted);
      timeval timeout{5, 0};  // a missing packet fails the test instead of hanging it
      ::setsockopt(accepted->native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout,
                   sizeof(timeout));
      reader = std::make_unique<transport::FrameReader>(accepted->native_handle());
    }
    std::vector<uint8_t> sum(bytes, 0);
    std::vector<bool> seen(bytes, false);
    size_t got = 0;
    bool begun = false;
    while (got < bytes) {
      auto header = reader->ReadHeader();
      REQUIRE(header.ok());
      std::vector<uint8_t> payload(header->length);
      REQUIRE(reader->ReadPayload(payload.data(), payload.size()).ok());
      if (header->transfer != id) continue;
      if (header->kind == transport::PacketKind::kBegin) {
        CHECK(header->offset == bytes);  // kBegin carries the transfer's size
        begun = true;
        continue;
      }
      REQUIRE(header->kind == transport::PacketKind::kData);
      REQUIRE(header->offset + header->length <= bytes);
      for (uint32_t i = 0; i < header->length; ++i) {
        REQUIRE(!seen[header->offset + i]);  // each byte once
        seen[header->offset + i] = true;
        sum[header->offset + i] = payload[i];
      }
      got += header->length;
    }
    CHECK(begun);
    std::vector<float> floats(bytes / sizeof(float));
    std::memcpy(floats.data(), sum.data(), bytes);
    return floats;
  }

  // Waits for exactly `n` failure reports (and no more arriving soon after).
  std::vector<v1::CompletionReport> Failures(size_t n) {
    if (n > 0) REQUIRE(scheduler.WaitForCompletions(n, kPatience));
    CHECK(!scheduler.WaitForCompletions(n + 1, kQuiet));
    return scheduler.completions();
  }

  boost::asio::io_context io;
  tcp::acceptor acceptor;
  transport::SendWatchdog watchdog;
  RealClock clock;
  transport::PeerConnections peers;
  AggregationTable table;
  FakeSchedulerClient scheduler;
  CompletionReporter reporter;
  SendScheduler send;
  BufferPool pool;
  IncomingTransfers incoming;
  NetworkAggregation aggregation;
  std::unique_ptr<tcp::socket> accepted;
  std::unique_ptr<transport::FrameReader> reader;
};

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("NetworkAggregation sums constituents packet by packet and forwards the aggregate") {
  Fixture f;
  f.aggregation.StartLocked(f.Task(100, {1, 2}, 32));  // 8 floats, 2 packets
  REQUIRE(f.aggregation.Active(100));
  CHECK(f.aggregation.AggregateOf(1) == 100u);
  CHECK(f.aggregation.AggregateOf(2) == 100u);
  CHECK(!f.aggregation.AggregateOf(3).has_value());
  CHECK(f.aggregation.JobOf(100) == kJob);
  CHECK(f.send.Has(100));  // its gated send is scheduled

  f.Begin(1, Ramp(8, 1.0f));
  f.Begin(2, Ramp(8, 10.0f));
  // Constituent 2's second packet first, then constituent 1 whole.
  REQUIRE(f.Arrive(100, 2, 16, 32));
  REQUIRE(f.Arrive(100, 1, 0, 32));
  CHECK(f.table.ReadyPackets(100) == std::vector<uint32_t>{1});
  CHECK(f.aggregation.FinishLocked(1));
  CHECK(!f.incoming.Contains(1));         // recycled...
  CHECK(f.pool.pooled_bytes() == 32);     // ...into the pool, not just erased
  CHECK(f.aggregation.completed() == 0);  // constituent 2 is still to come
  CHECK(f.aggregation.Active(100));

  REQUIRE(f.Arrive(100, 2, 0, 16));
  CHECK(f.aggregation.FinishLocked(2));
  CHECK(f.aggregation.completed() == 1);
  CHECK(!f.aggregation.Active(100));
  CHECK(!f.incoming.Contains(2));
  CHECK(f.incoming.size() == 0);
  CHECK(f.pool.pooled_bytes() == 64);
  CHECK(!f.aggregation.AggregateOf(1).has_value());
  CHECK(!f.aggregation.FinishLocked(2));  // no constituent any more
  CHECK(f.aggregation.completed() == 1);

  // What left for the next hop: 1 * (i + 1) + 10 * (i + 1).
  CHECK(f.SentSum(100, 32) == Ramp(8, 11.0f));
  CHECK(f.Failures(0).empty());
}

TEST_CASE("NetworkAggregation sums at the task what arrived before it, and finishes the whole") {
  Fixture f;
  // Constituent 21 arrived whole, 22 only its second packet, 23 nothing.
  f.Begin(21, Ramp(8, 1.0f));
  f.ArriveUnknown(21, 0, 32);
  f.Begin(22, Ramp(8, 10.0f));
  f.ArriveUnknown(22, 16, 32);

  f.aggregation.StartLocked(f.Task(200, {21, 22, 23}, 32));
  REQUIRE(f.aggregation.Active(200));
  CHECK(!f.incoming.Contains(21));  // summed and finished at the task
  CHECK(f.pool.pooled_bytes() == 32);  // and its buffer kept for the next transfer
  CHECK(!f.aggregation.AggregateOf(21).has_value());
  REQUIRE(f.incoming.Contains(22));  // summed so far, still awaited
  CHECK(f.incoming.Find(22)->unfolded.empty());
  CHECK(f.aggregation.AggregateOf(22) == 200u);
  CHECK(f.aggregation.AggregateOf(23) == 200u);
  CHECK(f.aggregation.completed() == 0);

  // 22's first packet arrives now; its second was folded at the task (the
  // sum below has it once).
  REQUIRE(f.Arrive(200, 22, 0, 16));
  CHECK(f.aggregation.FinishLocked(22));
  CHECK(f.aggregation.completed() == 0);
  f.Begin(23, Ramp(8, 100.0f));
  REQUIRE(f.Arrive(200, 23, 0, 32));
  CHECK(f.aggregation.FinishLocked(23));
  CHECK(f.aggregation.completed() == 1);
  CHECK(!f.aggregation.Active(200));
  CHECK(f.incoming.size() == 0);

  CHECK(f.SentSum(200, 32) == Ramp(8, 111.0f));
  CHECK(f.Failures(0).empty());
}

TEST_CASE("NetworkAggregation fails the aggregate on a constituent of the wrong size") {
  Fixture f;

  SECTION("a packet of a constituent of another size") {
    f.aggregation.StartLocked(f.Task(300, {31, 32}, 32));
    REQUIRE(f.aggregation.Active(300));
    f.Begin(31, Ramp(16, 1.0f));  // 64 bytes, the aggregate 32
    f.Begin(32, Ramp(8, 1.0f));
    REQUIRE(f.Arrive(300, 32, 0, 16));
    CHECK(!f.Arrive(300, 31, 0, 16));
    CHECK(!f.aggregation.Active(300));
    CHECK(!f.send.Has(300));  // its send is cancelled
    // The constituents it still waited for are forgotten.
    CHECK(!f.incoming.Contains(31));
    CHECK(!f.incoming.Contains(32));
    CHECK(!f.aggregation.AggregateOf(31).has_value());
    CHECK(!f.aggregation.AggregateOf(32).has_value());
    CHECK(!f.aggregation.FinishLocked(32));
    CHECK(f.aggregation.completed() == 0);
    const auto failures = f.Failures(1);
    REQUIRE(failures.size() == 1);
    CHECK(failures[0].transfer_id() == 300u);
    CHECK(!failures[0].applied());
    CHECK(failures[0].host() == "aggregator-host");
    CHECK(failures[0].error() == "aggregation failed: constituent 31 has 64 bytes, the aggregate 32");
  }

  SECTION("a constituent of another size that arrived before the task") {
    f.Begin(33, Ramp(4, 1.0f));  // 16 bytes, the aggregate 32
    f.ArriveUnknown(33, 0, 16);
    f.Begin(34, Ramp(8, 1.0f));
    f.ArriveUnknown(34, 0, 16);
    f.aggregation.StartLocked(f.Task(301, {34, 33}, 32));
    CHECK(!f.aggregation.Active(301));
    CHECK(!f.send.Has(301));
    CHECK(!f.incoming.Contains(33));
    CHECK(!f.incoming.Contains(34));
    CHECK(!f.aggregation.AggregateOf(34).has_value());
    CHECK(f.aggregation.completed() == 0);
    const auto failures = f.Failures(1);
    REQUIRE(failures.size() == 1);
    CHECK(failures[0].transfer_id() == 301u);
    CHECK(failures[0].error() == "aggregation failed: constituent 33 has 16 bytes, the aggregate 32");
  }

  SECTION("a constituent that arrived before the task as another job's data") {
    f.Begin(35, Ramp(8, 1.0f), /*job=*/kJob + 1);
    f.ArriveUnknown(35, 0, 32);
    f.aggregation.StartLocked(f.Task(302, {35, 36}, 32));
    CHECK(!f.aggregation.Active(302));
    CHECK(!f.send.Has(302));
    const auto failures = f.Failures(1);
    REQUIRE(failures.size() == 1);
    CHECK(failures[0].transfer_id() == 302u);
    CHECK(Contains(failures[0].error(), "aggregation failed: transfer 35 arrived as job 2"));
  }

  SECTION("a task the table refuses is reported, with nothing scheduled") {
    v1::AggregateTask task = f.Task(303, {37}, 30);  // not a multiple of 4 bytes
    f.aggregation.StartLocked(task);
    CHECK(!f.aggregation.Active(303));
    CHECK(!f.send.Has(303));
    const auto failures = f.Failures(1);
    REQUIRE(failures.size() == 1);
    CHECK(failures[0].transfer_id() == 303u);
    CHECK(Contains(failures[0].error(), "30 bytes"));
  }
}

TEST_CASE("NetworkAggregation::DropLocked forgets the constituents awaited, reporting nothing") {
  Fixture f;
  f.aggregation.StartLocked(f.Task(400, {41, 42, 43}, 32));
  REQUIRE(f.aggregation.Active(400));
  f.Begin(41, Ramp(8, 1.0f));
  REQUIRE(f.Arrive(400, 41, 0, 32));
  REQUIRE(f.aggregation.FinishLocked(41));
  f.Begin(42, Ramp(8, 1.0f));
  REQUIRE(f.Arrive(400, 42, 0, 16));  // half of it
  f.Begin(99, Ramp(8, 1.0f));         // no constituent of anything
  f.ArriveUnknown(99, 0, 32);
  const size_t pooled = f.pool.pooled_bytes();

  f.aggregation.DropLocked(400, "the scheduler cancelled it");
  CHECK(!f.aggregation.Active(400));
  CHECK(!f.send.Has(400));
  CHECK(!f.incoming.Contains(42));  // erased...
  CHECK(f.pool.pooled_bytes() == pooled);  // ...not recycled
  CHECK(f.incoming.Contains(99));          // not its business
  CHECK(!f.aggregation.AggregateOf(42).has_value());
  CHECK(!f.aggregation.AggregateOf(43).has_value());
  CHECK(!f.aggregation.FinishLocked(42));
  CHECK(!f.aggregation.FinishLocked(43));
  // A transfer that is no constituent is left to the deliveries.
  CHECK(!f.aggregation.FinishLocked(99));
  CHECK(f.incoming.Contains(99));
  CHECK(f.incoming.Find(99)->unfolded.size() == 2);
  // Dropping again (or an unknown aggregate) is a no-op.
  f.aggregation.DropLocked(400, "again");
  f.aggregation.DropLocked(401, "never here");
  CHECK(f.aggregation.completed() == 0);
  CHECK(f.Failures(0).empty());
}

v1::SendTransfer LocalPush(uint64_t transfer, int64_t bytes) {
  v1::SendTransfer send;
  send.set_transfer_id(transfer);
  send.set_job_id(kJob);
  send.set_bytes(bytes);
  send.set_dst_host("this-host");
  return send;
}

TEST_CASE("NetworkAggregation::AcceptLocalLocked sums a local push without a socket") {
  Fixture f;

  SECTION("a push of this host into an aggregate here") {
    f.aggregation.StartLocked(f.Task(500, {51, 52}, 32));
    REQUIRE(f.aggregation.Active(500));
    f.aggregation.AcceptLocalLocked(LocalPush(51, 32), FloatBuffer(Ramp(8, 1.0f)));
    CHECK(!f.incoming.Contains(51));  // summed and finished
    CHECK(!f.aggregation.AggregateOf(51).has_value());
    CHECK(f.aggregation.Active(500));
    CHECK(f.aggregation.completed() == 0);
    // The other constituent arrives from the network.
    f.Begin(52, Ramp(8, 2.0f));
    REQUIRE(f.Arrive(500, 52, 0, 32));
    CHECK(f.aggregation.FinishLocked(52));
    CHECK(f.aggregation.completed() == 1);
    CHECK(!f.aggregation.Active(500));
    CHECK(f.SentSum(500, 32) == Ramp(8, 3.0f));
    CHECK(f.Failures(0).empty());
  }

  SECTION("a push whose schedule disagrees with its data is reported failed") {
    f.aggregation.StartLocked(f.Task(510, {53, 54}, 32));
    f.aggregation.AcceptLocalLocked(LocalPush(53, 64), FloatBuffer(Ramp(8, 1.0f)));
    CHECK(!f.incoming.Contains(53));
    const auto failures = f.Failures(1);
    REQUIRE(failures.size() == 1);
    CHECK(failures[0].transfer_id() == 53u);
    CHECK(failures[0].error() == "schedule says 64 bytes, the data has 32");
    CHECK(f.aggregation.completed() == 0);
  }

  SECTION("a push smaller than its aggregate fails the aggregate, not its sum") {
    // It used to be summed into the first half and counted whole: the
    // aggregate left without its second half.
    f.aggregation.StartLocked(f.Task(530, {57, 58}, 32));
    f.aggregation.AcceptLocalLocked(LocalPush(57, 16), FloatBuffer(Ramp(4, 1.0f)));
    CHECK(!f.aggregation.Active(530));
    const auto failures = f.Failures(1);
    REQUIRE(failures.size() == 1);
    CHECK(failures[0].transfer_id() == 530u);
    CHECK(failures[0].error() ==
          "aggregation failed: constituent 57 has 16 bytes, the aggregate 32");
    CHECK(f.aggregation.completed() == 0);
  }

  SECTION("a push of another job fails the aggregate") {
    f.aggregation.StartLocked(f.Task(540, {59, 60}, 32));
    v1::SendTransfer other = LocalPush(59, 32);
    other.set_job_id(kJob + 1);
    f.aggregation.AcceptLocalLocked(other, FloatBuffer(Ramp(8, 1.0f)));
    CHECK(!f.aggregation.Active(540));
    const auto failures = f.Failures(1);
    REQUIRE(failures.size() == 1);
    CHECK(failures[0].transfer_id() == 540u);
    CHECK(Contains(failures[0].error(), "constituent 59 is job 2's, the aggregate job 1's"));
  }

  SECTION("a push for no aggregate here is kept, unfolded, for the task to come") {
    // 40 bytes: packets of 16, 16 and 8.
    f.aggregation.AcceptLocalLocked(LocalPush(55, 40), FloatBuffer(Ramp(10, 1.0f)));
    REQUIRE(f.incoming.Contains(55));
    const Incoming* in = f.incoming.Find(55);
    CHECK(in->job_id == kJob);
    CHECK(in->total == 40);
    CHECK(in->received == 40);
    CHECK(in->unfolded == std::vector<std::pair<uint64_t, uint32_t>>{{0, 16}, {16, 16}, {32, 8}});
    CHECK(f.aggregation.completed() == 0);

    // The task comes: the kept push is summed and finished then.
    f.aggregation.StartLocked(f.Task(520, {55, 56}, 40));
    REQUIRE(f.aggregation.Active(520));
    CHECK(!f.incoming.Contains(55));
    CHECK(!f.aggregation.AggregateOf(55).has_value());
    f.Begin(56, Ramp(10, 5.0f));
    REQUIRE(f.Arrive(520, 56, 0, 40));
    CHECK(f.aggregation.FinishLocked(56));
    CHECK(f.aggregation.completed() == 1);
    CHECK(f.SentSum(520, 40) == Ramp(10, 6.0f));
    CHECK(f.Failures(0).empty());
  }
}

}  // namespace
}  // namespace mlfabric::daemon
