#include "daemon/engine/round_table.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace mlfabric::daemon {
namespace {

constexpr uint64_t kChunk = 16;  // bytes: 4 int32 a chunk
const std::string kKey = "1/ps";

v1::ExpectDelivery Member(uint64_t transfer, int64_t round, int32_t size, int64_t bytes,
                          int32_t contributions = 1) {
  v1::ExpectDelivery expect;
  expect.set_transfer_id(transfer);
  expect.set_job_id(1);
  expect.set_server("ps");
  expect.set_version(round);
  expect.set_round_size(size);
  expect.set_contributions(contributions);
  expect.set_bytes(bytes);
  expect.set_dtype(v1::DTYPE_INT32);
  return expect;
}

std::vector<int32_t> Ints(size_t n, int32_t value) { return std::vector<int32_t>(n, value); }

const uint8_t* Bytes(const std::vector<int32_t>& v) {
  return reinterpret_cast<const uint8_t*>(v.data());
}

int32_t At(const SharedBuffer& buffer, size_t i) {
  int32_t value;
  std::memcpy(&value, buffer.data() + i * sizeof(int32_t), sizeof(value));
  return value;
}

TEST_CASE("RoundTable sums a round chunk by chunk and streams final chunks to watchers") {
  RoundTable table(/*rounds_kept=*/4, kChunk);
  RoundTable::Effects fx;
  CHECK(table.Lookup(kKey, 0, nullptr) == RoundTable::GetState::kNotYet);
  table.Join(Member(11, 0, 2, 32), true, &fx);  // 8 ints, 2 chunks
  CHECK(fx.changed);
  CHECK(fx.failed.empty());
  int64_t bytes = 0;
  CHECK(table.Lookup(kKey, 0, nullptr, &bytes) == RoundTable::GetState::kBegun);
  CHECK(bytes == 32);
  table.Join(Member(12, 0, 2, 32), true, &fx);
  CHECK(table.RoundOf(12) == std::make_pair(kKey, int64_t{0}));

  auto watch = table.AddWatcher(kKey, 0, /*stream=*/900);
  REQUIRE(watch.has_value());
  CHECK(watch->bytes == 32);
  CHECK(watch->chunks.size() == 2);
  CHECK(watch->ready.empty());

  const auto a = Ints(8, 3), b = Ints(8, 4);
  fx = {};
  table.Fold(11, Bytes(a), 0, 32, &fx);
  CHECK(fx.chunks.empty());
  table.Fold(12, Bytes(b) + 16, 16, 16, &fx);  // chunk 1 is final
  REQUIRE(fx.chunks.size() == 1);
  CHECK(fx.chunks[0].stream == 900);
  CHECK(fx.chunks[0].begin == 16);
  CHECK(fx.chunks[0].end == 32);
  CHECK(fx.complete.empty());
  CHECK(!fx.changed);  // a final chunk wakes no waiter under the lock (watchers stream it)
  // A late watcher is handed the final chunks at once.
  auto late = table.AddWatcher(kKey, 0, 901);
  REQUIRE(late.has_value());
  CHECK(late->ready == std::vector<std::pair<uint64_t, uint64_t>>{{16, 32}});
  table.RemoveWatcher(kKey, 0, 900);

  fx = {};
  table.Fold(12, Bytes(b), 0, 16, &fx);
  REQUIRE(fx.chunks.size() == 1);
  CHECK(fx.chunks[0].stream == 901);
  CHECK(fx.chunks[0].begin == 0);
  REQUIRE(fx.complete.size() == 1);
  CHECK(fx.complete[0] == std::make_pair(kKey, int64_t{0}));
  CHECK(fx.changed);  // AwaitSum waits for this
  for (size_t i = 0; i < 8; ++i) CHECK(At(*watch->sum, i) == 7);

  auto delivery = table.BeginDelivery(kKey, 0);
  REQUIRE(delivery.has_value());
  CHECK((delivery->id >> 63) == 1);
  CHECK(delivery->size == 2);
  CHECK(delivery->bytes == 32);
  CHECK(!table.BeginDelivery(kKey, 0).has_value());  // once
  CHECK(table.IsDelivery(delivery->id));
  auto acknowledged = table.Acknowledge(delivery->id);
  REQUIRE(acknowledged.has_value());
  CHECK(acknowledged->round == 0);
  CHECK(acknowledged->members == std::vector<uint64_t>{11, 12});
  CHECK(!table.Acknowledge(delivery->id).has_value());
}

TEST_CASE("RoundTable: a round shrinks to the members that pushed when one leaves") {
  RoundTable table(4, kChunk);
  RoundTable::Effects fx;
  // Round 3 of three members; two are announced and one has all its bytes in.
  table.Join(Member(21, 3, 3, 32), true, &fx);
  table.Join(Member(22, 3, 3, 32), true, &fx);
  auto watch = table.AddWatcher(kKey, 3, /*stream=*/700);
  REQUIRE(watch.has_value());
  const auto a = Ints(8, 5), b = Ints(8, 6);
  table.Fold(21, Bytes(a), 0, 32, &fx);
  table.Fold(22, Bytes(b), 0, 16, &fx);  // chunk 0 of the second member
  CHECK(fx.chunks.empty());
  // A size that is not lower, or a round not begun here: nothing changes.
  fx = {};
  table.Shrink(kKey, 3, 3, "no change", &fx);
  table.Shrink(kKey, 9, 1, "not begun", &fx);
  CHECK(fx.chunks.empty());
  CHECK(fx.failed.empty());
  CHECK(table.Lookup(kKey, 9, nullptr) == RoundTable::GetState::kNotYet);

  // The third leaves: chunk 0, which both announced members covered, is final now.
  table.Shrink(kKey, 3, 2, "worker 'w3' left the job", &fx);
  CHECK(fx.failed.empty());
  REQUIRE(fx.chunks.size() == 1);
  CHECK(fx.chunks[0].stream == 700);
  CHECK(fx.chunks[0].begin == 0);
  CHECK(fx.complete.empty());
  // A member announced after the shrink carries the new size; a third one
  // no longer fits.
  fx = {};
  table.Fold(22, Bytes(b) + 16, 16, 16, &fx);
  REQUIRE(fx.complete.size() == 1);
  for (size_t i = 0; i < 8; ++i) CHECK(At(*watch->sum, i) == 11);
  auto delivery = table.BeginDelivery(kKey, 3);
  REQUIRE(delivery.has_value());
  CHECK(delivery->size == 2);
  CHECK(delivery->members == std::vector<uint64_t>{21, 22});

  // Below the pushes already announced: the round fails, naming both.
  fx = {};
  table.Join(Member(31, 4, 3, 32), true, &fx);
  table.Join(Member(32, 4, 3, 32), true, &fx);
  table.Shrink(kKey, 4, 1, "two left", &fx);
  REQUIRE(fx.failed.size() == 2);
  CHECK(fx.failed[0].second.find("asked to close with 1 pushes (two left) but 2 were announced") !=
        std::string::npos);
  // Shrunk before its last member is announced: that member matches.
  fx = {};
  table.Join(Member(41, 5, 3, 32), true, &fx);
  table.Shrink(kKey, 5, 2, "one left", &fx);
  table.Join(Member(42, 5, 2, 32), true, &fx);
  CHECK(fx.failed.empty());
  table.Fold(41, Bytes(a), 0, 32, &fx);
  table.Fold(42, Bytes(b), 0, 32, &fx);
  REQUIRE(fx.complete.size() == 1);
  CHECK(fx.complete[0] == std::make_pair(kKey, int64_t{5}));
}

TEST_CASE("RoundTable fails the whole round on a mismatched member or one too many") {
  RoundTable table(4, kChunk);
  RoundTable::Effects fx;
  table.Join(Member(1, 5, 2, 32), true, &fx);
  table.Join(Member(2, 5, 2, 64), true, &fx);  // other size
  REQUIRE(fx.failed.size() == 2);
  CHECK(fx.failed[0].second.find("does not match round 5") != std::string::npos);
  std::string error;
  CHECK(table.Lookup(kKey, 5, &error) == RoundTable::GetState::kFailed);
  CHECK(error.find("does not match") != std::string::npos);
  CHECK(!table.AddWatcher(kKey, 5, 1).has_value());
  // A member that joins a failed round is failed at once.
  fx = {};
  table.Join(Member(3, 5, 2, 32), true, &fx);
  REQUIRE(fx.failed.size() == 1);
  CHECK(fx.failed[0].first == 3);

  fx = {};
  table.Join(Member(4, 6, 1, 32), true, &fx);
  table.Join(Member(5, 6, 1, 32), true, &fx);  // a round of one, sent two
  REQUIRE(fx.failed.size() == 2);
  CHECK(fx.failed[1].second.find("was sent 2 pushes for 1") != std::string::npos);

  fx = {};
  table.Join(Member(6, 7, 1, 32), /*server_connected=*/false, &fx);
  REQUIRE(fx.failed.size() == 1);
  CHECK(fx.failed[0].second.find("not connected") != std::string::npos);
}

TEST_CASE("RoundTable: bad packets, failures by member and by server, delivery refused") {
  RoundTable table(4, kChunk);
  RoundTable::Effects fx;
  table.Join(Member(1, 0, 1, 16), true, &fx);
  const auto a = Ints(4, 1);
  table.Fold(1, Bytes(a), 0, 8, &fx);
  fx = {};
  table.Fold(1, Bytes(a), 0, 8, &fx);  // the same bytes twice
  REQUIRE(fx.failed.size() == 1);
  CHECK(fx.failed[0].second.find("packet [0, +8) of push 1") != std::string::npos);
  CHECK(table.Failure(kKey, 0).find("packet [0, +8)") != std::string::npos);

  fx = {};
  table.Join(Member(2, 1, 1, 16), true, &fx);
  CHECK(table.FailMemberRound(2, "its sender died", &fx));
  REQUIRE(fx.failed.size() == 1);
  CHECK(fx.failed[0].second == "round 1 failed: push 2 of the round failed: its sender died");
  CHECK(!table.FailMemberRound(99, "x", &fx));

  fx = {};
  table.Join(Member(3, 2, 2, 16), true, &fx);
  table.FailServer(kKey, "server 'ps' disconnected", &fx);
  REQUIRE(fx.failed.size() == 1);
  CHECK(fx.failed[0].first == 3);

  // A complete round the application could not be handed fails; its ack is ignored.
  fx = {};
  table.Join(Member(4, 3, 1, 16), true, &fx);
  table.Fold(4, Bytes(a), 0, 16, &fx);
  REQUIRE(fx.complete.size() == 1);
  auto delivery = table.BeginDelivery(kKey, 3);
  REQUIRE(delivery.has_value());
  fx = {};
  table.DeliveryFailed(delivery->id, "cannot hand it over", &fx);
  REQUIRE(fx.failed.size() == 1);
  CHECK(fx.failed[0].first == 4);
  CHECK(!table.Acknowledge(delivery->id).has_value());

  // A round failed before any member was announced stays failed.
  fx = {};
  table.Fail(kKey, 9, "a member failed at the scheduler", &fx);
  table.Join(Member(5, 9, 1, 16), true, &fx);
  REQUIRE(fx.failed.size() == 1);
  CHECK(fx.failed[0].first == 5);
}

TEST_CASE("RoundTable keeps the newest rounds_kept rounds") {
  RoundTable table(/*rounds_kept=*/2, kChunk);
  RoundTable::Effects fx;
  table.Join(Member(1, 0, 2, 16), true, &fx);  // never completes
  table.Join(Member(2, 1, 1, 16), true, &fx);
  CHECK(fx.failed.empty());
  table.Join(Member(3, 2, 1, 16), true, &fx);  // round 0 goes, failed
  REQUIRE(fx.failed.size() == 1);
  CHECK(fx.failed[0].first == 1);
  CHECK(fx.failed[0].second == "round 0 failed: round 2 began");
  CHECK(!table.RoundOf(1).has_value());
  CHECK(table.rounds() == 2);
  CHECK(table.Lookup(kKey, 0, nullptr) == RoundTable::GetState::kGone);
  CHECK(table.Lookup(kKey, 1, nullptr) == RoundTable::GetState::kBegun);
  CHECK(table.Lookup(kKey, 3, nullptr) == RoundTable::GetState::kNotYet);
  CHECK(table.Lookup("1/other", 0, nullptr) == RoundTable::GetState::kNotYet);
}

TEST_CASE("RoundTable takes sums from a BufferPool, not zeroed, and gives evicted ones back") {
  BufferPool buffers;
  RoundTable table(/*rounds_kept=*/1, kChunk, &buffers);
  RoundTable::Effects fx;
  table.Join(Member(1, 0, 1, 16), true, &fx);
  const auto a = Ints(4, 7);
  table.Fold(1, Bytes(a), 0, 16, &fx);
  REQUIRE(fx.complete.size() == 1);
  const SharedBuffer* first = nullptr;
  {
    auto delivery = table.BeginDelivery(kKey, 0);
    REQUIRE(delivery.has_value());
    first = delivery->sum.get();
    CHECK(At(*delivery->sum, 3) == 7);
    REQUIRE(table.Acknowledge(delivery->id).has_value());
  }
  CHECK(buffers.pooled_bytes() == 0);
  // Round 1 evicts round 0, whose sum goes back to the pool and is taken
  // again at once for round 1 with its old bytes: the first contribution to
  // each packet overwrites them (aggregator::PacketPool).
  fx = {};
  table.Join(Member(2, 1, 1, 16), true, &fx);
  CHECK(fx.failed.empty());
  CHECK(buffers.pooled_bytes() == 0);
  auto watch = table.AddWatcher(kKey, 1, /*stream=*/900);
  REQUIRE(watch.has_value());
  CHECK(watch->sum.get() == first);
  for (size_t i = 0; i < 4; ++i) CHECK(At(*watch->sum, i) == 7);
  const auto b = Ints(4, -2);
  table.Fold(2, Bytes(b), 0, 16, &fx);
  for (size_t i = 0; i < 4; ++i) CHECK(At(*watch->sum, i) == -2);

  // A sum someone still holds (here the watch) is not recycled.
  table.RemoveWatcher(kKey, 1, 900);
  table.Join(Member(3, 2, 1, 16), true, &fx);
  CHECK(buffers.pooled_bytes() == 0);
  watch.reset();
}

}  // namespace
}  // namespace mlfabric::daemon
