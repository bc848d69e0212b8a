// SplitModel (api/mlfabric.h): the byte ranges of a server group's shards.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "api/mlfabric.h"

namespace mlfabric {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

TEST_CASE("SplitModel: contiguous ranges of whole elements, as even as they can be") {
  CHECK(*SplitModel(12, 3) == Ranges{{0, 4}, {4, 8}, {8, 12}});
  // 5 floats in 2 shards: 2 and 3 elements.
  CHECK(*SplitModel(20, 2) == Ranges{{0, 8}, {8, 20}});
  CHECK(*SplitModel(16, 1) == Ranges{{0, 16}});
  CHECK(*SplitModel(24, 3, 8) == Ranges{{0, 8}, {8, 16}, {16, 24}});
  // Every element in some shard, every shard non-empty, in byte order.
  for (int count = 1; count <= 64; ++count) {
    auto ranges = SplitModel(4 * 1000, count);
    REQUIRE(ranges.ok());
    REQUIRE(static_cast<int>(ranges->size()) == count);
    int64_t at = 0;
    for (const auto& [begin, end] : *ranges) {
      CHECK(begin == at);
      CHECK(end > begin);
      CHECK((end - begin) % 4 == 0);
      CHECK(end - begin >= 4 * (1000 / count));
      CHECK(end - begin <= 4 * (1000 / count + 1));
      at = end;
    }
    CHECK(at == 4000);
  }
}

TEST_CASE("SplitModel: bad input is named") {
  auto message = [](const absl::StatusOr<Ranges>& r) { return std::string(r.status().message()); };
  CHECK_THAT(message(SplitModel(10, 2)), Catch::Contains("bytes: must be a positive multiple of 4"));
  CHECK_THAT(message(SplitModel(0, 1)), Catch::Contains("bytes:"));
  CHECK_THAT(message(SplitModel(8, 3)), Catch::Contains("count: must be in [1, min(64, 2 elements)]"));
  CHECK_THAT(message(SplitModel(4000, 65)), Catch::Contains("count:"));
  CHECK_THAT(message(SplitModel(4000, 0)), Catch::Contains("count:"));
  CHECK_THAT(message(SplitModel(16, 2, 0)), Catch::Contains("element_bytes: must be positive"));
}

}  // namespace
}  // namespace mlfabric
