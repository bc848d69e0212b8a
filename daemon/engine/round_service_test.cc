// Unit tests of RoundService (Mercury-PS synchronous rounds): members'
// packets summed as they come, the complete sum handed to the server
// application once, its acknowledgement turned into one report per member,
// and every way a round fails. No scheduler process and no data sockets:
// the server application is a FakeApp (socketpair), failures are read from
// a FakeSchedulerClient behind a CompletionReporter.
#include "daemon/engine/round_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>

#include "common/clock.h"
#include "daemon/control/completion_reporter.h"
#include "daemon/control/fake_scheduler_client.h"
#include "daemon/engine/aggregation_table.h"
#include "ipc/buffer_pool.h"
#include "daemon/engine/send_scheduler.h"
#include "daemon/engine/fake_app.h"
#include "daemon/engine/incoming_transfers.h"
#include "daemon/engine/receive_lock.h"
#include "daemon/engine/server_endpoints.h"
#include "daemon/transport/peer_connections.h"
#include "daemon/transport/send_watchdog.h"
#include "ipc/local_ipc.h"

namespace mlfabric::daemon {
namespace {

constexpr uint32_t kJob = 1;
const char* const kServer = "ps";
constexpr uint64_t kChunk = 64;     // the round's release grid: 16 elements
constexpr uint32_t kPacket = 40;    // packets of 10 elements, off the grid on purpose
constexpr size_t kElements = 60;    // 240 bytes: 4 chunks, the last one short
constexpr int64_t kBytes = kElements * 4;
constexpr uint64_t kSentinel = 424242;  // a report queued last: all before it are in
const auto kWait = std::chrono::seconds(5);

std::string Key() { return ServerKey(kJob, kServer); }

RoundService::Options TestOptions(int64_t rounds_kept = 4) {
  RoundService::Options options;
  options.host = "ps-host";
  options.rounds_kept = rounds_kept;
  options.round_wait_s = 1;
  options.payload_bytes = kPacket;
  options.chunk_bytes = kChunk;
  return options;
}

SendScheduler::Options SendOptions() {
  SendScheduler::Options options;
  options.payload_bytes = kPacket;
  return options;
}

// Everything a RoundService is built on, as the daemon wires it
// (daemon.cc), with a server application "ps" of job 1 on a socketpair.
struct Rig {
  explicit Rig(RoundService::Options options = TestOptions())
      : rounds(std::move(options), &lock, &stopping, &incoming, &servers, &send, &reporter,
               &watchdog, &pool) {}

  void Connect() {
    ReceiveLock::Hold guard(&lock);
    servers.PublishLocked(Key(), ps.session);
  }
  void Join(const v1::ExpectDelivery& expect) {
    ReceiveLock::Hold guard(&lock);
    rounds.JoinLocked(expect);
  }
  // Bytes [begin, end) of member `transfer`, as the data receiver folds
  // them: one packet of at most kPacket bytes at a time.
  void Fold(uint64_t transfer, const std::vector<uint8_t>& bytes, uint64_t begin, uint64_t end) {
    for (uint64_t offset = begin; offset < end; offset += kPacket) {
      const uint32_t length = static_cast<uint32_t>(std::min<uint64_t>(kPacket, end - offset));
      ReceiveLock::Hold guard(&lock);
      rounds.FoldPacketLocked(transfer, bytes.data() + offset, offset, length);
    }
  }
  void FoldAll(uint64_t transfer, const std::vector<uint8_t>& bytes) {
    Fold(transfer, bytes, 0, bytes.size());
  }
  std::optional<std::vector<v1::CompletionReport>> Ack(uint64_t delivery,
                                                       const std::string& error = "",
                                                       int64_t model_version = 1) {
    v1::LocalUpdateAck ack;
    ack.set_transfer_id(delivery);
    ack.set_model_version(model_version);
    ack.set_error(error);
    ReceiveLock::Hold guard(&lock);
    return rounds.AcknowledgedLocked(ack);
  }
  // Every report the scheduler got, once all queued so far are out (the
  // reporter sends in queueing order, so a sentinel queued now comes last).
  std::vector<v1::CompletionReport> SettledReports() {
    const size_t before = scheduler.completions().size();
    reporter.ReportFailure(kSentinel, "sentinel");
    // Wait for the sentinel itself (reports queued earlier come before it).
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    std::vector<v1::CompletionReport> all;
    while (std::chrono::steady_clock::now() < deadline) {
      (void)scheduler.WaitForCompletions(before + 1, std::chrono::milliseconds(50));
      all = scheduler.completions();
      if (!all.empty() && all.back().transfer_id() == kSentinel) {
        all.pop_back();
        return all;
      }
    }
    FAIL("the reporter did not send the sentinel report");
    return all;
  }

