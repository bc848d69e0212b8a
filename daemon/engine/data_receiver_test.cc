// Unit tests of DataReceiver, the daemon's data-plane receive side, wired
// as daemon.cc wires it (real IncomingTransfers, ServerEndpoints,
// Deliveries, NetworkAggregation, RoundService, an idle SendScheduler over
// PeerConnections, a CompletionReporter over a FakeSchedulerClient). Other
// daemons are played by plain TCP sockets that write Mercury frames with
// transport::WritePacket; the server application is a FakeApp
// (socketpair). No authentication (keys = null), no gets.
//
// Asynchronous effects are waited for with bounded polls only: the
// application's channel (FakeApp::Next), the scheduler's reports
// (WaitForCompletions) or a counter, after which the receive side's lock
// is taken so that the packet being accepted is done with.
#include "daemon/engine/data_receiver.h"

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
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
#include "daemon/engine/deliveries.h"
#include "daemon/engine/fake_app.h"
#include "daemon/engine/incoming_transfers.h"
#include "daemon/engine/network_aggregation.h"
#include "daemon/engine/receive_lock.h"
#include "daemon/engine/round_service.h"
#include "daemon/engine/server_endpoints.h"
#include "daemon/transport/framing.h"
#include "daemon/transport/packet.h"
#include "daemon/transport/peer_connections.h"
#include "daemon/transport/send_watchdog.h"
#include "ipc/local_ipc.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {
namespace {

using tcp = boost::asio::ip::tcp;

constexpr uint32_t kJob = 1;
constexpr uint32_t kOtherJob = 2;
const char* const kServer = "ps";
const char* const kHost = "ps-host";
constexpr uint32_t kPayloadBytes = 4096;  // the daemon's packet size here
constexpr uint64_t kMaxTransferBytes = 1 << 24;
constexpr uint64_t kSentinel = 999999;  // a report queued last: all before it are in
const auto kWait = std::chrono::seconds(5);

// Distinct bytes for each transfer, so a mix-up shows.
std::vector<uint8_t> Pattern(uint64_t transfer, size_t size) {
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) {
    bytes[i] = static_cast<uint8_t>((i * 131 + transfer * 17 + (i >> 8)) & 0xff);
  }
  return bytes;
}

