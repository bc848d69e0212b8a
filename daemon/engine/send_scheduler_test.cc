#include "daemon/engine/send_scheduler.h"

#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace mlfabric::daemon {
namespace {

using transport::PacketHeader;
using transport::PacketKind;

constexpr uint32_t kPacket = 16;  // bytes

// Records every packet instead of writing it; writes to `failing` fail.
class RecordingWriter final : public transport::PacketWriter {
 public:
  struct Written {
    std::string to;  // a peer's address, or "fd:<n>"
    PacketKind kind;
    uint64_t transfer;
    uint64_t offset;
    uint32_t length;
    std::string text;  // a control packet's payload
  };

  absl::Status WriteToPeer(const v1::SendTransfer& send, const PacketHeader& header,
                           const void* payload, uint32_t length,
                           std::optional<uint32_t>) override {
    return Record(send.dst_address(), header, payload, length);
  }
  absl::Status WriteToSocket(int fd, const PacketHeader& header, const void* payload,
                             uint32_t length) override {
    return Record("fd:" + std::to_string(fd), header, payload, length);
  }

  std::vector<Written> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(written_);
  }
  void Fail(const std::string& to) {
    std::lock_guard<std::mutex> lock(mu_);
    failing_.insert(to);
  }

 private:
  absl::Status Record(const std::string& to, const PacketHeader& header, const void* payload,
                      uint32_t length) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failing_.count(to)) return absl::UnavailableError("connection reset by peer");
    std::string text;
    if (header.kind == PacketKind::kAbort) text.assign(static_cast<const char*>(payload), length);
    written_.push_back({to, header.kind, header.transfer, header.offset, length, text});
    return absl::OkStatus();
  }

  std::mutex mu_;
  std::vector<Written> written_;
  std::set<std::string> failing_;
};

std::shared_ptr<SharedBuffer> Buffer(size_t bytes) {
  auto created = SharedBuffer::Create(bytes);
  REQUIRE(created.ok());
  auto buffer = std::make_shared<SharedBuffer>(std::move(*created));
  for (size_t i = 0; i < bytes; ++i) buffer->data()[i] = static_cast<uint8_t>(i);
  return buffer;
}

v1::SendTransfer Transfer(uint64_t id, int64_t bytes, double start_s,
                          const std::string& dst = "10.0.0.2:7000", uint32_t job = 1) {
  v1::SendTransfer send;
  send.set_transfer_id(id);
  send.set_job_id(job);
  send.set_dst_host("h-" + dst);
  send.set_dst_address(dst);
  send.set_start_s(start_s);
  send.set_bytes(bytes);
  return send;
}

v1::TensorInfo Tensor(uint32_t id, int64_t bytes, int priority) {
  v1::TensorInfo tensor;
  tensor.set_tensor_id(id);
  tensor.set_bytes(bytes);
  tensor.set_priority(priority);
  return tensor;
}

struct Fixture {
  explicit Fixture(double unscheduled_bps = 0)
      : clock(100.0),
        aggregations(kPacket),
        send(Options(unscheduled_bps), &clock, &writer, &aggregations,
             [this](uint64_t id, const std::string& reason) {
               std::lock_guard<std::mutex> lock(mu);
               failures[id] = reason;
             }) {}
  static SendScheduler::Options Options(double unscheduled_bps) {
    SendScheduler::Options options;
    options.payload_bytes = kPacket;
    options.unscheduled_bps = unscheduled_bps;
    return options;
  }
  FakeClock clock;
  RecordingWriter writer;
  AggregationTable aggregations;
  std::mutex mu;
  std::map<uint64_t, std::string> failures;
  SendScheduler send;
};

// Runs the loop's passes, moving the fake clock to each wake-up, until
// nothing waits; returns the passes it took.
int Drain(Fixture& f) {
  int passes = 0;
  for (double next = f.send.SendReady(); next != kNever && passes < 1000; ++passes) {
    f.clock.Set(std::max(next, f.clock.NowSeconds()) + 1e-6);
    next = f.send.SendReady();
  }
  return passes;
}

int Drain(SendScheduler& send, FakeClock& clock) {
  int passes = 0;
  for (double next = send.SendReady(); next != kNever && passes < 1000; ++passes) {
    clock.Set(std::max(next, clock.NowSeconds()) + 1e-6);
    next = send.SendReady();
  }
  return passes;
}

