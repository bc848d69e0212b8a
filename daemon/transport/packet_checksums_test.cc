#include "daemon/transport/packet_checksums.h"

#include <numeric>
#include <vector>

#include <boost/asio/thread_pool.hpp>
#include <catch2/catch.hpp>

#include "common/crc32c.h"

namespace mlfabric::transport {
namespace {

std::vector<v1::TensorInfo> Tensors(std::initializer_list<int64_t> sizes) {
  std::vector<v1::TensorInfo> out;
  for (int64_t s : sizes) {
    v1::TensorInfo t;
    t.set_bytes(s);
    out.push_back(t);
  }
  return out;
}

TEST_CASE("packets follow tensor boundaries and the payload size, clipped to the buffer") {
  std::vector<uint64_t> offsets;
  std::vector<uint32_t> lengths;
  PacketLayout(Tensors({100, 250}), 350, 128, &offsets, &lengths);
  CHECK(offsets == std::vector<uint64_t>{0, 100, 228});
  CHECK(lengths == std::vector<uint32_t>{100, 128, 122});
  offsets.clear();
  lengths.clear();
  PacketLayout({}, 300, 128, &offsets, &lengths);
  CHECK(offsets == std::vector<uint64_t>{0, 128, 256});
  offsets.clear();
  lengths.clear();
  PacketLayout(Tensors({500}), 200, 128, &offsets, &lengths);  // tensor larger than the buffer
  CHECK(lengths == std::vector<uint32_t>{128, 72});
}

TEST_CASE("every packet's checksum is found once summed, by several threads") {
  const size_t payload = 64;
  std::vector<uint8_t> data(payload * 5000 + 13);
  std::iota(data.begin(), data.end(), 0);
  auto sums = PacketChecksums::ForPush({}, data.size(), payload);
  CHECK(sums->packets() == 5001);
  CHECK(sums->Find(0, payload) == std::nullopt);  // nothing summed yet
  sums->SumAll(data.data());
  CHECK(sums->Ready() == sums->packets());
  for (uint64_t offset = 0; offset < data.size(); offset += payload) {
    const uint32_t length = static_cast<uint32_t>(std::min<uint64_t>(payload, data.size() - offset));
    const auto crc = sums->Find(offset, length);
    REQUIRE(crc.has_value());
    CHECK(*crc == Crc32c(data.data() + offset, length));
  }
  CHECK(sums->Find(1, payload) == std::nullopt);       // not a packet start
  CHECK(sums->Find(0, payload - 1) == std::nullopt);   // not that packet's length
}

TEST_CASE("a push's parts are summed by the caller and a fixed pool's threads") {
  const size_t payload = 64;
  std::vector<uint8_t> data(payload * PacketChecksums::kPacketsPerThread * 8);
  std::iota(data.begin(), data.end(), 7);
  boost::asio::thread_pool pool(2);
  for (int push = 0; push < 20; ++push) {  // more pushes than the pool has threads
    auto sums = PacketChecksums::ForPush({}, data.size(), payload);
    sums->SumAll(data.data(), &pool);
    REQUIRE(sums->Ready() == sums->packets());
    for (uint64_t offset = 0; offset < data.size(); offset += payload * 97) {
      CHECK(sums->Find(offset, payload) == Crc32c(data.data() + offset, payload));
    }
  }
  pool.join();
}

TEST_CASE("once sending starts, summing ahead stops") {
  std::vector<uint8_t> data(4096 * 100);
  auto sums = PacketChecksums::ForPush({}, data.size(), 4096);
  sums->MarkSending();
  sums->SumAll(data.data());
  CHECK(sums->Ready() == 0);
}

}  // namespace
}  // namespace mlfabric::transport
