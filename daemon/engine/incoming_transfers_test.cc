#include "daemon/engine/incoming_transfers.h"

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

TEST_CASE("a discarded transfer is forgotten and stays refused, the last few thousand kept") {
  BufferPool pool;
  IncomingTransfers in(&pool);
  in.Add(7, 1, 4096, Buffer(4096));
  in.Discard(7);
  CHECK_FALSE(in.Contains(7));
  CHECK(in.Discarded(7));
  CHECK(pool.Take(4096) != nullptr);  // its buffer serves the next transfer
  in.Discard(8);  // never arrived: refused when it does
  CHECK(in.Discarded(8));
  for (uint64_t id = 100; id < 100 + IncomingTransfers::kDiscardsKept; ++id) in.Discard(id);
  CHECK_FALSE(in.Discarded(7));
  CHECK_FALSE(in.Discarded(8));
  CHECK(in.Discarded(100 + IncomingTransfers::kDiscardsKept - 1));
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

TEST_CASE("bytes are counted once, in any order, and none past the end") {
  BufferPool pool;
  IncomingTransfers in(&pool);
  Incoming& t = in.Add(3, 1, 100, Buffer(100));
  CHECK(t.Receive(3, 40, 20).ok());  // [40, 60)
  CHECK(t.Receive(3, 0, 20).ok());   // [0, 20)
  CHECK(t.Receive(3, 20, 20).ok());  // closes the gap: [0, 60)
  CHECK(t.arrived == std::map<uint64_t, uint64_t>{{0, 60}});
  CHECK(t.Receive(3, 80, 20).ok());
  CHECK(t.Receive(3, 60, 20).ok());  // [0, 100)
  CHECK(t.arrived == std::map<uint64_t, uint64_t>{{0, 100}});
  CHECK(t.received == 100);
  CHECK(in.Complete(3));

  Incoming& u = in.Add(4, 1, 100, Buffer(100));
  REQUIRE(u.Receive(4, 30, 20).ok());  // [30, 50)
  const absl::Status again = u.Receive(4, 30, 20);
  CHECK(again.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(again.message()) == "transfer 4 received bytes [30, 50) twice");
  CHECK_FALSE(u.Receive(4, 20, 11).ok());  // ends inside
  CHECK_FALSE(u.Receive(4, 49, 10).ok());  // begins inside
  CHECK_FALSE(u.Receive(4, 0, 100).ok());  // covers it
  CHECK(std::string(u.Receive(4, 90, 20).message()) ==
        "transfer 4 has 100 bytes; a packet brought [90, 110)");
  CHECK(u.Receive(4, 50, 0).ok());  // empty: nothing to count
  CHECK(u.received == 20);          // the refused packets counted nothing
  CHECK(u.Receive(4, 20, 10).ok());
  CHECK(u.Receive(4, 50, 10).ok());
  CHECK(u.arrived == std::map<uint64_t, uint64_t>{{20, 60}});
}

}  // namespace
}  // namespace mlfabric::daemon
