// DataSession on a socket pair with a recording handler: transfers are
// received into the handler's buffers and completed, and every kind of
// malformed input closes the session with a reason while the transfers it
// had begun are handed back unfinished (so each fails exactly once).
#include "daemon/transport/data_session.h"

#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "daemon/transport/framing.h"

namespace mlfabric::transport {
namespace {

class Recorder final : public DataSessionHandler {
 public:
  absl::Status Begin(const PacketHeader& header) override {
    if (refuse_begin.count(header.transfer)) return absl::AlreadyExistsError("begun on another session");
    auto created = SharedBuffer::Create(header.offset);
    if (!created.ok()) return created.status();
    buffers[header.transfer] = std::make_shared<SharedBuffer>(std::move(*created));
    return absl::OkStatus();
  }
  std::shared_ptr<SharedBuffer> BufferFor(const PacketHeader& header) override {
    auto it = buffers.find(header.transfer);
    return it == buffers.end() ? nullptr : it->second;
  }
  absl::Status Arrived(const PacketHeader& header, std::shared_ptr<SharedBuffer> buffer,
                       bool* complete) override {
    received[header.transfer] += header.length;
    *complete = received[header.transfer] == buffer->size();
    if (*complete) completed.push_back(header.transfer);
    return absl::OkStatus();
  }
  absl::Status GetRequest(int, const PacketHeader& header,
                          const v1::DataGetRequest& body) override {
    gets.push_back(body.server() + "@" + std::to_string(header.offset));
    return absl::OkStatus();
  }
  void Aborted(const PacketHeader& header, const std::string& reason) override {
    aborted[header.transfer] = reason;
  }
  void Ended(const std::string& peer, const std::set<uint64_t>& left,
             const std::string& reason) override {
    ++ended;
    unfinished = left;
    close_reason = reason;
    this->peer = peer;
  }

