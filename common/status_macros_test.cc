#include "common/status_macros.h"

#include <catch2/catch.hpp>

namespace mlfabric {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckEven(int x) {
  RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST_CASE("ASSIGN_OR_RETURN and RETURN_IF_ERROR propagate the first error") {
  CHECK(Quarter(8).value() == 2);
  CHECK(Quarter(6).status().message() == "odd");
  CHECK(CheckEven(4).ok());
  CHECK(CheckEven(3).code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mlfabric