  ReceiveLock lock;
  std::atomic<bool> stopping{false};
  BufferPool pool;
  IncomingTransfers incoming{&pool};
  ServerEndpoints servers{&lock, &pool, &stopping};
  RealClock clock;
  transport::SendWatchdog watchdog{30};
  boost::asio::io_context io;
  transport::PeerConnections peers{io, watchdog, kPacket};
  AggregationTable aggregations{kPacket};
  SendScheduler send{SendOptions(), &clock, &peers, &aggregations,
                     [](uint64_t, const std::string&) {}};
  FakeSchedulerClient scheduler;
  CompletionReporter reporter{&scheduler, "ps-host"};
  FakeApp ps{kJob, kServer, v1::ROLE_SERVER};
  RoundService rounds;
};

v1::ExpectDelivery Member(uint64_t transfer, int64_t round, int32_t size = 2,
                          int64_t bytes = kBytes, v1::DType dtype = v1::DTYPE_FLOAT32) {
  v1::ExpectDelivery expect;
  expect.set_transfer_id(transfer);
  expect.set_job_id(kJob);
  expect.set_server(kServer);
  expect.set_version(round);
  expect.set_round_size(size);
  expect.set_contributions(1);
  expect.set_bytes(bytes);
  expect.set_dtype(dtype);
  return expect;
}

template <typename T>
std::vector<uint8_t> AsBytes(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// Distinct exact values per element: a sum that misses or doubles a packet,
// or puts it at the wrong offset, shows.
std::vector<float> Floats(float scale, float base) {
  std::vector<float> v(kElements);
  for (size_t i = 0; i < kElements; ++i) v[i] = base + scale * static_cast<float>(i);
  return v;
}
std::vector<int32_t> Ints(int32_t scale, int32_t base) {
  std::vector<int32_t> v(kElements);
  for (size_t i = 0; i < kElements; ++i) v[i] = base + scale * static_cast<int32_t>(i);
  return v;
}

// The update the server application was handed, with the sum it carries.
struct Handed {
  v1::LocalUpdate update;
  std::vector<uint8_t> sum;
};
std::optional<Handed> NextUpdate(FakeApp& app) {
  v1::LocalMessage message;
  int fd = -1;
  if (!app.Next(&message, &fd)) return std::nullopt;
  REQUIRE(message.has_update());
  REQUIRE(fd >= 0);
  Handed handed;
  handed.update = message.update();
  auto mapped = SharedBuffer::Map(fd, static_cast<size_t>(message.update().bytes()));
  REQUIRE(mapped.ok());
  handed.sum.assign(mapped->data(), mapped->data() + mapped->size());
  return handed;
}

template <typename T>
std::vector<T> Elements(const std::vector<uint8_t>& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// An early arrival of `bytes` for `transfer`, as the data receiver records
// it before the transfer is known as a round member: bytes [0, upto) in,
// in packets, each range unfolded.
void ArriveEarly(Rig& rig, uint64_t transfer, const std::vector<uint8_t>& bytes, uint64_t upto,
                 uint64_t total, uint32_t job = kJob) {
  auto created = SharedBuffer::Create(total);
  REQUIRE(created.ok());
  auto buffer = std::make_shared<SharedBuffer>(std::move(*created));
  std::memcpy(buffer->data(), bytes.data(), std::min<uint64_t>(upto, bytes.size()));
  ReceiveLock::Hold guard(&rig.lock);
  Incoming& in = rig.incoming.Add(transfer, job, total, std::move(buffer));
  for (uint64_t offset = 0; offset < upto; offset += kPacket) {
    const uint32_t length = static_cast<uint32_t>(std::min<uint64_t>(kPacket, upto - offset));
    in.unfolded.emplace_back(offset, length);
    in.received += length;
  }
}

TEST_CASE("RoundService sums a round, hands it over once and reports each member at the ack") {
  Rig rig;
  rig.Connect();
  const auto a = Floats(1.0f, 0.5f), b = Floats(-3.0f, 100.0f);
  const auto a_bytes = AsBytes(a), b_bytes = AsBytes(b);

  rig.Join(Member(11, 0));
  {
    ReceiveLock::Hold guard(&rig.lock);
    CHECK(rig.rounds.IsMemberLocked(11));
    CHECK(!rig.rounds.IsMemberLocked(12));
    CHECK(rig.rounds.JobOfLocked(11) == std::optional<uint32_t>(kJob));
    CHECK(!rig.rounds.JobOfLocked(12).has_value());
  }
  rig.FoldAll(11, a_bytes);
  rig.Join(Member(12, 0));
  // Member 12 in two halves, the second half first.
  rig.Fold(12, b_bytes, 120, kBytes);
  CHECK(rig.ps.Quiet());  // not complete yet: nothing handed over
  CHECK(rig.rounds.rounds_delivered() == 0);
  rig.Fold(12, b_bytes, 0, 120);

  auto handed = NextUpdate(rig.ps);
  REQUIRE(handed.has_value());
  const v1::LocalUpdate& update = handed->update;
  CHECK((update.transfer_id() >> 63) == 1);  // a round's delivery id, no transfer's
  CHECK(update.count() == 2);
  CHECK(update.version() == 0);
  CHECK(update.sequence() == 1);
  CHECK(update.bytes() == kBytes);
  const auto sum = Elements<float>(handed->sum);
  REQUIRE(sum.size() == kElements);
  for (size_t i = 0; i < kElements; ++i) {
    INFO("element " << i);
    CHECK(sum[i] == a[i] + b[i]);
  }
  CHECK(rig.ps.Quiet());  // exactly one update
  CHECK(rig.rounds.rounds_delivered() == 1);
  {
    ReceiveLock::Hold guard(&rig.lock);
    // Handed over, its acknowledgement to come: logged as such.
    const auto entries = rig.servers.applied_log().Report();
    CHECK(entries.size() == 2);
    for (const auto& entry : entries) CHECK(!entry.acknowledged);
    CHECK(!rig.servers.applied_log().Contains(11));
  }

  CHECK(!rig.Ack(12345).has_value());  // no round's delivery
  auto reports = rig.Ack(update.transfer_id());
  REQUIRE(reports.has_value());
  REQUIRE(reports->size() == 2);
  std::vector<uint64_t> members;
  for (const auto& report : *reports) {
    members.push_back(report.transfer_id());
    CHECK(report.applied());
    CHECK(report.model_version() == 1);
    CHECK(report.error().empty());
    CHECK(report.host() == "ps-host");
  }
  std::sort(members.begin(), members.end());
  CHECK(members == std::vector<uint64_t>{11, 12});
  // A second acknowledgement of the same delivery reports nothing again.
  CHECK(!rig.Ack(update.transfer_id()).has_value());
  {
    ReceiveLock::Hold guard(&rig.lock);
    CHECK(rig.servers.applied_log().Contains(11));
    CHECK(rig.servers.applied_log().Contains(12));
    for (const auto& entry : rig.servers.applied_log().Report()) {
      CHECK(entry.acknowledged);
      CHECK(entry.model_version == 1);
    }
    CHECK(rig.servers.VersionLocked(Key()) == std::optional<int64_t>(1));
  }
  CHECK(rig.SettledReports().empty());  // nothing was reported failed
}

TEST_CASE("RoundService sums the packets that arrived before their member was announced") {
  Rig rig;
  rig.Connect();
  const auto a = Ints(7, -50), b = Ints(-2, 1000);
  const auto a_bytes = AsBytes(a), b_bytes = AsBytes(b);
  // Member 21 arrived whole, member 22 half, before either was announced.
  ArriveEarly(rig, 21, a_bytes, kBytes, kBytes);
  ArriveEarly(rig, 22, b_bytes, 120, kBytes);

  rig.Join(Member(21, 0, 2, kBytes, v1::DTYPE_INT32));
  {
    ReceiveLock::Hold guard(&rig.lock);
    // All of 21 is summed: its receive buffer is let go.
    CHECK(rig.incoming.Find(21) == nullptr);
  }
  rig.Join(Member(22, 0, 2, kBytes, v1::DTYPE_INT32));
  {
    ReceiveLock::Hold guard(&rig.lock);
    Incoming* in = rig.incoming.Find(22);  // still receiving
    REQUIRE(in != nullptr);
    CHECK(in->unfolded.empty());
  }
  CHECK(rig.ps.Quiet());
  // The rest of 22 comes as a member's packets do.
  rig.Fold(22, b_bytes, 120, kBytes);

  auto handed = NextUpdate(rig.ps);
  REQUIRE(handed.has_value());
  CHECK(handed->update.count() == 2);
  CHECK(handed->update.version() == 0);
  const auto sum = Elements<int32_t>(handed->sum);
  REQUIRE(sum.size() == kElements);
  for (size_t i = 0; i < kElements; ++i) {
    INFO("element " << i);
    CHECK(sum[i] == a[i] + b[i]);
  }
  CHECK(rig.rounds.rounds_delivered() == 1);
  auto reports = rig.Ack(handed->update.transfer_id());
  REQUIRE(reports.has_value());
  CHECK(reports->size() == 2);
  CHECK(rig.SettledReports().empty());
}

TEST_CASE("RoundService fails the whole round when a member arrived with another size") {
  Rig rig;
  rig.Connect();
  const auto a = Floats(1.0f, 1.0f), b = Floats(2.0f, 2.0f);
  const auto a_bytes = AsBytes(a), b_bytes = AsBytes(b);
  rig.Join(Member(31, 0));
  rig.Fold(31, a_bytes, 0, 120);
  // 32 arrived with 16 bytes more than the round's size.
  ArriveEarly(rig, 32, b_bytes, 80, kBytes + 16);
  rig.Join(Member(32, 0));
  // The rest of 31 changes nothing: the round has failed.
  rig.Fold(31, a_bytes, 120, kBytes);

  const auto reports = rig.SettledReports();
  REQUIRE(reports.size() == 2);  // each member once
  std::vector<uint64_t> failed;
  for (const auto& report : reports) {
    failed.push_back(report.transfer_id());
    CHECK(!report.applied());
    CHECK(report.host() == "ps-host");
    CHECK(Contains(report.error(), "round 0 failed"));
    CHECK(Contains(report.error(), "push 32 arrived with 256 bytes, not 240"));
  }
  std::sort(failed.begin(), failed.end());
  CHECK(failed == std::vector<uint64_t>{31, 32});
  CHECK(rig.ps.Quiet());
  CHECK(rig.rounds.rounds_delivered() == 0);
  // Its bytes are of no use: not left in the incoming table for good.
  ReceiveLock::Hold guard(&rig.lock);
  CHECK_FALSE(rig.incoming.Contains(32));
}

TEST_CASE("RoundService fails the round of a member that failed, and only a member's") {
  Rig rig;
  rig.Connect();
  const auto a = Floats(1.0f, 0.0f), b = Floats(1.0f, 1.0f);
  const auto a_bytes = AsBytes(a), b_bytes = AsBytes(b);
  rig.Join(Member(41, 3));
  rig.Join(Member(42, 3));
  rig.Fold(41, a_bytes, 0, 160);
  {
    ReceiveLock::Hold guard(&rig.lock);
    CHECK(!rig.rounds.FailMemberLocked(999, "no such push"));
    CHECK(rig.rounds.FailMemberLocked(42, "its sender died"));
    // Still a member (true), but its round is reported failed once only.
    CHECK(rig.rounds.FailMemberLocked(41, "again"));
  }
  // What comes after changes nothing.
  rig.Fold(41, a_bytes, 160, kBytes);
  rig.FoldAll(42, b_bytes);

  const auto reports = rig.SettledReports();
  REQUIRE(reports.size() == 2);
  std::vector<uint64_t> failed;
  for (const auto& report : reports) {
    failed.push_back(report.transfer_id());
    CHECK(!report.applied());
    CHECK(Contains(report.error(), "round 3 failed"));
    CHECK(Contains(report.error(), "push 42 of the round failed: its sender died"));
  }
  std::sort(failed.begin(), failed.end());
  CHECK(failed == std::vector<uint64_t>{41, 42});
  CHECK(rig.ps.Quiet());
  CHECK(rig.rounds.rounds_delivered() == 0);
}

TEST_CASE("RoundService fails a round whose server is not connected") {
  Rig rig;
  const auto a = Floats(1.0f, 0.0f);
  const auto a_bytes = AsBytes(a);

  SECTION("when its members are announced") {
    {
      ReceiveLock::Hold guard(&rig.lock);
      (void)rig.servers.EnsureLocked(Key());  // known, no application
    }
    rig.Join(Member(51, 0));
    rig.Join(Member(52, 0));
    rig.FoldAll(51, a_bytes);
    rig.FoldAll(52, a_bytes);
    const auto reports = rig.SettledReports();
    REQUIRE(reports.size() == 2);
    std::vector<uint64_t> failed;
    for (const auto& report : reports) {
      failed.push_back(report.transfer_id());
      CHECK(!report.applied());
      CHECK(Contains(report.error(), "round 0 failed"));
      CHECK(Contains(report.error(), "not connected"));
    }
    std::sort(failed.begin(), failed.end());
    CHECK(failed == std::vector<uint64_t>{51, 52});
  }

  SECTION("when its sum is complete (the server left meanwhile)") {
    rig.Connect();
    rig.Join(Member(51, 0));
    rig.Join(Member(52, 0));
    rig.FoldAll(51, a_bytes);
    {
      ReceiveLock::Hold guard(&rig.lock);
      CHECK(rig.servers.ForgetLocked(rig.ps.session) == std::optional<std::string>(Key()));
    }
    rig.FoldAll(52, a_bytes);
    const auto reports = rig.SettledReports();
    REQUIRE(reports.size() == 2);
    std::vector<uint64_t> failed;
    for (const auto& report : reports) {
      failed.push_back(report.transfer_id());
      CHECK(!report.applied());
      CHECK(Contains(report.error(), "server 1/ps is not connected"));
    }
    std::sort(failed.begin(), failed.end());
    CHECK(failed == std::vector<uint64_t>{51, 52});
  }
  CHECK(rig.ps.Quiet());
  CHECK(rig.rounds.rounds_delivered() == 0);
}

TEST_CASE("RoundService reports a round the server refused as not applied, with its error") {
  Rig rig;
  rig.Connect();
  const auto a = Ints(1, 0), b = Ints(1, 1);
  rig.Join(Member(61, 5, 2, kBytes, v1::DTYPE_INT32));
  rig.Join(Member(62, 5, 2, kBytes, v1::DTYPE_INT32));
  rig.FoldAll(61, AsBytes(a));
  rig.FoldAll(62, AsBytes(b));
  auto handed = NextUpdate(rig.ps);
  REQUIRE(handed.has_value());
  CHECK(handed->update.version() == 5);
  CHECK(handed->update.sequence() == 6);

  auto reports = rig.Ack(handed->update.transfer_id(), "model diverged", /*model_version=*/0);
  REQUIRE(reports.has_value());
  REQUIRE(reports->size() == 2);
  std::vector<uint64_t> members;
  for (const auto& report : *reports) {
    members.push_back(report.transfer_id());
    CHECK(!report.applied());
    CHECK(Contains(report.error(), "model diverged"));
    CHECK(Contains(report.error(), "server refused round 5"));
  }
  std::sort(members.begin(), members.end());
  CHECK(members == std::vector<uint64_t>{61, 62});
  {
    ReceiveLock::Hold guard(&rig.lock);
    CHECK(!rig.servers.applied_log().Contains(61));
    CHECK(!rig.servers.applied_log().Contains(62));
    CHECK(rig.servers.applied_log().Report().empty());
    CHECK(!rig.servers.VersionLocked(Key()).has_value());
  }
  CHECK(rig.SettledReports().empty());  // the ack's reports are the caller's to send
}

TEST_CASE("RoundService: a server's failure spares a round handed over already") {
  Rig rig;
  rig.Connect();
  const auto a = Floats(1.0f, 0.0f);
  rig.Join(Member(71, 0, 1));
  rig.FoldAll(71, AsBytes(a));
  auto handed = NextUpdate(rig.ps);
  REQUIRE(handed.has_value());
  rig.Join(Member(72, 1, 1));  // round 1 still summing
  {
    ReceiveLock::Hold guard(&rig.lock);
    rig.rounds.FailServerLocked(Key(), "scheduler restarted", /*spare_delivering=*/true);
  }
  const auto failed = rig.SettledReports();
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].transfer_id() == 72);
  CHECK(Contains(failed[0].error(), "scheduler restarted"));
  // Round 0's acknowledgement still decides its member.
  auto reports = rig.Ack(handed->update.transfer_id());
  REQUIRE(reports.has_value());
  REQUIRE(reports->size() == 1);
  CHECK((*reports)[0].transfer_id() == 71);
  CHECK((*reports)[0].applied());
}

// A member whose packets arrived before its announcement joins a new round
// whose beginning evicts an older, unfinished one: RoundTable::Join then
// reports the old round's members in Effects::failed. JoinLocked used to
// take any failure there for this member's and skipped summing its early
// packets, so the new round never completed.
TEST_CASE("RoundService sums early packets of a member whose round evicts an old one",
          "[round_eviction]") {
  Rig rig(TestOptions(/*rounds_kept=*/2));
  rig.Connect();
  const auto a = Floats(1.0f, 0.0f), c = Floats(2.0f, 3.0f);
  rig.Join(Member(81, 0));  // round 0 waits for a second member that never comes
  rig.FoldAll(81, AsBytes(a));
  ArriveEarly(rig, 83, AsBytes(c), kBytes, kBytes);
  rig.Join(Member(83, 2, 1));  // round 2 begins: round 0 goes (failed)
  {
    ReceiveLock::Hold guard(&rig.lock);
    // All of 83 was in: summed and let go, as when no round is evicted.
    CHECK(rig.incoming.Find(83) == nullptr);
  }
  auto handed = NextUpdate(rig.ps);
  REQUIRE(handed.has_value());  // round 2 is complete: all of 83 is in
  CHECK(handed->update.version() == 2);
  const auto sum = Elements<float>(handed->sum);
  REQUIRE(sum.size() == kElements);
  for (size_t i = 0; i < kElements; ++i) CHECK(sum[i] == c[i]);
  const auto reports = rig.SettledReports();
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].transfer_id() == 81);
}