  std::set<uint64_t> refuse_begin;
  std::map<uint64_t, std::shared_ptr<SharedBuffer>> buffers;
  std::map<uint64_t, uint64_t> received;
  std::vector<uint64_t> completed;
  std::vector<std::string> gets;
  std::map<uint64_t, std::string> aborted;
  int ended = 0;
  std::set<uint64_t> unfinished;
  std::string close_reason;
  std::string peer;
};

// Writes frames into one end of a socket pair; the session reads the other.
struct Pair {
  Pair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0); }
  ~Pair() {
    if (fds[0] >= 0) ::close(fds[0]);
    ::close(fds[1]);
  }
  void Write(PacketKind kind, uint64_t transfer, uint64_t offset, const std::string& payload = "") {
    PacketHeader header;
    header.kind = kind;
    header.job = 1;
    header.transfer = transfer;
    header.offset = offset;
    REQUIRE(WritePacket(watchdog, fds[0], header, payload.data(),
                        static_cast<uint32_t>(payload.size()))
                .ok());
  }
  void WriteRaw(const std::string& bytes) {
    REQUIRE(::write(fds[0], bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  }
  // Closes the writing end and runs the session to its end.
  Recorder& Run() {
    ::close(fds[0]);
    fds[0] = -1;
    std::atomic<bool> stopping{false};
    DataSession(fds[1], "peer-7", /*max_transfer_bytes=*/1 << 20).Run(recorder, stopping);
    return recorder;
  }
  int fds[2];
  SendWatchdog watchdog{5.0};
  Recorder recorder;
};

TEST_CASE("DataSession receives transfers into the handler's buffers") {
  Pair pair;
  pair.Write(PacketKind::kBegin, 1, 8);
  pair.Write(PacketKind::kBegin, 2, 4);
  pair.Write(PacketKind::kData, 1, 4, "5678");
  pair.Write(PacketKind::kData, 2, 0, "abcd");
  pair.Write(PacketKind::kData, 1, 0, "1234");
  v1::DataGetRequest get;
  get.set_server("ps0");
  pair.Write(PacketKind::kGetRequest, 0, 3, get.SerializeAsString());
  Recorder& r = pair.Run();
  CHECK(r.completed == std::vector<uint64_t>{2, 1});
  CHECK(std::string(reinterpret_cast<char*>(r.buffers[1]->data()), 8) == "12345678");
  CHECK(r.gets == std::vector<std::string>{"ps0@3"});
  CHECK(r.ended == 1);
  CHECK(r.close_reason.empty());
  CHECK(r.unfinished.empty());
  CHECK(r.peer == "peer-7");
}

TEST_CASE("DataSession skips the payload of a transfer cancelled meanwhile") {
  Pair pair;
  pair.Write(PacketKind::kBegin, 1, 8);
  pair.Write(PacketKind::kData, 1, 0, "1234");
  pair.Write(PacketKind::kBegin, 2, 4);
  pair.Write(PacketKind::kData, 2, 0, "abcd");
  // The handler forgets transfer 1 between its kBegin and its data.
  class Forgetful final : public DataSessionHandler {
   public:
    explicit Forgetful(Recorder& r) : r_(r) {}
    absl::Status Begin(const PacketHeader& h) override {
      absl::Status s = r_.Begin(h);
      if (h.transfer == 1) r_.buffers.erase(1);
      return s;
    }
    std::shared_ptr<SharedBuffer> BufferFor(const PacketHeader& h) override { return r_.BufferFor(h); }
    absl::Status Arrived(const PacketHeader& h, std::shared_ptr<SharedBuffer> b, bool* c) override {
      return r_.Arrived(h, std::move(b), c);
    }
    absl::Status GetRequest(int fd, const PacketHeader& h, const v1::DataGetRequest& b) override {
      return r_.GetRequest(fd, h, b);
    }
    void Aborted(const PacketHeader& h, const std::string& why) override { r_.Aborted(h, why); }
    void Ended(const std::string& p, const std::set<uint64_t>& u, const std::string& why) override {
      r_.Ended(p, u, why);
    }

   private:
    Recorder& r_;
  } forgetful(pair.recorder);
  ::close(pair.fds[0]);
  pair.fds[0] = -1;
  std::atomic<bool> stopping{false};
  DataSession(pair.fds[1], "peer-7", 1 << 20).Run(forgetful, stopping);
  Recorder& r = pair.recorder;
  CHECK(r.completed == std::vector<uint64_t>{2});  // the session went on after skipping
  CHECK(r.close_reason.empty());
  CHECK(r.unfinished == std::set<uint64_t>{1});  // its owner forgot it already
}

TEST_CASE("DataSession hands an aborted transfer up once") {
  Pair pair;
  pair.Write(PacketKind::kBegin, 1, 8);
  pair.Write(PacketKind::kData, 1, 0, "1234");
  pair.Write(PacketKind::kAbort, 1, 0, "the scheduler cancelled it");
  pair.Write(PacketKind::kAbort, 1, 0, "again");  // no longer begun: ignored
  Recorder& r = pair.Run();
  REQUIRE(r.aborted.size() == 1);
  CHECK(r.aborted[1] == "the scheduler cancelled it");
  CHECK(r.unfinished.empty());
  CHECK(r.close_reason.empty());
}

TEST_CASE("DataSession closes on malformed input, naming it, and returns what was unfinished") {
  Pair pair;
  pair.Write(PacketKind::kBegin, 1, 8);
  pair.Write(PacketKind::kData, 1, 0, "1234");
  std::string expected;
  SECTION("data for a transfer never begun") {
    pair.Write(PacketKind::kData, 9, 0, "1234");
    expected = "data for unknown transfer 9";
  }
  SECTION("a packet outside its transfer") {
    pair.Write(PacketKind::kData, 1, 6, "1234");
    expected = "is outside transfer 1 of 8 bytes";
  }
  SECTION("a begin of size 0") {
    pair.Write(PacketKind::kBegin, 2, 0);
    expected = "bad size 0";
  }
  SECTION("a begin larger than the largest transfer") {
    pair.Write(PacketKind::kBegin, 2, (1 << 20) + 1);
    expected = "bad size";
  }
  SECTION("a transfer begun twice") {
    pair.Write(PacketKind::kBegin, 1, 8);
    expected = "begun twice";
  }
  SECTION("a begin the handler refuses") {
    pair.recorder.refuse_begin = {2};
    pair.Write(PacketKind::kBegin, 2, 8);
    expected = "begun on another session";
  }
  SECTION("a get request that names no server") {
    pair.Write(PacketKind::kGetRequest, 0, 0, v1::DataGetRequest().SerializeAsString());
    expected = "no server named";
  }
  SECTION("a corrupted payload") {
    PacketHeader header;
    header.kind = PacketKind::kData;
    header.job = 1;
    header.transfer = 1;
    header.offset = 4;
    uint8_t head[kHeaderBytes];
    EncodePacketHeader(header, "5678", 4, head);
    pair.WriteRaw(std::string(reinterpret_cast<char*>(head), kHeaderBytes) + "5679");
    expected = "CRC";
  }
  SECTION("a frame cut short") {
    pair.WriteRaw("MLF");
    expected = "";  // anything but a clean close
  }
  Recorder& r = pair.Run();
  CHECK(r.ended == 1);
  CHECK(!r.close_reason.empty());
  CHECK(r.close_reason.find(expected) != std::string::npos);
  CHECK(r.unfinished.count(1) == 1);  // transfer 1 fails exactly once, by its owner
  CHECK(r.completed.empty());
}

}  // namespace
}  // namespace mlfabric::transport