TEST_CASE("SendScheduler releases a transfer at its start time, most urgent tensor first") {
  Fixture f;
  // Tensor 7 (priority 2) is laid out first, tensor 8 (priority 0) second.
  REQUIRE(f.send.Schedule(Transfer(1, 48, 101.0), Buffer(48),
                          {Tensor(7, 16, 2), Tensor(8, 32, 0)})
              .ok());
  CHECK(f.send.SendReady() == Approx(101.0));
  CHECK(f.writer.Take().empty());
  f.clock.Set(101.01);  // tokens accrue from the start time on
  CHECK(Drain(f) < 1000);
  const auto written = f.writer.Take();
  REQUIRE(written.size() == 4);
  CHECK(written[0].kind == PacketKind::kBegin);
  CHECK(written[0].offset == 48);  // a kBegin's offset is the transfer's size
  // Tensor 8's packets (bytes 16..47) before tensor 7's (0..15).
  CHECK(written[1].offset == 16);
  CHECK(written[2].offset == 32);
  CHECK(written[3].offset == 0);
  for (const auto& w : written) CHECK(w.transfer == 1);
  CHECK(!f.send.Has(1));  // forgotten once sent
  CHECK(f.send.bytes_sent() == 48);
}

TEST_CASE("SendScheduler ranks co-located jobs by their priority class, then their id") {
  SendScheduler::Options options = Fixture::Options(0);
  options.job_priority = JobPriorityPolicy({JobPriorityMode::kOne});
  FakeClock clock(100.0);
  RecordingWriter writer;
  AggregationTable aggregations(kPacket);
  SendScheduler send(options, &clock, &writer, &aggregations,
                     [](uint64_t, const std::string&) {});
  // Job 9's class is set before any of its traffic; job 5 keeps class 0.
  send.SetJobPriorityClass(9, 0);
  REQUIRE(send.Schedule(Transfer(1, 32, 101.0, "peer", /*job=*/5), Buffer(32), {}).ok());
  REQUIRE(send.Schedule(Transfer(2, 32, 101.0, "peer", /*job=*/9), Buffer(32), {}).ok());
  send.SetJobPriorityClass(5, 3);  // job 5 demoted while both wait
  clock.Set(101.01);
  CHECK(Drain(send, clock) < 1000);
  std::vector<uint64_t> order;
  for (const auto& w : writer.Take()) {
    if (w.kind != PacketKind::kBegin) order.push_back(w.transfer);
  }
  CHECK(order == std::vector<uint64_t>{2, 2, 1, 1});  // job 9's packets first
  CHECK(send.JobRanking(0) == std::vector<uint32_t>{9, 5});
  send.SetJobPriorityClass(5, 0);  // back to the default: ids decide again
  CHECK(send.JobRanking(0) == std::vector<uint32_t>{5, 9});
}

TEST_CASE("SendScheduler paces a transfer by its rate segments, in scheduler time") {
  Fixture f;
  f.send.SetClockOffset(50.0);  // scheduler time = local + 50
  v1::SendTransfer send = Transfer(2, 160, 160.0);
  auto* segment = send.add_segments();
  segment->set_from_s(160.0);
  segment->set_to_s(170.0);
  segment->set_rate_bps(8 * 16);  // one packet a second
  REQUIRE(f.send.Schedule(send, Buffer(160), {}).ok());
  CHECK(f.send.SendReady() == Approx(110.0));  // local start = 160 - 50
  CHECK(f.writer.Take().empty());
  f.clock.Set(112.0);
  // Two seconds of tokens, capped at the burst (two packets), leave at
  // once; then one packet a second.
  const double next = f.send.SendReady();
  CHECK(f.writer.Take().size() == 3);  // kBegin + 2
  CHECK(next == Approx(113.0));
  f.clock.Set(next);
  f.send.SendReady();
  CHECK(f.writer.Take().size() == 1);
}

