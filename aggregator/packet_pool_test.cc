#include "aggregator/packet_pool.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

namespace mlfabric::aggregator {
namespace {

template <typename T>
absl::Span<const std::byte> Bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

// Contributor c's value for element e of tensor t: integer-valued.
float Value(ContributorId c, TensorId t, size_t e) {
  return static_cast<float>((c * 131 + t * 17 + e) % 1000) - 500.0f;
}

AggregationSpec TwoTensorSpec(std::vector<AggregationSpec::Contributor> contributors) {
  AggregationSpec spec;
  spec.dtype = DType::kFloat32;
  spec.packet_bytes = 64;  // 16 floats
  spec.tensors = {{0, 40 * sizeof(float)}, {5, 16 * sizeof(float)}};
  spec.contributors = std::move(contributors);
  return spec;
}

std::vector<float> Payload(ContributorId c, TensorId t, uint64_t offset_bytes,
                           size_t length_bytes) {
  std::vector<float> v(length_bytes / sizeof(float));
  for (size_t i = 0; i < v.size(); ++i) v[i] = Value(c, t, offset_bytes / 4 + i);
  return v;
}

TEST_CASE("Out-of-order arrival: each packet released exactly once with the exact sum") {
  const uint32_t seed = 99;
  INFO("seed=" << seed);
  PacketPool pool;
  REQUIRE(pool.RegisterTransfer(7, TwoTensorSpec({{1, 1.0}, {2, 1.0}, {3, 1.0}})).ok());
  struct Arrival {
    ContributorId c;
    TensorId t;
    uint64_t offset;
    size_t length;
  };
  std::vector<Arrival> arrivals;
  for (ContributorId c : {1, 2, 3}) {
    for (uint64_t off : {0, 64, 128}) arrivals.push_back({c, 0, off, off == 128 ? 32u : 64u});
    arrivals.push_back({c, 5, 0, 64});
  }
  std::shuffle(arrivals.begin(), arrivals.end(), std::mt19937(seed));
  std::map<std::pair<TensorId, uint64_t>, int> released;
  int completes = 0;
  for (size_t i = 0; i < arrivals.size(); ++i) {
    const Arrival& a = arrivals[i];
    std::vector<float> payload = Payload(a.c, a.t, a.offset, a.length);
    auto result = pool.Add({7, a.t, a.offset}, a.c, Bytes(payload));
    REQUIRE(result.ok());
    if (!result->has_value()) continue;
    const ReadyPacket& ready = **result;
    released[{a.t, a.offset}]++;
    completes += ready.transfer_complete();
    REQUIRE(ready.key().tensor_id == a.t);
    REQUIRE(ready.f32().size() == a.length / 4);
    REQUIRE(ready.bytes().size() == a.length);
    for (size_t e = 0; e < ready.f32().size(); ++e) {
      size_t element = a.offset / 4 + e;
      REQUIRE(ready.f32()[e] ==
              Value(1, a.t, element) + Value(2, a.t, element) + Value(3, a.t, element));
    }
  }
  CHECK(released.size() == 4);
  for (const auto& [key, count] : released) CHECK(count == 1);
  CHECK(completes == 1);
  CHECK(pool.partial_packets() == 0);
  CHECK(*pool.OutstandingPackets(7) == 0);
}

TEST_CASE("Weighted aggregation, float64") {
  PacketPool pool;
  AggregationSpec spec;
  spec.dtype = DType::kFloat64;
  spec.packet_bytes = 4 * sizeof(double);
  spec.tensors = {{0, 4 * sizeof(double)}};
  spec.contributors = {{10, 0.5}, {11, 2.0}, {12, -1.0}};
  REQUIRE(pool.RegisterTransfer(1, spec).ok());
  std::vector<double> a{2, 4, 6, 8}, b{1, 1, 1, 1}, c{3, 0, -3, 100};
  REQUIRE_FALSE(pool.Add({1, 0, 0}, 11, Bytes(b))->has_value());
  REQUIRE_FALSE(pool.Add({1, 0, 0}, 12, Bytes(c))->has_value());
  CHECK(pool.partial_packets() == 1);
  auto ready = pool.Add({1, 0, 0}, 10, Bytes(a));
  REQUIRE(ready.ok());
  REQUIRE(ready->has_value());
  CHECK((*ready)->dtype() == DType::kFloat64);
  CHECK(std::vector<double>((*ready)->f64().begin(), (*ready)->f64().end()) ==
        std::vector<double>{0, 4, 8, -94});
  CHECK((*ready)->f32().empty());
}

TEST_CASE("A single contributor releases immediately (scaled)") {
  PacketPool pool;
  REQUIRE(pool.RegisterTransfer(3, TwoTensorSpec({{4, 0.5}})).ok());
  std::vector<float> p(16, 6.0f);
  auto ready = pool.Add({3, 5, 0}, 4, Bytes(p));
  REQUIRE(ready.ok());
  REQUIRE(ready->has_value());
  for (float v : (*ready)->f32()) CHECK(v == 3.0f);
}

TEST_CASE("Duplicates, unknown keys and bad lengths are rejected without side effects") {
  PacketPool pool;
  REQUIRE(pool.RegisterTransfer(7, TwoTensorSpec({{1, 1.0}, {2, 1.0}})).ok());
  std::vector<float> full(16, 1.0f), tail(8, 1.0f), odd(15, 1.0f);

  REQUIRE(pool.Add({7, 0, 0}, 1, Bytes(full)).ok());
  auto dup = pool.Add({7, 0, 0}, 1, Bytes(full));
  CHECK(dup.status().code() == absl::StatusCode::kAlreadyExists);
  CHECK(dup.status().message().find("duplicate contribution from contributor 1") !=
        std::string::npos);

  auto unknown_transfer = pool.Add({8, 0, 0}, 1, Bytes(full));
  CHECK(unknown_transfer.status().code() == absl::StatusCode::kNotFound);
  CHECK(unknown_transfer.status().message().find("unknown transfer") != std::string::npos);
  auto unknown_tensor = pool.Add({7, 1, 0}, 1, Bytes(full));
  CHECK(unknown_tensor.status().message().find("unknown tensor") != std::string::npos);
  auto unknown_contributor = pool.Add({7, 0, 0}, 9, Bytes(full));
  CHECK(unknown_contributor.status().code() == absl::StatusCode::kNotFound);
  CHECK(unknown_contributor.status().message().find("contributor 9") != std::string::npos);
  auto bad_offset = pool.Add({7, 0, 32}, 1, Bytes(full));
  CHECK(bad_offset.status().code() == absl::StatusCode::kInvalidArgument);
  auto past_end = pool.Add({7, 0, 192}, 1, Bytes(full));
  CHECK(past_end.status().code() == absl::StatusCode::kInvalidArgument);
  auto short_packet = pool.Add({7, 0, 64}, 1, Bytes(odd));
  CHECK(short_packet.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(short_packet.status().message().find("length 60 bytes, expected 64") !=
        std::string::npos);
  auto long_tail = pool.Add({7, 0, 128}, 1, Bytes(full));
  CHECK(long_tail.status().message().find("expected 32") != std::string::npos);

  // None of the rejects changed the partial sum: completing gives 1 + 1.
  auto ready = pool.Add({7, 0, 0}, 2, Bytes(full));
  REQUIRE(ready.ok());
  REQUIRE(ready->has_value());
  for (float v : (*ready)->f32()) CHECK(v == 2.0f);
  // A late duplicate of a released packet is rejected, not re-aggregated.
  auto late = pool.Add({7, 0, 0}, 1, Bytes(full));
  CHECK(late.status().code() == absl::StatusCode::kAlreadyExists);
  CHECK(late.status().message().find("already aggregated and released") != std::string::npos);
  CHECK(pool.Add({7, 0, 128}, 1, Bytes(tail)).ok());
}

TEST_CASE("Misaligned payloads are summed correctly") {
  PacketPool pool;
  REQUIRE(pool.RegisterTransfer(1, TwoTensorSpec({{1, 1.0}, {2, 1.0}})).ok());
  std::vector<float> p(16, 3.0f);
  std::vector<std::byte> raw(16 * sizeof(float) + 1);
  std::memcpy(raw.data() + 1, p.data(), 16 * sizeof(float));
  absl::Span<const std::byte> misaligned(raw.data() + 1, 16 * sizeof(float));
  REQUIRE(pool.Add({1, 5, 0}, 1, misaligned).ok());
  auto ready = pool.Add({1, 5, 0}, 2, misaligned);
  REQUIRE(ready.ok());
  for (float v : (*ready)->f32()) CHECK(v == 6.0f);
}

TEST_CASE("Spec validation and unregistering") {
  PacketPool pool;
  AggregationSpec spec = TwoTensorSpec({{1, 1.0}});
  spec.packet_bytes = 6;
  CHECK(pool.RegisterTransfer(1, spec).code() == absl::StatusCode::kInvalidArgument);
  spec = TwoTensorSpec({});
  CHECK(pool.RegisterTransfer(1, spec).message().find("no contributors") != std::string::npos);
  spec = TwoTensorSpec({{1, 1.0}, {1, 2.0}});
  CHECK(pool.RegisterTransfer(1, spec).message().find("listed twice") != std::string::npos);
  spec = TwoTensorSpec({{1, 1.0}, {2, 1.0}});
  spec.tensors.push_back({0, 4});
  CHECK(pool.RegisterTransfer(1, spec).message().find("tensor 0 listed twice") !=
        std::string::npos);
  spec.tensors.back() = {9, 6};
  CHECK(pool.RegisterTransfer(1, spec).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(pool.RegisterTransfer(1, TwoTensorSpec({{1, 1.0}, {2, 1.0}})).ok());
  CHECK(pool.RegisterTransfer(1, TwoTensorSpec({{1, 1.0}})).code() ==
        absl::StatusCode::kAlreadyExists);
  CHECK(*pool.OutstandingPackets(1) == 4);
  std::vector<float> full(16, 1.0f);
  REQUIRE(pool.Add({1, 0, 0}, 1, Bytes(full)).ok());
  CHECK(pool.partial_packets() == 1);
  REQUIRE(pool.UnregisterTransfer(1).ok());
  CHECK(pool.partial_packets() == 0);
  CHECK(pool.UnregisterTransfer(1).code() == absl::StatusCode::kNotFound);
  CHECK(pool.Add({1, 0, 0}, 2, Bytes(full)).status().code() == absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mlfabric::aggregator
