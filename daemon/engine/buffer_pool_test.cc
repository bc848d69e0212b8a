#include "daemon/engine/buffer_pool.h"

#include <catch2/catch.hpp>

namespace mlfabric::daemon {
namespace {

std::shared_ptr<SharedBuffer> Buffer(size_t size) {
  auto created = SharedBuffer::Create(size);
  REQUIRE(created.ok());
  return std::make_shared<SharedBuffer>(std::move(*created));
}

TEST_CASE("a recycled buffer comes back for the same size only") {
  BufferPool pool;
  CHECK(pool.Take(4096) == nullptr);
  auto buffer = Buffer(4096);
  SharedBuffer* raw = buffer.get();
  pool.Recycle(std::move(buffer));
  CHECK(pool.pooled_bytes() == 4096);
  CHECK(pool.Take(8192) == nullptr);
  auto again = pool.Take(4096);
  CHECK(again.get() == raw);
  CHECK(pool.pooled_bytes() == 0);
}

TEST_CASE("a buffer someone still holds is not recycled; per-size bound holds") {
  BufferPool pool;
  auto held = Buffer(4096);
  auto other_holder = held;
  pool.Recycle(held);
  CHECK(pool.pooled_bytes() == 0);
  for (size_t i = 0; i < BufferPool::kMaxPerSize + 2; ++i) pool.Recycle(Buffer(4096));
  CHECK(pool.pooled_bytes() == 4096 * BufferPool::kMaxPerSize);
}

}  // namespace
}  // namespace mlfabric::daemon
