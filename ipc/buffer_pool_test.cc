#include "ipc/buffer_pool.h"

#include <catch2/catch.hpp>

namespace mlfabric {
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
  CHECK(pool.reused() == 1);
}

TEST_CASE("a buffer someone still holds is not recycled; per-size bound holds") {
  BufferPool pool;
  auto held = Buffer(4096);
  auto other_holder = held;
  pool.Recycle(held);
  CHECK(pool.pooled_bytes() == 0);
  const size_t per_size = pool.bounds().max_per_size;
  for (size_t i = 0; i < per_size + 2; ++i) pool.Recycle(Buffer(4096));
  CHECK(pool.pooled_bytes() == 4096 * per_size);
}

TEST_CASE("the byte bound holds across sizes") {
  BufferPool pool({/*max_per_size=*/8, /*max_bytes=*/3 * 4096});
  pool.Recycle(Buffer(4096));
  pool.Recycle(Buffer(8192));
  pool.Recycle(Buffer(4096));  // would make 4 pages
  CHECK(pool.pooled_bytes() == 3 * 4096);
  CHECK(pool.Take(8192) != nullptr);
  CHECK(pool.Take(4096) != nullptr);
  CHECK(pool.Take(4096) == nullptr);
}

}  // namespace
}  // namespace mlfabric
