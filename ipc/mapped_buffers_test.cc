#include "ipc/mapped_buffers.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace mlfabric {
namespace {

SharedBuffer Buffer(size_t size) {
  auto created = SharedBuffer::Create(size);
  REQUIRE(created.ok());
  return std::move(*created);
}

bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1 || errno != EBADF; }

TEST_CASE("the same file passed twice is mapped once") {
  MappedBuffers mappings;
  SharedBuffer sent = Buffer(1 << 20);
  std::memset(sent.data(), 0x11, sent.size());

  bool reused = true;
  auto first = mappings.Map(::dup(sent.fd()), 1 << 20, &reused);
  REQUIRE(first.ok());
  CHECK_FALSE(reused);
  CHECK(first->size() == size_t{1} << 20);
  CHECK(first->data()[12345] == 0x11);

  const int again_fd = ::dup(sent.fd());
  auto second = mappings.Map(again_fd, 1 << 20, &reused);
  REQUIRE(second.ok());
  CHECK(reused);
  CHECK_FALSE(IsOpen(again_fd));  // the kept mapping has a descriptor already
  CHECK(second->data() == first->data());
  CHECK(second->fd() == first->fd());

  // Still shared memory: the sender's writes show through the reused mapping.
  sent.data()[7] = 0x22;
  CHECK(second->data()[7] == 0x22);
  CHECK(mappings.hits() == 1);
  CHECK(mappings.misses() == 1);
  CHECK(mappings.entries() == 1);
  CHECK(mappings.mapped_bytes() == size_t{1} << 20);
}

TEST_CASE("a smaller size reuses the mapping and reports the size asked for") {
  MappedBuffers mappings;
  SharedBuffer sent = Buffer(8192);
  auto whole = mappings.Map(::dup(sent.fd()), 8192);
  REQUIRE(whole.ok());
  bool reused = false;
  auto part = mappings.Map(::dup(sent.fd()), 100, &reused);
  REQUIRE(part.ok());
  CHECK(reused);
  CHECK(part->size() == 100);
  CHECK(part->data() == whole->data());
}

TEST_CASE("a different file is a miss") {
  MappedBuffers mappings;
  SharedBuffer a = Buffer(4096);
  SharedBuffer b = Buffer(4096);
  std::memset(a.data(), 1, a.size());
  std::memset(b.data(), 2, b.size());
  auto from_a = mappings.Map(::dup(a.fd()), 4096);
  bool reused = true;
  auto from_b = mappings.Map(::dup(b.fd()), 4096, &reused);
  REQUIRE(from_a.ok());
  REQUIRE(from_b.ok());
  CHECK_FALSE(reused);
  CHECK(from_a->data()[0] == 1);
  CHECK(from_b->data()[0] == 2);
  CHECK(mappings.hits() == 0);
  CHECK(mappings.misses() == 2);
  CHECK(mappings.entries() == 2);
}

TEST_CASE("a file that grew past its mapping is mapped again at the new size") {
  MappedBuffers mappings;
  SharedBuffer sent = Buffer(4096);
  auto small = mappings.Map(::dup(sent.fd()), 4096);
  REQUIRE(small.ok());

  REQUIRE(::ftruncate(sent.fd(), 1 << 20) == 0);
  auto writer = mappings.Map(::dup(sent.fd()), 1 << 20);  // a writable view of the whole file
  REQUIRE(writer.ok());
  CHECK(writer->size() == size_t{1} << 20);
  writer->data()[(1 << 20) - 1] = 0x5A;  // out of the old mapping's range
  CHECK(mappings.misses() == 2);
  CHECK(mappings.entries() == 1);
  CHECK(mappings.mapped_bytes() == size_t{1} << 20);

  // The old view is still mapped and sees the same bytes.
  writer->data()[0] = 0x42;
  CHECK(small->data()[0] == 0x42);

  // The larger mapping serves both sizes now.
  bool reused = false;
  auto again = mappings.Map(::dup(sent.fd()), 4096, &reused);
  REQUIRE(again.ok());
  CHECK(reused);
  CHECK(again->data() == writer->data());
}