// Polls `done` (every millisecond) until it holds or kWait passes.
template <typename Predicate>
bool Eventually(Predicate done) {
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

v1::ExpectDelivery Expect(uint64_t transfer, uint64_t sequence, int64_t bytes,
                          uint32_t job_id = kJob) {
  v1::ExpectDelivery expect;
  expect.set_transfer_id(transfer);
  expect.set_job_id(job_id);
  expect.set_server(kServer);
  expect.set_sequence(sequence);
  expect.set_bytes(bytes);
  expect.set_src_host("worker-host");
  expect.set_worker("w1");
  expect.set_version(7);
  return expect;
}

SendScheduler::Options SendOptions() {
  SendScheduler::Options options;
  options.payload_bytes = kPayloadBytes;
  return options;
}

RoundService::Options RoundOptions() {
  RoundService::Options options;
  options.host = kHost;
  options.payload_bytes = kPayloadBytes;
  return options;
}

// The receive side as Daemon's constructor builds it, listening on
// 127.0.0.1 (any port) and accepting, with server application "ps" of job
// 1 connected.
struct Rig {
  Rig() {
    REQUIRE(receiver.Listen("127.0.0.1", 0).ok());
    REQUIRE(!receiver.address().empty());
    receiver.Start(nullptr, nullptr);
    ReceiveLock::Hold guard(&lock);
    servers.PublishLocked(ServerKey(kJob, kServer), ps.session);
  }
  ~Rig() {
    stopping.store(true);  // as Daemon::Stop does, before stopping the receiver
    receiver.StopAccepting();
    receiver.StopSessions();
  }

  void ExpectDelivery(const v1::ExpectDelivery& expect) {
    ReceiveLock::Hold guard(&lock);
    deliveries.ExpectLocked(expect);
  }
  // Waits until `bytes` were received in all, then until the packet that
  // made them is done with (it is accepted under the lock).
  bool ReceivedBytes(int64_t bytes) {
    const bool reached = Eventually([&] { return receiver.bytes_received() >= bytes; });
    ReceiveLock::Hold guard(&lock);
    return reached && receiver.bytes_received() == bytes;
  }
  // Every report the scheduler got, once all queued so far are out (the
  // reporter sends in queueing order, so a sentinel queued now comes last).
  std::vector<v1::CompletionReport> SettledReports() {
    reporter.ReportFailure(kSentinel, "sentinel");
    std::vector<v1::CompletionReport> all;
    const bool settled = Eventually([&] {
      all = scheduler.completions();
      return !all.empty() && all.back().transfer_id() == kSentinel;
    });
    REQUIRE(settled);
    all.pop_back();
    return all;
  }
  // The next update handed to "ps" and its bytes.
  void NextUpdate(v1::LocalUpdate* update, std::vector<uint8_t>* bytes) {
    v1::LocalMessage message;
    int fd = -1;
    REQUIRE(ps.Next(&message, &fd));
    REQUIRE(message.has_update());
    REQUIRE(fd >= 0);
    *update = message.update();
    auto mapped = SharedBuffer::Map(fd, static_cast<size_t>(update->bytes()));
    REQUIRE(mapped.ok());
    bytes->assign(mapped->data(), mapped->data() + update->bytes());
  }

  ReceiveLock lock;
  std::atomic<bool> stopping{false};
  RealClock clock;
  FakeSchedulerClient scheduler;
  CompletionReporter reporter{&scheduler, kHost};
  transport::SendWatchdog watchdog{10};
  boost::asio::io_context io;
  transport::PeerConnections peers{io, watchdog, kPayloadBytes};
  AggregationTable aggregation_table{kPayloadBytes};
  SendScheduler send{SendOptions(), &clock, &peers, &aggregation_table,
                     [this](uint64_t transfer, const std::string& reason) {
                       reporter.ReportFailure(transfer, reason);
                     }};
  FakeApp ps{kJob, kServer, v1::ROLE_SERVER};
  BufferPool pool;
  IncomingTransfers incoming{&pool};
  ServerEndpoints servers{&lock, &pool, &stopping};
  Deliveries deliveries{kHost, &incoming, &servers, &reporter};
  NetworkAggregation aggregation{kPayloadBytes, &aggregation_table, &incoming, &send, &reporter};
  RoundService rounds{RoundOptions(), &lock,     &stopping, &incoming, &servers,
                      &send,          &reporter, &watchdog, &pool};
  DataReceiver receiver{&lock,
                        &clock,
                        &stopping,
                        /*keys=*/nullptr,
                        kMaxTransferBytes,
                        DataReceiver::Parts{&incoming, &rounds, &aggregation, &deliveries,
                                            &reporter, &pool}};
};

// Another daemon's data connection: a plain TCP socket writing frames.
class Sender {
 public:
  Sender(const std::string& address, transport::SendWatchdog& watchdog)
      : watchdog_(watchdog), socket_(io_) {
    auto endpoint = transport::ParseEndpoint(address);
    REQUIRE(endpoint.ok());
    boost::system::error_code error;
    socket_.connect(*endpoint, error);
    REQUIRE(!error);
  }

  int fd() { return socket_.native_handle(); }
  // How the receiver names this session ("<ip>:<port>").
  std::string Name() {
    const tcp::endpoint local = socket_.local_endpoint();
    return local.address().to_string() + ":" + std::to_string(local.port());
  }

  // kBegin: the transfer's total size in header.offset, no payload.
  void Begin(uint32_t job, uint64_t transfer, uint64_t total) {
    transport::PacketHeader header;
    header.kind = transport::PacketKind::kBegin;
    header.job = job;
    header.transfer = transfer;
    header.offset = total;
    REQUIRE(transport::WritePacket(watchdog_, fd(), header, nullptr, 0).ok());
  }
  // kData: bytes[offset, offset + length) at `offset`, with its CRC.
  void Data(uint32_t job, uint64_t transfer, const std::vector<uint8_t>& bytes, uint64_t offset,
            uint32_t length) {
    REQUIRE(offset + length <= bytes.size());
    transport::PacketHeader header;
    header.kind = transport::PacketKind::kData;
    header.job = job;
    header.transfer = transfer;
    header.offset = offset;
    REQUIRE(transport::WritePacket(watchdog_, fd(), header, bytes.data() + offset, length).ok());
  }
  // The packets of bytes[begin, end), kPayloadBytes at a time.
  void DataRange(uint32_t job, uint64_t transfer, const std::vector<uint8_t>& bytes,
                 uint64_t begin, uint64_t end) {
    for (uint64_t offset = begin; offset < end; offset += kPayloadBytes) {
      Data(job, transfer, bytes, offset,
           static_cast<uint32_t>(std::min<uint64_t>(kPayloadBytes, end - offset)));
    }
  }
  // A data packet whose payload was corrupted after its CRC was computed.
  void CorruptData(uint32_t job, uint64_t transfer, const std::vector<uint8_t>& bytes,
                   uint64_t offset, uint32_t length) {
    transport::PacketHeader header;
    header.kind = transport::PacketKind::kData;
    header.job = job;
    header.transfer = transfer;
    header.offset = offset;
    std::vector<uint8_t> frame(transport::kHeaderBytes + length);
    transport::EncodePacketHeader(header, bytes.data() + offset, length, frame.data());
    std::memcpy(frame.data() + transport::kHeaderBytes, bytes.data() + offset, length);
    frame[transport::kHeaderBytes + length / 2] ^= 0x5a;
    size_t sent = 0;
    while (sent < frame.size()) {
      const ssize_t n = ::send(fd(), frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      REQUIRE(n > 0);
      sent += static_cast<size_t>(n);
    }
  }
  // True once the receiver closed the connection (end of stream or a
  // reset), within kWait.
  bool ClosedByReceiver() {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (std::chrono::steady_clock::now() < deadline) {
      struct pollfd p {fd(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char byte;
      const ssize_t n = ::recv(fd(), &byte, 1, MSG_DONTWAIT);
      if (n == 0) return true;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
      if (n > 0) return false;  // the receiver never writes on a data session here
    }
    return false;
  }
  void Close() {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

 private:
  transport::SendWatchdog& watchdog_;
  boost::asio::io_context io_;
  tcp::socket socket_;
};

TEST_CASE("DataReceiver hands an expected update sent in several packets to its server") {
  Rig rig;
  constexpr uint64_t kTransfer = 101;
  const std::vector<uint8_t> bytes = Pattern(kTransfer, 3 * kPayloadBytes + 1000);  // 4 packets
  const int64_t total = static_cast<int64_t>(bytes.size());
  rig.ExpectDelivery(Expect(kTransfer, /*sequence=*/1, total));

  Sender sender(rig.receiver.address(), rig.watchdog);
  sender.Begin(kJob, kTransfer, bytes.size());
  // Out of order, the last packet held back: nothing is handed over early.
  sender.Data(kJob, kTransfer, bytes, 2 * kPayloadBytes, kPayloadBytes);
  sender.Data(kJob, kTransfer, bytes, 0, kPayloadBytes);
  sender.Data(kJob, kTransfer, bytes, 3 * kPayloadBytes, 1000);
  REQUIRE(rig.ReceivedBytes(total - kPayloadBytes));
  {
    ReceiveLock::Hold guard(&rig.lock);
    CHECK(rig.deliveries.delivered() == 0);
    REQUIRE(rig.incoming.Find(kTransfer) != nullptr);
    CHECK(rig.incoming.Find(kTransfer)->received == static_cast<uint64_t>(total - kPayloadBytes));
    CHECK(rig.ps.Quiet(0));
  }
  sender.Data(kJob, kTransfer, bytes, kPayloadBytes, kPayloadBytes);

  v1::LocalUpdate update;
  std::vector<uint8_t> delivered;
  rig.NextUpdate(&update, &delivered);
  CHECK(update.transfer_id() == kTransfer);
  CHECK(update.bytes() == total);
  CHECK(update.sequence() == 1);
  CHECK(update.worker() == "w1");
  CHECK(update.version() == 7);
  CHECK(update.count() == 1);
  CHECK(delivered == bytes);
  CHECK(rig.receiver.bytes_received() == total);
  CHECK(rig.receiver.malformed_sessions() == 0);
  {
    ReceiveLock::Hold guard(&rig.lock);
    CHECK(rig.deliveries.delivered() == 1);
    CHECK(!rig.incoming.Contains(kTransfer));  // handed over: the endpoint holds the buffer now
  }
  CHECK(rig.SettledReports().empty());  // nothing failed
}

TEST_CASE("DataReceiver delivers a transfer that arrived before its expectation") {
  Rig rig;
  constexpr uint64_t kTransfer = 201;
  const std::vector<uint8_t> bytes = Pattern(kTransfer, 2 * kPayloadBytes + 123);
  const int64_t total = static_cast<int64_t>(bytes.size());

  Sender sender(rig.receiver.address(), rig.watchdog);
  sender.Begin(kJob, kTransfer, bytes.size());
  sender.DataRange(kJob, kTransfer, bytes, 0, bytes.size());
  REQUIRE(rig.ReceivedBytes(total));
  {
    // Whole and kept, nobody to hand it to yet.
    ReceiveLock::Hold guard(&rig.lock);
    CHECK(rig.incoming.Complete(kTransfer));
    CHECK(rig.deliveries.delivered() == 0);
    CHECK(rig.ps.Quiet(0));
  }

  rig.ExpectDelivery(Expect(kTransfer, /*sequence=*/1, total));
  v1::LocalUpdate update;
  std::vector<uint8_t> delivered;
  rig.NextUpdate(&update, &delivered);
  CHECK(update.transfer_id() == kTransfer);
  CHECK(update.sequence() == 1);
  CHECK(update.bytes() == total);
  CHECK(delivered == bytes);
  CHECK(rig.receiver.malformed_sessions() == 0);
  CHECK(rig.SettledReports().empty());
}

TEST_CASE("DataReceiver skips a discarded transfer's bytes and goes on with the session") {
  // Bytes sent on a round grant whose push ended before it was announced
  // (scheduler/service/round_grants.h): erased, the rest refused, nothing
  // else on the session touched.
  Rig rig;
  constexpr uint64_t kEnded = 211, kEarly = 212, kKept = 213;
  const std::vector<uint8_t> bytes = Pattern(kEnded, 2 * kPayloadBytes);
  Sender sender(rig.receiver.address(), rig.watchdog);
  sender.Begin(kJob, kEnded, bytes.size());
  sender.DataRange(kJob, kEnded, bytes, 0, kPayloadBytes);
  REQUIRE(rig.ReceivedBytes(kPayloadBytes));
  {
    ReceiveLock::Hold guard(&rig.lock);
    REQUIRE(rig.incoming.Contains(kEnded));
    rig.incoming.Discard(kEnded);
    rig.incoming.Discard(kEarly);  // discarded before its first packet
    CHECK_FALSE(rig.incoming.Contains(kEnded));
  }
  sender.DataRange(kJob, kEnded, bytes, kPayloadBytes, bytes.size());
  sender.Begin(kJob, kEarly, bytes.size());
  sender.DataRange(kJob, kEarly, bytes, 0, bytes.size());
  const std::vector<uint8_t> kept = Pattern(kKept, kPayloadBytes + 5);
  sender.Begin(kJob, kKept, kept.size());
  sender.DataRange(kJob, kKept, kept, 0, kept.size());
  // Skipped bytes are not counted as received: only the first packet and kKept's.
  REQUIRE(rig.ReceivedBytes(kPayloadBytes + static_cast<int64_t>(kept.size())));
  rig.ExpectDelivery(Expect(kKept, /*sequence=*/1, static_cast<int64_t>(kept.size())));
  v1::LocalUpdate update;
  std::vector<uint8_t> delivered;
  rig.NextUpdate(&update, &delivered);
  CHECK(update.transfer_id() == kKept);
  CHECK(delivered == kept);
  ReceiveLock::Hold guard(&rig.lock);
  CHECK_FALSE(rig.incoming.Contains(kEnded));
  CHECK_FALSE(rig.incoming.Contains(kEarly));
  CHECK(rig.receiver.malformed_sessions() == 0);
}

TEST_CASE("DataReceiver closes a malformed session and fails only its unfinished transfer") {
  Rig rig;
  constexpr uint64_t kGood = 302;  // expected here, on a well-formed session
  constexpr uint64_t kBad = 301;   // on the session that goes bad
  const std::vector<uint8_t> good = Pattern(kGood, 2 * kPayloadBytes);
  const std::vector<uint8_t> bad = Pattern(kBad, 2 * kPayloadBytes);
  rig.ExpectDelivery(Expect(kGood, /*sequence=*/1, static_cast<int64_t>(good.size())));

  // The well-formed session is half way through its transfer.
  Sender well_formed(rig.receiver.address(), rig.watchdog);
  well_formed.Begin(kJob, kGood, good.size());
  well_formed.Data(kJob, kGood, good, 0, kPayloadBytes);
  REQUIRE(rig.ReceivedBytes(kPayloadBytes));

  Sender malformed(rig.receiver.address(), rig.watchdog);
  malformed.Begin(kJob, kBad, bad.size());
  malformed.Data(kJob, kBad, bad, 0, kPayloadBytes);
  std::string reason;
  SECTION("a payload whose CRC does not match") {
    malformed.CorruptData(kJob, kBad, bad, kPayloadBytes, kPayloadBytes);
    reason = "CRC32C mismatch on transfer 301";
  }
  SECTION("bytes received before, in a packet that overlaps") {
    // Inside the transfer's bounds, but 4096 + 6144 bytes of an 8192-byte one.
    malformed.Data(kJob, kBad, bad, kPayloadBytes / 2, kPayloadBytes + kPayloadBytes / 2);
    reason = "transfer 301 received bytes [2048, 8192) twice";
  }
  SECTION("the same packet twice") {
    // Counted twice, it completed the transfer with bytes [4096, 8192)
    // never sent: whatever a reused receive buffer held before.
    malformed.Data(kJob, kBad, bad, 0, kPayloadBytes);
    reason = "transfer 301 received bytes [0, 4096) twice";
  }

  REQUIRE(malformed.ClosedByReceiver());
  REQUIRE(rig.scheduler.WaitForCompletions(1, kWait));
  CHECK(rig.receiver.malformed_sessions() == 1);
  const v1::CompletionReport failed = rig.scheduler.completions().front();
  CHECK(failed.transfer_id() == kBad);
  CHECK(failed.host() == kHost);
  CHECK(!failed.applied());
  CHECK(failed.error().find("data session from " + malformed.Name() + " ended mid-transfer") !=
        std::string::npos);
  CHECK(failed.error().find(reason) != std::string::npos);
  {
    ReceiveLock::Hold guard(&rig.lock);
    CHECK(!rig.incoming.Contains(kBad));
    // The other session's transfer is untouched.
    REQUIRE(rig.incoming.Find(kGood) != nullptr);
    CHECK(rig.incoming.Find(kGood)->received == kPayloadBytes);
    CHECK(rig.deliveries.delivered() == 0);
  }

  // The well-formed session goes on and its transfer is delivered whole.
  well_formed.Data(kJob, kGood, good, kPayloadBytes, kPayloadBytes);
  v1::LocalUpdate update;
  std::vector<uint8_t> delivered;
  rig.NextUpdate(&update, &delivered);
  CHECK(update.transfer_id() == kGood);
  CHECK(update.sequence() == 1);
  CHECK(delivered == good);
  CHECK(rig.receiver.malformed_sessions() == 1);
  const std::vector<v1::CompletionReport> reports = rig.SettledReports();
  REQUIRE(reports.size() == 1);  // the bad transfer, once
  CHECK(reports[0].transfer_id() == kBad);
}

TEST_CASE("DataReceiver refuses a transfer of another job than the one expecting it") {
  Rig rig;
  constexpr uint64_t kTransfer = 401;
  const std::vector<uint8_t> bytes = Pattern(kTransfer, kPayloadBytes + 10);
  const int64_t total = static_cast<int64_t>(bytes.size());

  SECTION("expected before it begins: the begin is refused and the session ends") {
    rig.ExpectDelivery(Expect(kTransfer, /*sequence=*/1, total));
    Sender intruder(rig.receiver.address(), rig.watchdog);
    intruder.Begin(kOtherJob, kTransfer, bytes.size());
    REQUIRE(intruder.ClosedByReceiver());
    REQUIRE(Eventually([&] { return rig.receiver.malformed_sessions() == 1; }));
    {
      ReceiveLock::Hold guard(&rig.lock);
      CHECK(!rig.incoming.Contains(kTransfer));
      CHECK(rig.deliveries.delivered() == 0);
      CHECK(rig.ps.Quiet(0));
    }
    CHECK(rig.receiver.bytes_received() == 0);

    // The expectation stands: the transfer sent as its own job's arrives.
    Sender owner(rig.receiver.address(), rig.watchdog);
    owner.Begin(kJob, kTransfer, bytes.size());
    owner.DataRange(kJob, kTransfer, bytes, 0, bytes.size());
    v1::LocalUpdate update;
    std::vector<uint8_t> delivered;
    rig.NextUpdate(&update, &delivered);
    CHECK(update.transfer_id() == kTransfer);
    CHECK(delivered == bytes);
    CHECK(rig.SettledReports().empty());  // the refused begin failed nothing
  }

  SECTION("expected once it arrived: refused where it joins, nothing delivered") {
    Sender intruder(rig.receiver.address(), rig.watchdog);
    intruder.Begin(kOtherJob, kTransfer, bytes.size());
    intruder.DataRange(kOtherJob, kTransfer, bytes, 0, bytes.size());
    REQUIRE(rig.ReceivedBytes(total));
    rig.ExpectDelivery(Expect(kTransfer, /*sequence=*/1, total));
    const std::vector<v1::CompletionReport> reports = rig.SettledReports();
    REQUIRE(reports.size() == 1);
    CHECK(reports[0].transfer_id() == kTransfer);
    CHECK(!reports[0].applied());
    CHECK(reports[0].error().find("arrived as job 2's data but is job 1's") !=
          std::string::npos);
    CHECK(rig.ps.Quiet(50));
    ReceiveLock::Hold guard(&rig.lock);
    CHECK(rig.deliveries.delivered() == 0);
  }
}

TEST_CASE("DataReceiver stops while a connection is open and idle") {
  Rig rig;
  constexpr uint64_t kTransfer = 501;
  const std::vector<uint8_t> bytes = Pattern(kTransfer, 2 * kPayloadBytes);
  Sender idle(rig.receiver.address(), rig.watchdog);
  idle.Begin(kJob, kTransfer, bytes.size());
  idle.Data(kJob, kTransfer, bytes, 0, kPayloadBytes);
  REQUIRE(rig.ReceivedBytes(kPayloadBytes));  // its session runs, now blocked reading

  SECTION("with the daemon still running") {}
  SECTION("with stopping set first, as Daemon::Stop does") { rig.stopping.store(true); }

  auto stopped = std::async(std::launch::async, [&] {
    rig.receiver.StopAccepting();
    rig.receiver.StopSessions();
  });
  if (stopped.wait_for(kWait) != std::future_status::ready) {
    idle.Close();  // lets the session end, so that the test itself ends
    stopped.wait();
    FAIL("StopAccepting/StopSessions hung on an idle connection");
  }
  CHECK(idle.ClosedByReceiver());
  // The session ended cleanly; its unfinished transfer failed once.
  REQUIRE(rig.scheduler.WaitForCompletions(1, kWait));
  const v1::CompletionReport failed = rig.scheduler.completions().front();
  CHECK(failed.transfer_id() == kTransfer);
  CHECK(!failed.applied());
  CHECK(failed.error().find("data session from " + idle.Name() + " ended mid-transfer") !=
        std::string::npos);
  CHECK(rig.receiver.malformed_sessions() == 0);
  {
    ReceiveLock::Hold guard(&rig.lock);
    CHECK(!rig.incoming.Contains(kTransfer));
  }
  // No connection is accepted any more.
  boost::asio::io_context io;
  tcp::socket late(io);
  boost::system::error_code error;
  late.connect(*transport::ParseEndpoint(rig.receiver.address()), error);
  CHECK(error);
}

// Threads of this process now (/proc/self/task).
size_t ThreadCount() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

TEST_CASE("DataReceiver reads many sessions on its fixed I/O threads, none per session") {
  Rig rig;
  const size_t before = ThreadCount();
  // 200 connections that never send a byte, and 64 in the middle of a
  // transfer each (begun, one packet of two in).
  std::vector<std::unique_ptr<Sender>> idle;
  for (int i = 0; i < 200; ++i) {
    idle.push_back(std::make_unique<Sender>(rig.receiver.address(), rig.watchdog));
  }
  std::vector<std::unique_ptr<Sender>> busy;
  for (uint64_t i = 0; i < 64; ++i) {
    const uint64_t transfer = 700 + i;
    const std::vector<uint8_t> bytes = Pattern(transfer, 2 * kPayloadBytes);
    busy.push_back(std::make_unique<Sender>(rig.receiver.address(), rig.watchdog));
    busy.back()->Begin(kJob, transfer, bytes.size());
    busy.back()->Data(kJob, transfer, bytes, 0, kPayloadBytes);
  }
  REQUIRE(rig.ReceivedBytes(64 * kPayloadBytes));
  REQUIRE(Eventually([&] { return rig.receiver.sessions() == 264; }));
  // Before this change: a thread per connection, 264 more.
  CHECK(ThreadCount() == before);
  // Each session still goes on: the second packets complete the transfers.
  for (uint64_t i = 0; i < 64; ++i) {
    const uint64_t transfer = 700 + i;
    const std::vector<uint8_t> bytes = Pattern(transfer, 2 * kPayloadBytes);
    busy[i]->Data(kJob, transfer, bytes, kPayloadBytes, kPayloadBytes);
  }
  CHECK(rig.ReceivedBytes(128 * kPayloadBytes));
  CHECK(ThreadCount() == before);
}

// ---- same-host transfers (DeliverLocal): no socket

transport::PacketHeader LocalBegin(uint32_t job, uint64_t transfer, uint64_t total) {
  transport::PacketHeader begin;
  begin.kind = transport::PacketKind::kBegin;
  begin.job = job;
  begin.transfer = transfer;
  begin.offset = total;
  return begin;
}

SharedBuffer BufferOf(const std::vector<uint8_t>& bytes) {
  auto created = SharedBuffer::Create(bytes.size());
  REQUIRE(created.ok());
  std::memcpy(created->data(), bytes.data(), bytes.size());
  return std::move(*created);
}

TEST_CASE("DataReceiver::DeliverLocal hands a same-host update to its server, no socket") {
  Rig rig;
  constexpr uint64_t kTransfer = 601;
  const std::vector<uint8_t> bytes = Pattern(kTransfer, 3 * kPayloadBytes + 77);
  const int64_t total = static_cast<int64_t>(bytes.size());
  rig.ExpectDelivery(Expect(kTransfer, /*sequence=*/1, total));
  const SharedBuffer source = BufferOf(bytes);
  REQUIRE(rig.receiver.DeliverLocal(LocalBegin(kJob, kTransfer, total), source, kPayloadBytes)
              .ok());
  v1::LocalUpdate update;
  std::vector<uint8_t> delivered;
  rig.NextUpdate(&update, &delivered);
  CHECK(update.transfer_id() == kTransfer);
  CHECK(update.sequence() == 1);
  CHECK(delivered == bytes);
  // Counted as local, not as bytes received on a session.
  CHECK(rig.receiver.bytes_received() == 0);
  CHECK(rig.receiver.local_transfers() == 1);
  CHECK(rig.receiver.local_bytes() == total);
  CHECK(rig.SettledReports().empty());
}

TEST_CASE("DataReceiver::DeliverLocal before the expectation: kept, then delivered") {
  Rig rig;
  constexpr uint64_t kTransfer = 602;
  const std::vector<uint8_t> bytes = Pattern(kTransfer, kPayloadBytes / 2);
  const int64_t total = static_cast<int64_t>(bytes.size());
  REQUIRE(rig.receiver.DeliverLocal(LocalBegin(kJob, kTransfer, total), BufferOf(bytes),
                                    kPayloadBytes)
              .ok());
  {
    ReceiveLock::Hold guard(&rig.lock);
    CHECK(rig.incoming.Complete(kTransfer));
    CHECK(rig.deliveries.delivered() == 0);
  }
  rig.ExpectDelivery(Expect(kTransfer, /*sequence=*/1, total));
  v1::LocalUpdate update;
  std::vector<uint8_t> delivered;
  rig.NextUpdate(&update, &delivered);
  CHECK(update.transfer_id() == kTransfer);
  CHECK(delivered == bytes);
}

TEST_CASE("DataReceiver::DeliverLocal refuses another job's transfer and a second begin") {
  Rig rig;
  constexpr uint64_t kTransfer = 603;
  const std::vector<uint8_t> bytes = Pattern(kTransfer, kPayloadBytes);
  const int64_t total = static_cast<int64_t>(bytes.size());
  rig.ExpectDelivery(Expect(kTransfer, /*sequence=*/1, total));
  const absl::Status other =
      rig.receiver.DeliverLocal(LocalBegin(kOtherJob, kTransfer, total), BufferOf(bytes),
                                kPayloadBytes);
  CHECK(absl::IsPermissionDenied(other));
  REQUIRE(rig.receiver.DeliverLocal(LocalBegin(kJob, kTransfer, total), BufferOf(bytes),
                                    kPayloadBytes)
              .ok());
  v1::LocalUpdate update;
  std::vector<uint8_t> delivered;
  rig.NextUpdate(&update, &delivered);
  CHECK(delivered == bytes);
  // A size that disagrees with the buffer is refused before anything starts.
  CHECK(absl::IsInvalidArgument(rig.receiver.DeliverLocal(LocalBegin(kJob, 604, total + 1),
                                                          BufferOf(bytes), kPayloadBytes)));
  CHECK(rig.receiver.local_transfers() == 1);
}

TEST_CASE("DataReceiver::DeliverLocal sums a round member from the push's own buffer") {
  Rig rig;
  // A 2-member round of float32s: one member announced before its bytes
  // come (summed straight from the push's buffer), one after (kept in its
  // receive buffer until it joins, then summed from there).
  constexpr size_t kFloats = 3 * kPayloadBytes / sizeof(float) + 5;
  constexpr int64_t kTotal = static_cast<int64_t>(kFloats * sizeof(float));
  auto member = [](uint64_t transfer) {
    v1::ExpectDelivery expect;
    expect.set_transfer_id(transfer);
    expect.set_job_id(kJob);
    expect.set_server(kServer);
    expect.set_version(0);
    expect.set_round_size(2);
    expect.set_contributions(1);
    expect.set_bytes(kTotal);
    expect.set_dtype(v1::DTYPE_FLOAT32);
    return expect;
  };
  auto floats = [](float scale) {
    std::vector<uint8_t> bytes(kTotal);
    for (size_t i = 0; i < kFloats; ++i) {
      const float value = scale * static_cast<float>(i % 1000);
      std::memcpy(bytes.data() + i * sizeof(float), &value, sizeof(float));
    }
    return bytes;
  };
  {
    ReceiveLock::Hold guard(&rig.lock);
    rig.rounds.JoinLocked(member(701));
  }
  const SharedBuffer first = BufferOf(floats(1.0f));
  REQUIRE(rig.receiver.DeliverLocal(LocalBegin(kJob, 701, kTotal), first, kPayloadBytes).ok());
  // It took no receive buffer: none came back to the pool when it ended.
  CHECK(rig.pool.pooled_bytes() == 0);
  REQUIRE(rig.receiver.DeliverLocal(LocalBegin(kJob, 702, kTotal), BufferOf(floats(2.0f)),
                                    kPayloadBytes)
              .ok());
  {
    ReceiveLock::Hold guard(&rig.lock);
    rig.rounds.JoinLocked(member(702));
  }
  // Kept in its receive buffer until it joined; summed, the buffer is pooled.
  CHECK(rig.pool.pooled_bytes() == static_cast<size_t>(kTotal));
  v1::LocalUpdate update;
  std::vector<uint8_t> delivered;
  rig.NextUpdate(&update, &delivered);
  CHECK(delivered == floats(3.0f));
  CHECK(rig.receiver.local_transfers() == 2);
  CHECK(rig.receiver.bytes_received() == 0);
  CHECK(rig.SettledReports().empty());
}

}  // namespace
}  // namespace mlfabric::daemon
