// HostTable: the hosts whose daemons registered with this scheduler, and
// whether each is alive (its command stream is open).
//
// A host enters at its first registration and is never removed: a host
// that went down keeps its entry (its links, its last incarnation) until it
// registers again, so late calls of its old incarnation are recognised and
// refused. Whether a host is alive is the one fact the rest of the
// scheduler asks most: Alive() answers it, and only a live host is sent
// commands or planned for.
//
//   HostTable hosts;
//   HostState& w1 = hosts.Register("w1");   // the registration handler fills it
//   w1.alive = true;
//   if (const HostState* host = hosts.Alive("w1")) Send(host->data_address);
//   hosts.MarkDown("w1");                    // its stream ended
//
// Thread safety: none; owned by ClusterState, under the service's lock.
#ifndef MLFABRIC_SCHEDULER_SERVICE_HOST_TABLE_H_
#define MLFABRIC_SCHEDULER_SERVICE_HOST_TABLE_H_

#include <cstdint>
#include <map>
#include <string>

#include "common/map_util.h"

namespace mlfabric {

struct HostState {
  std::string data_address;
  double capacity_up_bps = 0;
  double capacity_down_bps = 0;
  double uplink_bps = 0;  // latest report, else the capacity
  double downlink_bps = 0;
  double last_report_s = -1;
  int64_t reports = 0;
  bool draining = false;
  uint64_t incarnation = 0;
  // Every call of this incarnation carries it (control_auth.h).
  std::string session_token;
  bool alive = false;
};

class HostTable {
 public:
  // The entry of host `name`, made if it is new; a host registering again
  // gets its old entry, for the handler to overwrite.
  HostState& Register(const std::string& name) { return hosts_[name]; }
  // Host `name`'s entry, alive or not; null if it never registered.
  HostState* Find(const std::string& name) { return FindOrNull(hosts_, name); }
  const HostState* Find(const std::string& name) const { return FindOrNull(hosts_, name); }
  // Host `name`'s entry if it is alive, else null.
  const HostState* Alive(const std::string& name) const;
  // Host `name` is down (again, perhaps: a host's stream can end after it
  // was marked down for registering anew). False if it never registered.
  bool MarkDown(const std::string& name);

  // Every host, by name, for views and planning.
  const std::map<std::string, HostState>& all() const { return hosts_; }

 private:
  std::map<std::string, HostState> hosts_;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_HOST_TABLE_H_