TEST_CASE("SendScheduler lets a paced transfer that woke late catch up by rate x quantum") {
  // 1,000 packets a second. A sender that looks again only every 20 ms (a
  // slow wake-up) sends 20 packets per look while its bucket holds 20 ms of
  // its rate; with the two-packet bucket it fell to 2 packets per look,
  // 100 a second, whatever the planned rate.
  for (const double quantum_s : {0.0, 0.02}) {
    FakeClock clock(100.0);
    RecordingWriter writer;
    AggregationTable aggregations(kPacket);
    SendScheduler::Options options;
    options.payload_bytes = kPacket;
    options.pacing_quantum_s = quantum_s;
    SendScheduler send(options, &clock, &writer, &aggregations, [](uint64_t, const std::string&) {});
    v1::SendTransfer transfer = Transfer(3, 100 * kPacket, 100.0);
    auto* segment = transfer.add_segments();
    segment->set_from_s(100.0);
    segment->set_to_s(100.1);
    segment->set_rate_bps(8.0 * kPacket * 1000);
    REQUIRE(send.Schedule(transfer, Buffer(100 * kPacket), {}).ok());
    INFO("quantum " << quantum_s << " s");
    clock.Set(100.02);
    send.SendReady();
    const size_t first = writer.Take().size() - 1;  // without the kBegin
    clock.Set(100.04);
    send.SendReady();
    const size_t second = writer.Take().size();
    if (quantum_s == 0) {
      CHECK(first == 2);
      CHECK(second == 2);
    } else {
      CHECK(first == 20);
      CHECK(second == 20);
    }
    // The rate still holds: no more than 40 ms of it went in 40 ms.
    CHECK(first + second <= 40);
  }
}

// Records coalesced writes call by call; the first call takes only
// `first_take` frames (the kernel's room) and runs `during_first` (as if
// something were released while the write was in the kernel).
class CoalescingWriter final : public transport::PacketWriter {
 public:
  struct Sent {
    PacketKind kind;
    uint64_t transfer;
    uint64_t offset;
  };
  absl::Status WriteToPeer(const v1::SendTransfer&, const PacketHeader&, const void*, uint32_t,
                           std::optional<uint32_t>) override {
    return absl::InternalError("coalesced writes only");
  }
  absl::Status WriteToSocket(int, const PacketHeader&, const void*, uint32_t) override {
    return absl::InternalError("coalesced writes only");
  }
  absl::StatusOr<size_t> WriteFramesToPeer(const v1::SendTransfer&,
                                           absl::Span<const transport::Frame> frames) override {
    const size_t take = calls.empty() ? std::min(first_take, frames.size()) : frames.size();
    calls.push_back(frames.size());
    for (size_t i = 0; i < take; ++i) {
      sent.push_back({frames[i].header.kind, frames[i].header.transfer, frames[i].header.offset});
    }
    if (calls.size() == 1 && during_first) during_first();
    return take;
  }
  size_t first_take = SIZE_MAX;
  std::function<void()> during_first;
  std::vector<size_t> calls;  // frames offered per call
  std::vector<Sent> sent;     // frames written, in order
};

TEST_CASE("SendScheduler coalesces a peer's packets; an urgent one waits only for what was taken") {
  FakeClock clock(100.0);
  CoalescingWriter writer;
  AggregationTable aggregations(kPacket);
  SendScheduler::Options options;
  options.payload_bytes = kPacket;
  options.coalesce_bytes = 8 * kPacket;
  SendScheduler send(options, &clock, &writer, &aggregations, [](uint64_t, const std::string&) {});
  // A long, unpaced, low-priority transfer (20 packets) to one peer.
  REQUIRE(send.Schedule(Transfer(1, 20 * kPacket, 100.0), Buffer(20 * kPacket),
                        {Tensor(1, 20 * kPacket, 9)})
              .ok());
  // The kernel takes the kBegin and 2 packets of the first write; meanwhile
  // an urgent transfer for the same peer is released.
  writer.first_take = 3;
  writer.during_first = [&] {
    REQUIRE(send.Schedule(Transfer(2, kPacket, 100.0), Buffer(kPacket), {Tensor(2, kPacket, 0)})
                .ok());
  };
  CHECK(Drain(send, clock) < 1000);
  // The first write offered a whole run: kBegin + 8 packets (the cap).
  REQUIRE(writer.calls.size() >= 2);
  CHECK(writer.calls[0] == 9);
  // The urgent transfer went right after the packets the kernel had taken.
  REQUIRE(writer.sent.size() >= 5);
  CHECK(writer.sent[0].kind == PacketKind::kBegin);
  CHECK(writer.sent[0].transfer == 1);
  CHECK(writer.sent[1].transfer == 1);
  CHECK(writer.sent[2].transfer == 1);
  CHECK(writer.sent[3].kind == PacketKind::kBegin);
  CHECK(writer.sent[3].transfer == 2);
  CHECK(writer.sent[4].transfer == 2);
  // Every packet of transfer 1 exactly once, in its order, the ones put
  // back included.
  std::vector<uint64_t> offsets;
  for (const auto& s : writer.sent) {
    if (s.kind == PacketKind::kData && s.transfer == 1) offsets.push_back(s.offset);
  }
  REQUIRE(offsets.size() == 20);
  for (size_t i = 0; i < offsets.size(); ++i) CHECK(offsets[i] == i * kPacket);
  CHECK(send.bytes_sent() == 21 * kPacket);
  CHECK(!send.Has(1));
  CHECK(!send.Has(2));
  // Fewer writes than packets: 21 packets in at most 5 writes.
  CHECK(send.writes() <= 5);
}

