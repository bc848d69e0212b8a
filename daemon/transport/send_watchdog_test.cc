// SendWatchdog on real loopback TCP connections: a write to a peer that
// reads nothing fails after the timeout; a write to a slow peer that keeps
// reading succeeds however long it takes in all; the two at once affect
// only the stuck one.
#include "daemon/transport/send_watchdog.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace mlfabric::transport {
namespace {

struct Pair {
  int writer = -1;
  int reader = -1;
  ~Pair() {
    if (writer >= 0) ::close(writer);
    if (reader >= 0) ::close(reader);
  }
};

// A connected loopback TCP pair; with `narrow`, 64 KiB socket buffers so a
// slow reader paces the writer.
void Connect(Pair& pair, bool narrow) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(::listen(listener, 1) == 0);
  socklen_t length = sizeof(address);
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  pair.writer = ::socket(AF_INET, SOCK_STREAM, 0);
  if (narrow) {
    const int bytes = 64 << 10;
    ::setsockopt(pair.writer, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  }
  REQUIRE(::connect(pair.writer, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  pair.reader = ::accept(listener, nullptr, nullptr);
  REQUIRE(pair.reader >= 0);
  if (narrow) {
    const int bytes = 64 << 10;
    ::setsockopt(pair.reader, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  }
  ::close(listener);
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST_CASE("A write to a peer that reads nothing fails after the timeout") {
  SendWatchdog watchdog(0.3);
  Pair pair;
  Connect(pair, /*narrow=*/false);
  std::vector<uint8_t> data(64 << 20, 0x5A);  // far more than the socket buffers hold
  iovec iov[1] = {{data.data(), data.size()}};
  const absl::Status status = watchdog.SendAll(pair.writer, iov, 1);
  INFO(status.ToString());
  CHECK(absl::IsDeadlineExceeded(status));
  CHECK(status.message().find("took no data for 0.3 s") != absl::string_view::npos);
  CHECK(watchdog.timeouts() == 1);
}

TEST_CASE("A slow peer that keeps reading is not cut off; only the stuck one is") {
  SendWatchdog watchdog(1.0);
  Pair slow, stuck;
  Connect(slow, /*narrow=*/true);
  Connect(stuck, /*narrow=*/false);
  // The slow reader takes 64 KiB every 50 ms: 4 MiB need at least 3.2 s,
  // over three times the timeout, with no gap near it.
  const size_t bytes = 4 << 20;
  std::vector<uint8_t> payload(bytes);
  for (size_t i = 0; i < bytes; ++i) payload[i] = static_cast<uint8_t>(i * 7 + 1);
  std::vector<uint8_t> received;
  std::thread reader([&] {
    std::vector<uint8_t> chunk(64 << 10);
    while (received.size() < bytes) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const ssize_t got = ::recv(slow.reader, chunk.data(), chunk.size(), 0);
      if (got <= 0) break;
      received.insert(received.end(), chunk.begin(), chunk.begin() + got);
    }
  });
  absl::Status stuck_status;
  std::thread stuck_writer([&] {
    std::vector<uint8_t> data(64 << 20, 0x33);
    iovec iov[1] = {{data.data(), data.size()}};
    stuck_status = watchdog.SendAll(stuck.writer, iov, 1);
  });
  // Header and payload in one gather write, as the daemon sends packets.
  uint8_t head[44] = {1, 2, 3};
  iovec iov[2] = {{head, sizeof(head)}, {payload.data(), bytes - sizeof(head)}};
  const auto start = std::chrono::steady_clock::now();
  const absl::Status status = watchdog.SendAll(slow.writer, iov, 2);
  const double took_s = SecondsSince(start);
  reader.join();
  stuck_writer.join();
  INFO(status.ToString() << "; took " << took_s << " s");
  CHECK(status.ok());
  REQUIRE(received.size() == bytes);
  CHECK(std::equal(head, head + sizeof(head), received.begin()));
  CHECK(std::equal(payload.begin(), payload.end() - sizeof(head), received.begin() + sizeof(head)));
  // Precondition: the write lasted longer than the timeout, or the case
  // would prove nothing.
  CHECK(took_s > watchdog.timeout_s());
  CHECK(absl::IsDeadlineExceeded(stuck_status));
  CHECK(watchdog.timeouts() == 1);
}

TEST_CASE("A socket error is reported as unavailable, not as a timeout") {
  SendWatchdog watchdog(5.0);
  Pair pair;
  Connect(pair, /*narrow=*/false);
  ::close(pair.reader);
  pair.reader = -1;
  std::vector<uint8_t> data(8 << 20, 1);
  absl::Status status;
  // The first writes may still be accepted before the peer's reset comes back.
  for (int i = 0; i < 10 && status.ok(); ++i) {
    iovec iov[1] = {{data.data(), data.size()}};
    status = watchdog.SendAll(pair.writer, iov, 1);
  }
  INFO(status.ToString());
  CHECK(absl::IsUnavailable(status));
  CHECK(watchdog.timeouts() == 0);
}

}  // namespace
}  // namespace mlfabric::transport