// ---- a get from the root's own host (LocalRoundSums): no socket

TEST_CASE("RoundService::AwaitSum hands an application on this host the exact sum, no socket") {
  Rig rig;
  rig.Connect();
  const auto a = Floats(1.0f, 0.5f), b = Floats(-3.0f, 100.0f);
  const auto a_bytes = AsBytes(a), b_bytes = AsBytes(b);
  // The get comes first (the root rank pushed and asked at once): it waits
  // for the round to begin and then for its last chunk.
  int64_t version = -1;
  std::shared_ptr<SharedBuffer> sum;
  absl::Status got;
  uint32_t contributions = 0;
  std::thread getter(
      [&] { got = rig.rounds.AwaitSum(kJob, kServer, 0, &version, &sum, &contributions); });
  rig.Join(Member(11, 0));
  rig.Join(Member(12, 0));
  rig.FoldAll(11, a_bytes);
  rig.Fold(12, b_bytes, 0, kBytes / 2);
  rig.Fold(12, b_bytes, kBytes / 2, kBytes);
  getter.join();
  REQUIRE(got.ok());
  CHECK(version == 1);  // round 0 yields version 1
  CHECK(contributions == 2);
  REQUIRE(sum != nullptr);
  REQUIRE(sum->size() == static_cast<size_t>(kBytes));
  const std::vector<float> values =
      Elements<float>(std::vector<uint8_t>(sum->data(), sum->data() + sum->size()));
  for (size_t i = 0; i < kElements; ++i) {
    INFO("element " << i);
    CHECK(values[i] == a[i] + b[i]);
  }
  CHECK(rig.rounds.local_gets() == 1);
  CHECK(rig.rounds.local_get_bytes() == kBytes);
  // A copy of its own: the round's sum can go back to the pool meanwhile.
  auto handed = NextUpdate(rig.ps);
  REQUIRE(handed.has_value());
  CHECK(sum->data() != nullptr);
  CHECK(Elements<float>(handed->sum) == values);
}