TEST_CASE("SendScheduler does not let a paced transfer hold back another's packets") {
  Fixture f;
  // Transfer 3 (released first, so ahead in the queue) may send one packet
  // a second; transfer 4 has its own, fast reservation on the same uplink.
  v1::SendTransfer slow = Transfer(3, 160, 100.0);
  auto* segment = slow.add_segments();
  segment->set_from_s(100.0);
  segment->set_to_s(110.0);
  segment->set_rate_bps(8 * 16);
  REQUIRE(f.send.Schedule(slow, Buffer(160), {}).ok());
  v1::SendTransfer fast = Transfer(4, 64, 100.0, "10.0.0.3:7000");
  segment = fast.add_segments();
  segment->set_from_s(100.0);
  segment->set_to_s(101.0);
  segment->set_rate_bps(8 * 64 * 100);
  REQUIRE(f.send.Schedule(fast, Buffer(64), {}).ok());
  f.clock.Set(100.01);
  for (double next = f.send.SendReady(); next < 101.0; next = f.send.SendReady()) {
    f.clock.Set(next + 1e-6);
  }
  int fast_packets = 0, slow_packets = 0;
  for (const auto& w : f.writer.Take()) {
    if (w.kind != PacketKind::kData) continue;
    (w.transfer == 4 ? fast_packets : slow_packets) += 1;
  }
  // Transfer 4 is all out within its second while transfer 3 waits for its
  // tokens (a burst of two packets, then one a second).
  CHECK(fast_packets == 4);
  CHECK(slow_packets <= 3);
  CHECK(!f.send.Has(4));
  CHECK(f.send.Has(3));
}

TEST_CASE("SendScheduler refuses a schedule that disagrees with the data") {
  Fixture f;
  absl::Status refused = f.send.Schedule(Transfer(3, 64, 100.0), Buffer(48), {});
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(refused.message()).find("64") != std::string::npos);
  v1::SendTransfer backwards = Transfer(4, 48, 100.0);
  auto* segment = backwards.add_segments();
  segment->set_from_s(101.0);
  segment->set_to_s(100.0);
  segment->set_rate_bps(1e6);
  CHECK(!f.send.Schedule(backwards, Buffer(48), {}).ok());
  REQUIRE(f.send.Schedule(Transfer(5, 48, 100.0), Buffer(48), {}).ok());
  CHECK(f.send.Schedule(Transfer(5, 48, 100.0), Buffer(48), {}).code() ==
        absl::StatusCode::kAlreadyExists);
  CHECK(!f.send.Has(3));
  CHECK(!f.send.Has(4));
}

TEST_CASE("SendScheduler fails every transfer to a peer whose write failed, once each") {
  Fixture f;
  f.writer.Fail("10.0.0.9:7000");
  REQUIRE(f.send.Schedule(Transfer(1, 32, 100.0, "10.0.0.9:7000"), Buffer(32), {}).ok());
  REQUIRE(f.send.Schedule(Transfer(2, 32, 100.0, "10.0.0.9:7000"), Buffer(32), {}).ok());
  REQUIRE(f.send.Schedule(Transfer(3, 32, 100.0, "10.0.0.2:7000"), Buffer(32), {}).ok());
  f.clock.Set(100.01);
  f.send.SendReady();
  std::lock_guard<std::mutex> lock(f.mu);
  REQUIRE(f.failures.size() == 2);
  CHECK(f.failures.count(1) == 1);
  CHECK(f.failures.count(2) == 1);
  CHECK(f.failures[1].find("h-10.0.0.9:7000") != std::string::npos);
  CHECK(f.failures[1].find("connection reset") != std::string::npos);
  const auto written = f.writer.Take();
  CHECK(written.size() == 3);  // transfer 3: kBegin + 2 packets
  for (const auto& w : written) CHECK(w.transfer == 3);
}

