// An emulated network on one machine: one Linux network namespace per host,
// all joined by a bridge in a switch namespace, every host NIC shaped by htb
// in both directions. This is the only implementation of that layout: the
// C++ cluster launcher (launch/cluster.h) builds on it, and the Python
// testbed (eval/testbed/netns_cluster.py) drives it through the
// `mlfabric-netns` command (testing/netns_cli.cc).
//
// Layout for prefix P, hosts h_0..h_{n-1} and subnet A.B.C (a /24):
//
//   namespace P<h_i>:  lo, <ifname> (default veth0) at A.B.C.(2+i)/24
//                      uplink   = htb on <ifname>'s egress, class 1:10
//   namespace Psw:     bridge Pbr0, one port p-<h_i> per host
//                      downlink = htb on p-<h_i>'s egress, class 1:10
//   root namespace:    nothing, unless `root_link`: interface Pgw at A.B.C.1,
//                      bridged through port gw0, so processes here (a
//                      scheduler, a test) reach every host. Traffic between a
//                      host and A.B.C.1 goes through an unshaped class 1:20
//                      on both of the host's directions, so control traffic
//                      never queues behind shaped data.
//
// Class 1:10 has rate = ceil = the configured rate (a daemon can read it:
// --monitor_interface=veth0 --monitor_tc_class=1:10). A transfer from A to B
// is limited by min(A's uplink, B's downlink): a congestion-free core.
//
//   NetnsLayout layout;
//   layout.prefix = "mlft-";
//   layout.hosts = {"s1", "w1"};
//   RETURN_IF_ERROR(layout.Validate());
//   ASSIGN_OR_RETURN(auto network, NetnsNetwork::Create(layout, /*rate_bps=*/1e9));
//   RETURN_IF_ERROR(network->SetRate("w1", /*up_bps=*/50e6, std::nullopt));
//   auto argv = network->Wrap("w1", {"iperf3", "-c", layout.Address("s1")});
//   ASSIGN_OR_RETURN(auto bytes, network->ReadLinkBytes());   // bytes["w1"].up
//   // destruction kills what still runs inside and deletes the namespaces
//
// Needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN), `ip` and `tc`:
// CheckPrerequisites() and Create() return kFailedPrecondition naming what
// is missing (tests print it as "SKIPPED: <reason>", see prereq.h); a
// failure after the namespaces could be created is kInternal. Namespaces
// are named, so they outlive the process that made them (the CLI relies on
// that); CleanupPrefix() removes what a killed run left.
//
// Thread safety: NetnsLayout is a value. A NetnsNetwork's SetRate,
// ReadLinkBytes, Wrap and Exec may be called from any thread; Destroy is
// not concurrent with anything else.
#ifndef MLFABRIC_LAUNCH_NETNS_NETWORK_H_
#define MLFABRIC_LAUNCH_NETNS_NETWORK_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mlfabric::launch {

// Names and addresses of a network; pure, needs no privilege.
struct NetnsLayout {
  std::string prefix = "mlft-";      // namespace and interface name prefix, <= 12 chars
  std::vector<std::string> hosts;    // 1-250 names of 1-12 chars [A-Za-z0-9_-], not "sw"
  std::string subnet;                // "A.B.C" of the /24; empty: SubnetForPrefix(prefix)
  std::string ifname = "veth0";      // each host's interface
  bool root_link = false;            // connect the root namespace at A.B.C.1

  // kInvalidArgument naming the first problem. Fills nothing in.
  absl::Status Validate() const;

  // With `subnet` resolved (the default derived from the prefix).
  std::string Subnet() const;
  std::string HostNamespace(const std::string& host) const { return prefix + host; }
  std::string SwitchNamespace() const { return prefix + "sw"; }
  std::string Bridge() const { return prefix + "br0"; }
  // The host's end of its link on the switch (its downlink is shaped here).
  static std::string SwitchPort(const std::string& host) { return "p-" + host; }
  // The root namespace's interface and address (root_link only).
  std::string RootInterface() const { return prefix + "gw"; }
  std::string RootAddress() const { return Subnet() + ".1"; }
  // A.B.C.(2 + index); "" for an unknown host.
  std::string Address(const std::string& host) const;
  // Every namespace of this network, hosts first, the switch last.
  std::vector<std::string> Namespaces() const;
  bool HasHost(const std::string& host) const;
};

