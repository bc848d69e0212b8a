#include "ipc/local_ipc.h"

#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

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