TEST_CASE("a file shorter than claimed is refused, cached or not") {
  MappedBuffers mappings;
  SharedBuffer sent = Buffer(4096);
  auto mapped = mappings.Map(::dup(sent.fd()), 4096);
  REQUIRE(mapped.ok());
  const int fd = ::dup(sent.fd());
  CHECK(mappings.Map(fd, 8192).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(IsOpen(fd));

  REQUIRE(::ftruncate(sent.fd(), 1024) == 0);  // shrunk behind the kept mapping
  CHECK(mappings.Map(::dup(sent.fd()), 4096).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(mappings.hits() == 0);
}

TEST_CASE("an evicted mapping stays valid while a buffer views it") {
  MappedBuffers mappings(MappedBuffers::Bounds{.max_entries = 2, .max_bytes = 3 * 4096});
  std::vector<SharedBuffer> files;
  for (int i = 0; i < 4; ++i) {
    files.push_back(Buffer(4096));
    std::memset(files.back().data(), i + 1, 4096);
  }
  auto oldest = mappings.Map(::dup(files[0].fd()), 4096);
  REQUIRE(oldest.ok());
  REQUIRE(mappings.Map(::dup(files[1].fd()), 4096).ok());
  REQUIRE(mappings.Map(::dup(files[2].fd()), 4096).ok());  // evicts files[0]'s entry
  CHECK(mappings.entries() == 2);
  CHECK(mappings.mapped_bytes() == 2 * 4096);
  for (int i = 0; i < 4096; ++i) REQUIRE(oldest->data()[i] == 1);
  oldest->data()[0] = 9;
  CHECK(files[0].data()[0] == 9);

  // files[0] is a miss now; mapping it evicts the least recently used (1).
  bool reused = true;
  auto remapped = mappings.Map(::dup(files[0].fd()), 4096, &reused);
  REQUIRE(remapped.ok());
  CHECK_FALSE(reused);
  CHECK(remapped->data()[0] == 9);
  REQUIRE(mappings.Map(::dup(files[2].fd()), 4096, &reused).ok());
  CHECK(reused);

  mappings.Clear();
  CHECK(mappings.entries() == 0);
  CHECK(mappings.mapped_bytes() == 0);
  CHECK(oldest->data()[1] == 1);
  CHECK(remapped->data()[1] == 1);
}

TEST_CASE("the byte bound evicts, and a mapping beyond it is not kept") {
  MappedBuffers mappings(MappedBuffers::Bounds{.max_entries = 16, .max_bytes = 8192});
  SharedBuffer a = Buffer(4096);
  SharedBuffer b = Buffer(8192);
  SharedBuffer huge = Buffer(16384);
  REQUIRE(mappings.Map(::dup(a.fd()), 4096).ok());
  REQUIRE(mappings.Map(::dup(b.fd()), 8192).ok());  // 12 KiB: a goes
  CHECK(mappings.entries() == 1);
  CHECK(mappings.mapped_bytes() == 8192);
  auto big = mappings.Map(::dup(huge.fd()), 16384);
  REQUIRE(big.ok());
  big->data()[16383] = 1;
  CHECK(mappings.entries() == 1);  // b stays, the huge one was not kept
  CHECK(mappings.misses() == 3);
}

TEST_CASE("the cache's share does not make a buffer look in use") {
  // The daemon tells a worker its push buffer is free when the push's
  // shared_ptr<SharedBuffer> is the only one left (buffer_released).
  MappedBuffers mappings;
  SharedBuffer sent = Buffer(4096);
  auto mapped = mappings.Map(::dup(sent.fd()), 4096);
  REQUIRE(mapped.ok());
  auto held = std::make_shared<SharedBuffer>(std::move(*mapped));
  CHECK(held.use_count() == 1);
  auto second = mappings.Map(::dup(sent.fd()), 4096);
  REQUIRE(second.ok());
  CHECK(held.use_count() == 1);
}

TEST_CASE("a descriptor received over a socket finds the mapping of an earlier one") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  LocalChannel a(fds[0]), b(fds[1]);
  SharedBuffer sent = Buffer(1 << 16);
  MappedBuffers mappings;
  for (int round = 0; round < 3; ++round) {
    std::memset(sent.data(), round, sent.size());
    v1::LocalMessage message;
    message.mutable_push()->set_bytes(1 << 16);
    REQUIRE(a.Send(message, sent.fd()).ok());
    v1::LocalMessage got;
    int fd = -1;
    REQUIRE(b.Receive(&got, &fd).ok());
    auto mapped = mappings.Map(fd, static_cast<size_t>(got.push().bytes()));
    REQUIRE(mapped.ok());
    CHECK(mapped->data()[100] == round);
  }
  CHECK(mappings.hits() == 2);
  CHECK(mappings.misses() == 1);
}

TEST_CASE("concurrent maps of the same files stay consistent") {
  MappedBuffers mappings(MappedBuffers::Bounds{.max_entries = 3, .max_bytes = size_t{1} << 30});
  std::vector<SharedBuffer> files;
  for (int i = 0; i < 5; ++i) {
    files.push_back(Buffer(4096 * (i + 1)));
    std::memset(files.back().data(), i + 1, files.back().size());
  }
  std::atomic<int> wrong{0};  // Catch2's assertions are not thread-safe
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int n = 0; n < 200; ++n) {
        const size_t i = static_cast<size_t>((n + t) % 5);
        auto mapped = mappings.Map(::dup(files[i].fd()), files[i].size());
        if (!mapped.ok() || mapped->size() != files[i].size() ||
            mapped->data()[mapped->size() - 1] != static_cast<uint8_t>(i + 1)) {
          wrong.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(wrong.load() == 0);
  CHECK(mappings.hits() + mappings.misses() == 800);
  CHECK(mappings.entries() <= 3);
}

}  // namespace
}  // namespace mlfabric
