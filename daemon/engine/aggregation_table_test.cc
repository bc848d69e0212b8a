#include "daemon/engine/aggregation_table.h"

#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

namespace mlfabric::daemon {
namespace {

constexpr uint32_t kGrid = 16;  // bytes: 4 floats a grid packet

v1::AggregateTask Task(uint64_t id, std::vector<uint64_t> constituents, int64_t bytes,
                       std::vector<double> weights = {}) {
  v1::AggregateTask task;
  task.set_aggregate_id(id);
  task.set_job_id(1);
  task.set_dst_host("s1");
  task.set_bytes(bytes);
  task.set_dtype(v1::DTYPE_FLOAT32);
  for (uint64_t c : constituents) task.add_constituents(c);
  for (double w : weights) task.add_weights(w);
  return task;
}

std::vector<float> Floats(size_t n, float value) { return std::vector<float>(n, value); }

const uint8_t* Bytes(const std::vector<float>& v) {
  return reinterpret_cast<const uint8_t*>(v.data());
}

float At(const SharedBuffer& buffer, size_t i) {
  float f;
  std::memcpy(&f, buffer.data() + i * sizeof(float), sizeof(float));
  return f;
}

TEST_CASE("AggregationTable sums constituents packet by packet, weighted") {
  AggregationTable table(kGrid);
  auto sum = table.Start(Task(100, {1, 2}, 32, {1.0, 0.5}));  // 8 floats, 2 grid packets
  REQUIRE(sum.ok());
  CHECK(table.Active(100));
  CHECK(table.AggregateOf(1) == 100u);
  CHECK(table.AggregateOf(2) == 100u);
  CHECK(!table.AggregateOf(3).has_value());
  CHECK(table.Bytes(100) == 32);

  const auto ones = Floats(8, 1.0f), twos = Floats(8, 2.0f);
  std::vector<uint32_t> ready;
  // Constituent 1 whole, constituent 2's second half: only packet 1 is final.
  REQUIRE(table.Fold(100, 1, Bytes(ones), 0, 32, &ready).ok());
  CHECK(ready.empty());
  REQUIRE(table.Fold(100, 2, Bytes(twos) + 16, 16, 16, &ready).ok());
  CHECK(ready == std::vector<uint32_t>{1});
  CHECK(table.ReadyPackets(100) == std::vector<uint32_t>{1});
  CHECK(table.FinishConstituent(1).kind == AggregationTable::Finish::kWaiting);
  ready.clear();
  REQUIRE(table.Fold(100, 2, Bytes(twos), 0, 16, &ready).ok());
  CHECK(ready == std::vector<uint32_t>{0});
  const AggregationTable::Finish finish = table.FinishConstituent(2);
  CHECK(finish.kind == AggregationTable::Finish::kComplete);
  CHECK(finish.aggregate == 100u);
  CHECK(finish.folded == 2);
  CHECK(finish.dst_host == "s1");
  CHECK(!table.Active(100));
  CHECK(table.active() == 0);
  // 1 * 1.0 + 0.5 * 2.0 in every element.
  for (size_t i = 0; i < 8; ++i) CHECK(At(**sum, i) == 2.0f);
}

TEST_CASE("AggregationTable refuses bad tasks with the reason") {
  AggregationTable table(kGrid);
  v1::AggregateTask ints = Task(1, {10}, 32);
  ints.set_dtype(v1::DTYPE_INT32);
  auto refused = table.Start(ints);
  REQUIRE(!refused.ok());
  CHECK(std::string(refused.status().message()).find("DTYPE_INT32") != std::string::npos);
  CHECK(table.Start(Task(2, {10}, 30)).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(table.Start(Task(3, {}, 32)).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(table.Start(Task(4, {10, 11}, 32)).ok());
  CHECK(table.Start(Task(4, {12}, 32)).status().code() == absl::StatusCode::kAlreadyExists);
  // A constituent belongs to one aggregate at a time.
  CHECK(table.Start(Task(5, {11}, 32)).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(table.active() == 1);
}

TEST_CASE("AggregationTable rejects bad packets and leaves the sum unchanged") {
  AggregationTable table(kGrid);
  auto sum = table.Start(Task(7, {1, 2}, 32));
  REQUIRE(sum.ok());
  const auto ones = Floats(8, 1.0f);
  std::vector<uint32_t> ready;
  REQUIRE(table.Fold(7, 1, Bytes(ones), 0, 16, &ready).ok());
  // The same bytes again, a range past the end, off element boundaries, a stranger.
  CHECK(table.Fold(7, 1, Bytes(ones), 0, 16, &ready).code() == absl::StatusCode::kAlreadyExists);
  CHECK(table.Fold(7, 1, Bytes(ones), 32, 16, &ready).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(table.Fold(7, 1, Bytes(ones), 2, 4, &ready).code() == absl::StatusCode::kInvalidArgument);
  CHECK(table.Fold(7, 99, Bytes(ones), 16, 16, &ready).code() == absl::StatusCode::kNotFound);
  CHECK(table.Fold(8, 1, Bytes(ones), 16, 16, &ready).code() == absl::StatusCode::kNotFound);
  CHECK(ready.empty());
  for (size_t i = 0; i < 4; ++i) CHECK(At(**sum, i) == 1.0f);
  for (size_t i = 4; i < 8; ++i) CHECK(At(**sum, i) == 0.0f);
}

TEST_CASE("AggregationTable::Remove returns the constituents still awaited") {
  AggregationTable table(kGrid);
  REQUIRE(table.Start(Task(9, {1, 2, 3}, 16)).ok());
  const auto ones = Floats(4, 1.0f);
  std::vector<uint32_t> ready;
  REQUIRE(table.Fold(9, 2, Bytes(ones), 0, 16, &ready).ok());
  CHECK(table.FinishConstituent(2).kind == AggregationTable::Finish::kWaiting);
  auto waited = table.Remove(9);
  REQUIRE(waited.has_value());
  CHECK(*waited == std::vector<uint64_t>{1, 3});
  CHECK(!table.Active(9));
  CHECK(!table.AggregateOf(1).has_value());
  CHECK(table.FinishConstituent(1).kind == AggregationTable::Finish::kNotMember);
  CHECK(!table.Remove(9).has_value());
  // The ids are free for a new aggregate.
  CHECK(table.Start(Task(9, {1}, 16)).ok());
}

}  // namespace
}  // namespace mlfabric::daemon