TEST_CASE("SendScheduler sends an aggregate's packets as they are summed, each once") {
  Fixture f;
  v1::AggregateTask task;
  task.set_aggregate_id(50);
  task.set_job_id(1);
  task.set_bytes(32);  // 2 packets
  task.set_dtype(v1::DTYPE_FLOAT32);
  task.add_constituents(1);
  auto sum = f.aggregations.Start(task);
  REQUIRE(sum.ok());
  REQUIRE(f.send.Schedule(Transfer(50, 32, 100.0), *sum, {}, nullptr, /*gated=*/true).ok());
  std::vector<float> ones(8, 1.0f);
  std::vector<uint32_t> ready;
  // Packet 1 is summed before the release, packet 0 after.
  REQUIRE(f.aggregations.Fold(50, 1, reinterpret_cast<uint8_t*>(ones.data()) + 16, 16, 16, &ready)
              .ok());
  f.send.QueueAggregatePackets(50, ready);  // before the release: the release queues it
  f.clock.Set(100.01);
  CHECK(f.send.SendReady() == kNever);
  auto written = f.writer.Take();
  REQUIRE(written.size() == 2);
  CHECK(written[0].kind == PacketKind::kBegin);
  CHECK(written[1].offset == 16);
  ready.clear();
  REQUIRE(f.aggregations.Fold(50, 1, reinterpret_cast<uint8_t*>(ones.data()), 0, 16, &ready).ok());
  f.send.QueueAggregatePackets(50, ready);
  f.send.QueueAggregatePackets(50, ready);  // reported twice: sent once
  f.send.QueueAggregatePackets(50, {1});    // sent already
  f.send.SendReady();
  written = f.writer.Take();
  REQUIRE(written.size() == 1);
  CHECK(written[0].offset == 0);
  CHECK(!f.send.Has(50));
}

TEST_CASE("SendScheduler tells the peer to drop a cancelled transfer it has begun") {
  Fixture f;
  v1::SendTransfer send = Transfer(9, 160, 100.0);
  auto* segment = send.add_segments();
  segment->set_from_s(100.0);
  segment->set_to_s(200.0);
  segment->set_rate_bps(8 * 16);
  REQUIRE(f.send.Schedule(send, Buffer(160), {}).ok());
  REQUIRE(f.send.Schedule(Transfer(10, 32, 150.0), Buffer(32), {}).ok());
  f.clock.Set(102.0);
  f.send.SendReady();
  CHECK(f.writer.Take().size() == 3);  // begun: kBegin + the burst
  CHECK(f.send.Cancel(9, "the scheduler cancelled the aggregate"));
  CHECK(f.send.Cancel(10, "not begun"));  // nothing reached a peer: no kAbort
  CHECK(!f.send.Cancel(10, "twice"));
  f.send.SendReady();
  const auto written = f.writer.Take();
  REQUIRE(written.size() == 1);
  CHECK(written[0].kind == PacketKind::kAbort);
  CHECK(written[0].transfer == 9);
  CHECK(written[0].text == "the scheduler cancelled the aggregate");
}