// "10.X.Y": X in 120..219 and Y from the CRC-32 of the prefix, so that
// clusters with different prefixes rarely share a subnet (eval's prefixes
// have always mapped this way).
std::string SubnetForPrefix(const std::string& prefix);

// What keeps namespaces from being used, or "" when nothing: the decision
// behind CheckPrerequisites, separate so it can be tested without root.
std::string NetnsPrerequisiteProblem(uid_t euid, const std::string& ip_path,
                                     const std::string& tc_path);

// Full path of a tool found on $PATH or in /usr/sbin, /sbin, /usr/bin,
// /bin; "" when absent.
std::string FindTool(const std::string& name);

struct LinkBytes {
  uint64_t up = 0;    // bytes the host sent (its switch port's rx)
  uint64_t down = 0;  // bytes delivered to it (its switch port's tx)
};

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed, -1 when it could not start
  std::string output;  // stdout and stderr, interleaved
};

// Runs argv[0] (searched on $PATH) to completion with stdin from /dev/null.
CommandResult RunCommand(const std::vector<std::string>& argv);

class NetnsNetwork {
 public:
  // OK when namespaces, veths and htb work here: checks root and the tools,
  // then builds and deletes a probe namespace named <prefix>probe<pid>.
  // kFailedPrecondition naming what is missing otherwise.
  static absl::Status CheckPrerequisites(const std::string& prefix);

  // Builds the network with every host's uplink and downlink at `rate_bps`
  // (the htb minimum of 8 kbit/s applies). The layout is validated first;
  // kAlreadyExists when one of its namespaces exists already (another run
  // with this prefix, or a killed one: CleanupPrefix). On failure nothing
  // it made is left behind. Owns the network: destruction deletes it.
  static absl::StatusOr<std::unique_ptr<NetnsNetwork>> Create(const NetnsLayout& layout,
                                                              double rate_bps);
  // Manages a network that Create() built earlier, maybe in another process
  // (the CLI); does not own it unless Adopt() is called.
  static absl::StatusOr<std::unique_ptr<NetnsNetwork>> Attach(const NetnsLayout& layout);

  ~NetnsNetwork();
  NetnsNetwork(const NetnsNetwork&) = delete;
  NetnsNetwork& operator=(const NetnsNetwork&) = delete;

  // Ownership: an owned network is destroyed with this object.
  void Release() { owned_ = false; }
  void Adopt() { owned_ = true; }

  // Kills every process left in the layout's namespaces (SIGKILL) and
  // deletes those that exist, which removes every veth and the bridge.
  // Idempotent.
  absl::Status Destroy();

  // Changes the host's uplink and/or downlink rate (rate = ceil).
  absl::Status SetRate(const std::string& host, std::optional<double> up_bps,
                       std::optional<double> down_bps);

  // Interface counters since creation, per host.
  absl::StatusOr<std::map<std::string, LinkBytes>> ReadLinkBytes() const;

  // argv that runs `argv` inside the host's namespace.
  std::vector<std::string> Wrap(const std::string& host,
                                const std::vector<std::string>& argv) const;
  // Runs `argv` inside the host's namespace to completion; kInternal with
  // its output when it exits non-zero.
  absl::StatusOr<std::string> Exec(const std::string& host,
                                   const std::vector<std::string>& argv) const;

  // Sends `signal` to every process inside the namespaces (e.g. daemonized
  // ones that escaped their launcher). Returns how many were signalled.
  int SignalAll(int signal) const;

  // Names of the existing namespaces that start with `prefix`.
  static std::vector<std::string> ListNamespaces(const std::string& prefix);
  // Kills what runs in, and deletes, every namespace named prefix*; returns
  // the names removed.
  static std::vector<std::string> CleanupPrefix(const std::string& prefix);

  const NetnsLayout& layout() const { return layout_; }

 private:
  NetnsNetwork() = default;
  absl::Status Build(double rate_bps);

  NetnsLayout layout_;
  std::string ip_, tc_;  // full paths
  bool owned_ = false;
};

}  // namespace mlfabric::launch

#endif  // MLFABRIC_LAUNCH_NETNS_NETWORK_H_
