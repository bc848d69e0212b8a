// RoundMismatch (round_tracker.h), pure: which pushes a synchronous round
// takes and the "mismatch: ..." reason of those it refuses. Through the
// service's handlers: scheduler_service_test ("tensor shapes"); across
// real processes: tests/sync_round_test and tests/allreduce_check.
#include "scheduler/service/round_tracker.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace mlfabric {
namespace {

UpdateRecord Push(uint64_t id, const std::string& worker, int64_t bytes, v1::DType dtype,
                  std::optional<std::vector<int64_t>> shape) {
  UpdateRecord record;
  record.transfer_id = id;
  record.worker = worker;
  record.bytes = bytes;
  record.dtype = dtype;
  record.shape = std::move(shape);
  return record;
}

// The round after `first` was admitted (as AdmitToRound records it).
RoundState After(const UpdateRecord& first) {
  RoundState round;
  round.bytes = first.bytes;
  round.dtype = first.dtype;
  round.workers.insert(first.worker);
  if (first.shape.has_value()) {
    round.shape = first.shape;
    round.shape_worker = first.worker;
  }
  return round;
}

TEST_CASE("RoundMismatch: equal bytes in different shapes fail naming both and both workers") {
  const UpdateRecord first = Push(11, "rank0", 17 * 1311 * 4, v1::DTYPE_FLOAT32,
                                  std::vector<int64_t>{17, 1311});
  const UpdateRecord second = Push(12, "rank1", 17 * 1311 * 4, v1::DTYPE_FLOAT32,
                                   std::vector<int64_t>{17, 23, 57});
  CHECK(RoundMismatch(RoundState{}, first, 4).empty());
  CHECK(RoundMismatch(After(first), second, 4) ==
        "mismatch: push 12 from 'rank1' has shape [17, 23, 57] but round 4 sums shape "
        "[17, 1311] from 'rank0' (every rank must pass the same shape and type)");
}

TEST_CASE("RoundMismatch: equal shapes agree; a scalar's shape differs from [1]") {
  const UpdateRecord first = Push(1, "rank0", 48, v1::DTYPE_FLOAT32, std::vector<int64_t>{2, 6});
  CHECK(RoundMismatch(After(first), Push(2, "rank1", 48, v1::DTYPE_FLOAT32,
                                         std::vector<int64_t>{2, 6}),
                      0)
            .empty());
  const UpdateRecord scalar = Push(3, "rank0", 4, v1::DTYPE_FLOAT32, std::vector<int64_t>{});
  const std::string reason =
      RoundMismatch(After(scalar), Push(4, "rank1", 4, v1::DTYPE_FLOAT32, std::vector<int64_t>{1}),
                    7);
  CHECK(reason.find("has shape [1] but round 7 sums shape [] from 'rank0'") != std::string::npos);
}

TEST_CASE("RoundMismatch: a push or a round without a shape agrees with any shape") {
  const UpdateRecord named = Push(1, "rank0", 48, v1::DTYPE_FLOAT32, std::vector<int64_t>{2, 6});
  const UpdateRecord unnamed = Push(2, "rank1", 48, v1::DTYPE_FLOAT32, std::nullopt);
  CHECK(RoundMismatch(After(named), unnamed, 0).empty());
  CHECK(RoundMismatch(After(unnamed), named, 0).empty());
  // After a push without a shape, the round's shape is the first named one's.
  RoundState round = After(unnamed);
  round.shape = named.shape;
  round.shape_worker = named.worker;
  const std::string reason = RoundMismatch(
      round, Push(3, "rank2", 48, v1::DTYPE_FLOAT32, std::vector<int64_t>{12}), 0);
  CHECK(reason.find("push 3 from 'rank2' has shape [12] but round 0 sums shape [2, 6] from "
                    "'rank0'") != std::string::npos);
}

TEST_CASE("RoundMismatch: bytes and dtype are compared before shapes; opaque bytes never sum") {
  const UpdateRecord first = Push(1, "rank0", 48, v1::DTYPE_FLOAT32, std::vector<int64_t>{12});
  CHECK(RoundMismatch(After(first), Push(2, "rank1", 40, v1::DTYPE_FLOAT32,
                                         std::vector<int64_t>{10}),
                      3) ==
        "mismatch: push 2 from 'rank1' has 40 bytes of float32 but round 3 sums 48 bytes of "
        "float32 (every rank must pass the same shape and type)");
  CHECK(RoundMismatch(After(first), Push(2, "rank1", 48, v1::DTYPE_INT32,
                                         std::vector<int64_t>{12}),
                      3)
            .find("48 bytes of int32 but round 3 sums 48 bytes of float32") != std::string::npos);
  CHECK(RoundMismatch(After(first), Push(2, "rank1", 1, v1::DTYPE_OPAQUE, std::nullopt), 3)
            .find("push 2 from 'rank1' is opaque bytes") != std::string::npos);
}

}  // namespace
}  // namespace mlfabric