TEST_CASE("SendScheduler streams a reply on its socket and says how it ended") {
  Fixture f;
  REQUIRE(f.send.Start().ok());
  PacketHeader request;
  request.job = 3;
  request.transfer = 77;
  const auto forever = std::chrono::steady_clock::time_point::max();

  SECTION("complete") {
    const uint64_t id = f.send.ReserveReplyId();
    CHECK((id >> 62) == 1);
    f.send.OpenReply(id, 5, request, Buffer(48), 3);
    f.send.QueueReply(id, 0, 48);
    CHECK(f.send.AwaitReply(id, [] { return std::string(); }, forever).ok());
    const auto written = f.writer.Take();
    REQUIRE(written.size() == 3);
    for (const auto& w : written) {
      CHECK(w.to == "fd:5");
      CHECK(w.transfer == 77);  // the asking daemon's request id
      CHECK(w.kind == PacketKind::kData);
    }
  }
  SECTION("cut-through: packets queued as they come, then the end") {
    const uint64_t id = f.send.ReserveReplyId();
    f.send.OpenReply(id, 5, request, Buffer(48), SIZE_MAX);
    f.send.QueueReply(id, 0, 16);
    std::thread later([&] {
      f.send.QueueReply(id, 16, 48);
      f.send.EndReply(id);
    });
    CHECK(f.send.AwaitReply(id, [] { return std::string(); }, forever).ok());
    later.join();
    CHECK(f.writer.Take().size() == 3);
  }
  SECTION("a failed source aborts it") {
    const uint64_t id = f.send.ReserveReplyId();
    f.send.OpenReply(id, 5, request, Buffer(48), 3);  // nothing queued yet
    std::thread fail([&] { f.send.FailReply(id, "its copy failed"); });
    absl::Status ended = f.send.AwaitReply(id, [] { return std::string(); }, forever);
    fail.join();
    CHECK(ended.code() == absl::StatusCode::kAborted);
    CHECK(ended.message() == "its copy failed");
  }
  SECTION("a failing predicate aborts it") {
    const uint64_t id = f.send.ReserveReplyId();
    f.send.OpenReply(id, 5, request, Buffer(48), 3);
    absl::Status ended = f.send.AwaitReply(id, [] { return std::string("round 4 failed"); }, forever);
    CHECK(ended.code() == absl::StatusCode::kAborted);
  }
  SECTION("a failed write") {
    f.writer.Fail("fd:6");
    const uint64_t id = f.send.ReserveReplyId();
    f.send.OpenReply(id, 6, request, Buffer(48), 3);
    f.send.QueueReply(id, 0, 48);
    absl::Status ended = f.send.AwaitReply(id, [] { return std::string(); }, forever);
    CHECK(ended.code() == absl::StatusCode::kUnavailable);
    CHECK(std::string(ended.message()).find("connection reset") != std::string::npos);
  }
  SECTION("the deadline") {
    const uint64_t id = f.send.ReserveReplyId();
    f.send.OpenReply(id, 5, request, Buffer(48), 3);
    absl::Status ended = f.send.AwaitReply(
        id, [] { return std::string(); },
        std::chrono::steady_clock::now() + std::chrono::milliseconds(20));
    CHECK(ended.code() == absl::StatusCode::kDeadlineExceeded);
  }
  SECTION("stopping") {
    const uint64_t id = f.send.ReserveReplyId();
    f.send.OpenReply(id, 5, request, Buffer(48), 3);
    std::thread stop([&] { f.send.Stop(); });
    absl::Status ended = f.send.AwaitReply(id, [] { return std::string(); }, forever);
    stop.join();
    CHECK(ended.code() == absl::StatusCode::kCancelled);
  }
  CHECK(f.send.queued_packets() == 0);
}

TEST_CASE("SendScheduler paces replies by the unscheduled budget") {
  Fixture f(/*unscheduled_bps=*/8 * 16);  // one packet a second, burst two
  PacketHeader request;
  request.job = 1;
  const uint64_t id = f.send.ReserveReplyId();
  f.send.OpenReply(id, 5, request, Buffer(64), 4);
  f.send.QueueReply(id, 0, 64);
  const double next = f.send.SendReady();
  CHECK(f.writer.Take().size() == 2);
  CHECK(next > 100.0);
  f.send.CloseReply(id);
  CHECK(f.send.queued_packets() == 0);
}

TEST_CASE("SendScheduler forgets every transfer on DropAll") {
  Fixture f;
  REQUIRE(f.send.Schedule(Transfer(1, 32, 100.0), Buffer(32), {}).ok());
  REQUIRE(f.send.Schedule(Transfer(2, 32, 200.0), Buffer(32), {}).ok());
  f.send.DropAll();
  CHECK(f.send.SendReady() == kNever);
  CHECK(f.writer.Take().empty());
  {
    std::lock_guard<std::mutex> lock(f.mu);
    CHECK(f.failures.empty());  // the scheduler is gone; pushes fail elsewhere
  }
}

}  // namespace
}  // namespace mlfabric::daemon
