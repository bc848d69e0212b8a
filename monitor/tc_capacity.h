// Capacity of a shaped link from its htb class (docs/architecture.md §6: "tc class
// rates where a shaped link is present"). When a host NIC is shaped with
// htb, the class's ceil is the most the link can carry, so it replaces the
// configured capacity the estimator subtracts background traffic from.
//
//   auto ceil_bps = ParseHtbClassCeil(tc_output, "1:10");   // pure
//   TcClassCapacity tc("eth0", "1:10");
//   absl::StatusOr<double> bps = tc.Read();   // runs `tc class show dev eth0`
//
// Thread safety: ParseHtbClassCeil is pure; TcClassCapacity::Read may be
// called from one thread at a time.
#ifndef MLFABRIC_MONITOR_TC_CAPACITY_H_
#define MLFABRIC_MONITOR_TC_CAPACITY_H_

#include <string>

#include "absl/status/statusor.h"

namespace mlfabric::monitor {

// Parses a tc rate such as "50Mbit", "2500Mbit", "1Gbit", "800Kbit", "9600bit"
// or a byte rate "125Mbps" into bits per second.
absl::StatusOr<double> ParseTcRate(const std::string& text);

// Finds `class htb <classid> ... ceil <rate>` in `tc class show` output and
// returns the ceil (the rate when no ceil is printed) in bits per second.
absl::StatusOr<double> ParseHtbClassCeil(const std::string& tc_output, const std::string& classid);

class TcClassCapacity {
 public:
  TcClassCapacity(std::string interface, std::string classid)
      : interface_(std::move(interface)), classid_(std::move(classid)) {}
  // Runs `tc class show dev <interface>` and parses the class's ceil.
  absl::StatusOr<double> Read() const;

 private:
  std::string interface_;
  std::string classid_;
};

}  // namespace mlfabric::monitor

#endif  // MLFABRIC_MONITOR_TC_CAPACITY_H_
