#include "monitor/sampler.h"

#include <fstream>

#include "absl/strings/str_cat.h"

namespace mlfabric::monitor {
namespace {

absl::StatusOr<uint64_t> ReadCounter(const std::string& path, const std::string& interface) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("monitor_interface '", interface,
                                            "': cannot read ", path,
                                            " (no such network interface?)"));
  }
  uint64_t value = 0;
  if (!(in >> value)) {
    return absl::DataLossError(absl::StrCat("cannot parse a counter in ", path));
  }
  return value;
}

}  // namespace

SysfsCounterSource::SysfsCounterSource(std::string interface, std::string root)
    : interface_(std::move(interface)), root_(std::move(root)) {}

absl::StatusOr<NicCounters> SysfsCounterSource::Read() {
  const std::string dir = absl::StrCat(root_, "/", interface_, "/statistics/");
  NicCounters counters;
  auto rx = ReadCounter(dir + "rx_bytes", interface_);
  if (!rx.ok()) return rx.status();
  auto tx = ReadCounter(dir + "tx_bytes", interface_);
  if (!tx.ok()) return tx.status();
  counters.rx_bytes = *rx;
  counters.tx_bytes = *tx;
  return counters;
}

}  // namespace mlfabric::monitor
