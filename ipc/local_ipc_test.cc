#include "ipc/local_ipc.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace mlfabric {
namespace {

TEST_CASE("Messages and shared buffers cross a socket pair intact") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  LocalChannel a(fds[0]), b(fds[1]);

  auto buffer = SharedBuffer::Create(1 << 20);
  REQUIRE(buffer.ok());
  for (size_t i = 0; i < buffer->size(); ++i) buffer->data()[i] = static_cast<uint8_t>(i * 7);

  v1::LocalMessage message;
  message.mutable_push()->set_request_id(99);
  message.mutable_push()->set_bytes(1 << 20);
  REQUIRE(a.Send(message, buffer->fd()).ok());
  v1::LocalMessage plain;
  plain.mutable_get()->set_server("ps0");
  REQUIRE(a.Send(plain).ok());

  v1::LocalMessage got;
  int fd = -1;
  REQUIRE(b.Receive(&got, &fd).ok());
  REQUIRE(fd >= 0);
  CHECK(got.push().request_id() == 99);
  auto mapped = SharedBuffer::Map(fd, 1 << 20);
  REQUIRE(mapped.ok());
  CHECK(std::memcmp(mapped->data(), buffer->data(), 1 << 20) == 0);
  // Shared, not copied: a write on one side shows on the other.
  buffer->data()[5] = 0xAB;
  CHECK(mapped->data()[5] == 0xAB);

  REQUIRE(b.Receive(&got, &fd).ok());
  CHECK(fd == -1);
  CHECK(got.get().server() == "ps0");
}

// The daemon's end of an application socket is non-blocking once Boost.Asio
// has waited on it. A message that is not all there yet, and one larger
// than the socket's buffer, still arrive whole: the channel waits as a
// blocking socket would instead of ending the session.
TEST_CASE("A non-blocking socket waits for a partial message and a full buffer") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  for (int fd : fds) REQUIRE(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
  LocalChannel a(fds[0]), b(fds[1]);
  constexpr int kMessages = 3;
  // 900 KB each, several times a socket pair's buffer (~200 KB).
  std::vector<std::string> names;
  for (int i = 0; i < kMessages; ++i) names.push_back(std::string(900000, static_cast<char>('a' + i)));
  std::vector<absl::Status> sent(kMessages);
  std::thread sender([&] {
    // The receiver is already waiting on an empty socket.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (int i = 0; i < kMessages; ++i) {
      v1::LocalMessage message;
      message.mutable_get()->set_server(names[i]);
      sent[i] = a.Send(message);
    }
  });
  for (int i = 0; i < kMessages; ++i) {
    v1::LocalMessage got;
    int fd = -1;
    const absl::Status received = b.Receive(&got, &fd);
    INFO("message " << i << ": " << received.ToString());
    REQUIRE(received.ok());
    CHECK(fd == -1);
    CHECK(got.get().server() == names[i]);
    // Slower than the sender: its writes find the buffer full.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  sender.join();
  for (int i = 0; i < kMessages; ++i) CHECK(sent[i].ok());
}

// A peer that stops part-way through a message, or reads nothing of what
// it is sent, does not hold the other side for ever: after the stall
// timeout the call fails, naming it, and a stalled send closes the channel.
TEST_CASE("A message that stalls part-way fails after the stall timeout") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  for (int fd : fds) REQUIRE(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
  LocalChannel a(fds[0]), b(fds[1]);
  a.set_stall_timeout_ms(200);
  b.set_stall_timeout_ms(200);

  // Half a prefix, then nothing.
  const uint8_t half[2] = {0x10, 0x00};
  REQUIRE(::write(fds[0], half, sizeof(half)) == 2);
  v1::LocalMessage got;
  int fd = -1;
  absl::Status received = b.Receive(&got, &fd);
  CHECK(received.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(received.message()), Catch::Contains("sent nothing more"));

  // Nobody reads b: a's sends fill the buffer, then fail and shut a down.
  v1::LocalMessage big;
  big.mutable_get()->set_server(std::string(900000, 'x'));
  absl::Status sent = a.Send(big);
  CHECK(sent.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(sent.message()), Catch::Contains("read nothing"));
  CHECK_FALSE(a.Send(big).ok());
}

TEST_CASE("A closed peer and a lying size are reported, not crashed on") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  auto a = std::make_unique<LocalChannel>(fds[0]);
  LocalChannel b(fds[1]);
  auto buffer = SharedBuffer::Create(16);
  REQUIRE(buffer.ok());
  const int dup_fd = ::dup(buffer->fd());
  CHECK(SharedBuffer::Map(dup_fd, 1 << 20).status().code() == absl::StatusCode::kInvalidArgument);

  const uint8_t garbage[4] = {0xFF, 0xFF, 0xFF, 0x7F};  // 2 GiB length prefix
  REQUIRE(::write(fds[0], garbage, 4) == 4);
  v1::LocalMessage got;
  int fd = -1;
  CHECK(b.Receive(&got, &fd).code() == absl::StatusCode::kInvalidArgument);

  a.reset();
  CHECK(b.Receive(&got, &fd).code() == absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace mlfabric
