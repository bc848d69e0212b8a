// Framing over a real socket pair: packets written one way are read back
// intact, back to back (the scattered next-header path), and every way a
// frame can be cut short is an error naming how far it got.
#include "daemon/transport/framing.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace mlfabric::transport {
namespace {

struct Pair {
  int fds[2] = {-1, -1};
  Pair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0); }
  ~Pair() {
    for (int fd : fds) if (fd >= 0) ::close(fd);
  }
  void CloseWriter() {
    ::close(fds[0]);
    fds[0] = -1;
  }
};

std::vector<Frame> FramesOf(const std::vector<std::vector<uint8_t>>& payloads) {
  std::vector<Frame> frames;
  for (size_t i = 0; i < payloads.size(); ++i) {
    Frame f;
    f.header.transfer = 3;
    f.header.offset = i;
    f.payload = payloads[i].data();
    f.length = static_cast<uint32_t>(payloads[i].size());
    frames.push_back(f);
  }
  return frames;
}

// Reads every payload back, in order, and checks it.
void ReadAll(FrameReader& reader, const std::vector<std::vector<uint8_t>>& payloads) {
  for (size_t i = 0; i < payloads.size(); ++i) {
    auto header = reader.ReadHeader();
    REQUIRE(header.ok());
    CHECK(header->offset == i);
    REQUIRE(header->length == payloads[i].size());
    std::vector<uint8_t> got(header->length);
    REQUIRE(reader.ReadPayload(got.data(), got.size()).ok());
    CHECK(got == payloads[i]);
    CHECK(VerifyPayload(*header, got.data()).ok());
  }
}

TEST_CASE("packets written back to back are read back exactly") {
  Pair pair;
  SendWatchdog watchdog(5);
  std::vector<std::vector<uint8_t>> payloads;
  for (int i = 0; i < 20; ++i) payloads.emplace_back(1000 + 37 * i, static_cast<uint8_t>(i));
  std::thread writer([&] {
    for (size_t i = 0; i < payloads.size(); ++i) {
      PacketHeader header;
      header.transfer = 9;
      header.offset = i;
      REQUIRE(WritePacket(watchdog, pair.fds[0], header, payloads[i].data(),
                          static_cast<uint32_t>(payloads[i].size()))
                  .ok());
    }
  });
  FrameReader reader(pair.fds[1]);
  ReadAll(reader, payloads);
  writer.join();
  pair.CloseWriter();
  CHECK(reader.ReadHeader().status().code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("coalesced frames leave in one gather write when the socket has room") {
  Pair pair;
  SendWatchdog watchdog(5);
  int big = 4 << 20;
  REQUIRE(::setsockopt(pair.fds[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big)) == 0);
  std::vector<std::vector<uint8_t>> payloads;
  for (int i = 0; i < 16; ++i) payloads.emplace_back(4000 + i, static_cast<uint8_t>(i));
  const std::vector<Frame> frames = FramesOf(payloads);
  absl::StatusOr<size_t> written = WriteFrames(watchdog, pair.fds[0], frames);
  REQUIRE(written.ok());
  CHECK(*written == frames.size());
  FrameReader reader(pair.fds[1]);
  ReadAll(reader, payloads);
}

TEST_CASE("coalesced frames: what the kernel does not take is left, every frame arrives whole") {
  Pair pair;
  SendWatchdog watchdog(30);
  int small = 16 << 10;
  REQUIRE(::setsockopt(pair.fds[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)) == 0);
  std::vector<std::vector<uint8_t>> payloads;
  for (int i = 0; i < 64; ++i) payloads.emplace_back(8000 + 97 * i, static_cast<uint8_t>(i));
  const std::vector<Frame> frames = FramesOf(payloads);
  // 500 KB through a 16 KiB socket buffer: each call writes at least one
  // frame and returns what it wrote whole; the caller goes on from there.
  size_t calls = 0;
  std::thread writer([&] {
    size_t done = 0;
    while (done < frames.size()) {
      absl::StatusOr<size_t> more =
          WriteFrames(watchdog, pair.fds[0], absl::MakeConstSpan(frames).subspan(done));
      REQUIRE(more.ok());
      REQUIRE(*more >= 1);
      REQUIRE(*more <= frames.size() - done);
      done += *more;
      ++calls;
    }
  });
  FrameReader reader(pair.fds[1]);
  ReadAll(reader, payloads);
  writer.join();
  CHECK(calls >= 1);
}

TEST_CASE("a frame cut short is an error naming where") {
  Pair pair;
  const uint8_t partial[10] = {};
  REQUIRE(::write(pair.fds[0], partial, sizeof(partial)) == sizeof(partial));
  pair.CloseWriter();
  FrameReader reader(pair.fds[1]);
  auto header = reader.ReadHeader();
  REQUIRE_FALSE(header.ok());
  CHECK(header.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(header.status().message()).find("header cut after 10 bytes") !=
        std::string::npos);
}

TEST_CASE("addresses parse or are refused by name") {
  CHECK(ParseEndpoint("127.0.0.1:8080").ok());
  CHECK(ParseEndpoint("127.0.0.1:8080")->port() == 8080);
  CHECK_FALSE(ParseEndpoint("localhost").ok());
  CHECK_FALSE(ParseEndpoint("300.1.1.1:80").ok());
  CHECK(std::string(ParseEndpoint("127.0.0.1:0").status().message()).find("bad port") == 0);
}

int IntOption(int fd, int level, int name) {
  int value = -1;
  socklen_t size = sizeof(value);
  REQUIRE(::getsockopt(fd, level, name, &value, &size) == 0);
  return value;
}

TEST_CASE("a peer timeout turns on keepalive probes and bounds unacknowledged bytes") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  CHECK(IntOption(fd, SOL_SOCKET, SO_KEEPALIVE) == 0);
  REQUIRE(SetPeerTimeout(fd, 0).ok());  // 0: the kernel's defaults stay
  CHECK(IntOption(fd, SOL_SOCKET, SO_KEEPALIVE) == 0);
  REQUIRE(SetPeerTimeout(fd, 2).ok());
  CHECK(IntOption(fd, SOL_SOCKET, SO_KEEPALIVE) == 1);
  CHECK(IntOption(fd, IPPROTO_TCP, TCP_KEEPIDLE) == 2);
  CHECK(IntOption(fd, IPPROTO_TCP, TCP_KEEPINTVL) == 2);
  CHECK(IntOption(fd, IPPROTO_TCP, TCP_KEEPCNT) == 2);
  CHECK(IntOption(fd, IPPROTO_TCP, TCP_USER_TIMEOUT) == 6000);
  REQUIRE(SetPeerTimeout(fd, 0.2).ok());  // probes in whole seconds, at least 1
  CHECK(IntOption(fd, IPPROTO_TCP, TCP_KEEPIDLE) == 1);
  CHECK(IntOption(fd, IPPROTO_TCP, TCP_USER_TIMEOUT) == 3000);
  const absl::Status negative = SetPeerTimeout(fd, -1);
  CHECK(negative.code() == absl::StatusCode::kInvalidArgument);
  CHECK(negative.message() == "peer timeout: -1 s is not >= 0");
  ::close(fd);
  // Not a TCP socket: the kernel's refusal names the option.
  Pair pair;
  const absl::Status refused = SetPeerTimeout(pair.fds[0], 2);
  CHECK_FALSE(refused.ok());
  CHECK(std::string(refused.message()).find("setsockopt TCP_KEEPIDLE") != std::string::npos);
}

}  // namespace
}  // namespace mlfabric::transport