TEST_CASE("RoundService::AwaitSum of a round that fails says why, as a get from another host") {
  Rig rig;
  rig.Connect();
  int64_t version = -1;
  std::shared_ptr<SharedBuffer> sum;
  absl::Status got;
  std::thread getter([&] { got = rig.rounds.AwaitSum(kJob, kServer, 3, &version, &sum, nullptr); });
  rig.Join(Member(21, 3));
  rig.FoldAll(21, AsBytes(Floats(1.0f, 0.0f)));
  // The second member comes with another size: the round fails.
  rig.Join(Member(22, 3, 2, kBytes + 4));
  getter.join();
  // Unavailable if the get found the round failed as it began, Aborted if
  // it was already waiting for the sum: as the two answers of another host.
  CHECK((got.code() == absl::StatusCode::kAborted || got.code() == absl::StatusCode::kUnavailable));
  CHECK(Contains(std::string(got.message()), "round 3 failed: "));
  CHECK(sum == nullptr);
  CHECK(rig.rounds.local_gets() == 0);
}

TEST_CASE("RoundService::AwaitSum of a round that never begins ends after round_wait_s") {
  Rig rig;  // round_wait_s = 1
  rig.Connect();
  int64_t version = -1;
  std::shared_ptr<SharedBuffer> sum;
  const absl::Status got = rig.rounds.AwaitSum(kJob, kServer, 0, &version, &sum, nullptr);
  CHECK(got.code() == absl::StatusCode::kUnavailable);
  CHECK(Contains(std::string(got.message()), "did not begin within"));
}

TEST_CASE("RoundService::AwaitSum of a server that is not here says so at once") {
  Rig rig;  // no server application connected
  int64_t version = -1;
  std::shared_ptr<SharedBuffer> sum;
  const absl::Status got = rig.rounds.AwaitSum(kJob, kServer, 0, &version, &sum, nullptr);
  CHECK(got.code() == absl::StatusCode::kUnavailable);
  CHECK(Contains(std::string(got.message()), "is not connected to ps-host's daemon"));
}

}  // namespace
}  // namespace mlfabric::daemon
