#include "daemon/receive/incoming_transfers.h"

#include <catch2/catch.hpp>

namespace mlfabric::daemon {
namespace {

std::shared_ptr<SharedBuffer> Buffer(size_t bytes) {
  auto buffer = SharedBuffer::Create(bytes);
  REQUIRE(buffer.ok());
  return std::make_shared<SharedBuffer>(std::move(*buffer));
}

TEST_CASE("a transfer is complete once all its bytes are in") {
  BufferPool pool;
  IncomingTransfers in(&pool);
  CHECK(in.Find(7) == nullptr);
  CHECK_FALSE(in.Complete(7));
  Incoming& added = in.Add(7, /*job=*/3, /*total=*/8192, Buffer(8192));
  CHECK(added.job_id == 3);
  CHECK(in.Contains(7));
  in.Find(7)->received += 4096;
  CHECK_FALSE(in.Complete(7));
  in.Find(7)->received += 4096;
  CHECK(in.Complete(7));
  CHECK(in.Erase(7));
  CHECK_FALSE(in.Erase(7));
  CHECK(in.size() == 0);
}

TEST_CASE("a recycled transfer's buffer takes the next transfer of its size") {
  BufferPool pool;
  IncomingTransfers in(&pool);
  std::shared_ptr<SharedBuffer> buffer = Buffer(65536);
  const uint8_t* data = buffer->data();
  in.Add(1, 1, 65536, std::move(buffer));
  in.Recycle(1);
  CHECK_FALSE(in.Contains(1));
  std::shared_ptr<SharedBuffer> again = pool.Take(65536);
  REQUIRE(again != nullptr);
  CHECK(again->data() == data);
}

TEST_CASE("a buffer someone else still holds is not recycled") {
  BufferPool pool;
  IncomingTransfers in(&pool);
  std::shared_ptr<SharedBuffer> held = Buffer(65536);
  in.Add(1, 1, 65536, held);
  in.Recycle(1);
  CHECK(pool.Take(65536) == nullptr);
}

TEST_CASE("a transfer that arrived as another job's data is named") {
  BufferPool pool;
  IncomingTransfers in(&pool);
  CHECK(in.JobMismatch(9, 2).empty());  // not here: nothing to refuse
  in.Add(9, 1, 16, Buffer(16));
  CHECK(in.JobMismatch(9, 1).empty());
  const std::string mismatch = in.JobMismatch(9, 2);
  CHECK(mismatch.find("transfer 9 arrived as job 1's data but is job 2's") != std::string::npos);
}

TEST_CASE("adding a transfer again starts it afresh") {
  BufferPool pool;
  IncomingTransfers in(&pool);
  Incoming& first = in.Add(5, 1, 32, Buffer(32));
  first.received = 16;
  first.unfolded.emplace_back(0, 16);
  Incoming& second = in.Add(5, 2, 64, Buffer(64));
  CHECK(second.received == 0);
  CHECK(second.unfolded.empty());
  CHECK(second.total == 64);
  CHECK(second.job_id == 2);
}

}  // namespace
}  // namespace mlfabric::daemon
