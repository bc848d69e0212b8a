#include "monitor/tc_capacity.h"

#include <catch2/catch.hpp>

namespace mlfabric::monitor {
namespace {

// Captured from `tc class show dev v0` on this kind of machine.
constexpr char kTcOutput[] =
    "class htb 1:10 root prio 0 rate 50Mbit ceil 80Mbit burst 1600b cburst 1600b \n"
    "class htb 1:20 root prio 0 rate 2500Mbit ceil 2500Mbit burst 1250b cburst 1250b \n"
    "class htb 1:30 parent 1:1 prio 2 rate 1Gbit burst 1375b cburst 1375b \n";

TEST_CASE("tc rates parse in bits and bytes per second") {
  CHECK(ParseTcRate("50Mbit").value() == Approx(50e6));
  CHECK(ParseTcRate("2500Mbit").value() == Approx(2.5e9));
  CHECK(ParseTcRate("1Gbit").value() == Approx(1e9));
  CHECK(ParseTcRate("800Kbit").value() == Approx(8e5));
  CHECK(ParseTcRate("9600bit").value() == Approx(9600));
  CHECK(ParseTcRate("125Mbps").value() == Approx(1e9));
  CHECK_FALSE(ParseTcRate("fast").ok());
  CHECK_FALSE(ParseTcRate("10Mfoo").ok());
}

TEST_CASE("The class ceil is the shaped capacity") {
  CHECK(ParseHtbClassCeil(kTcOutput, "1:10").value() == Approx(80e6));
  CHECK(ParseHtbClassCeil(kTcOutput, "1:20").value() == Approx(2.5e9));
  // No ceil printed: the rate.
  CHECK(ParseHtbClassCeil(kTcOutput, "1:30").value() == Approx(1e9));
  auto missing = ParseHtbClassCeil(kTcOutput, "1:99");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("1:99") != std::string::npos);
}

TEST_CASE("A bad interface name is refused before running tc") {
  TcClassCapacity tc("eth0; rm -rf /", "1:10");
  CHECK(tc.Read().status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mlfabric::monitor
