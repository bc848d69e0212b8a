// Counter sources: where the monitor's NIC byte counters come from. The
// real one reads Linux sysfs (/sys/class/net/<if>/statistics/{rx,tx}_bytes);
// tests use a fake. This is the monitor's only file I/O.
//
//   SysfsCounterSource nic("eth0");            // or ("veth1", test_root)
//   absl::StatusOr<NicCounters> c = nic.Read();
//
// Thread safety: Read may be called from one thread at a time.
#ifndef MLFABRIC_MONITOR_SAMPLER_H_
#define MLFABRIC_MONITOR_SAMPLER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace mlfabric::monitor {

struct NicCounters {
  uint64_t rx_bytes = 0;
  uint64_t tx_bytes = 0;
};

class CounterSource {
 public:
  virtual ~CounterSource() = default;
  virtual absl::StatusOr<NicCounters> Read() = 0;
};

class SysfsCounterSource final : public CounterSource {
 public:
  explicit SysfsCounterSource(std::string interface, std::string root = "/sys/class/net");
  // NotFound naming the interface and path when it does not exist.
  absl::StatusOr<NicCounters> Read() override;

 private:
  std::string interface_;
  std::string root_;
};

}  // namespace mlfabric::monitor

#endif  // MLFABRIC_MONITOR_SAMPLER_H_
