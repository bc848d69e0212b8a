// A two-host testbed in network namespaces for data-plane experiments on a
// shaped link (issue 4): the server host s1 in one namespace, the worker
// host w1 in another, joined by a veth pair whose w1 end is shaped by an
// htb class (w1's uplink). Each namespace also has its own veth to the
// root namespace, where the scheduler runs, so control traffic (gRPC) never
// queues behind data on the shaped link:
//
//   root ns: mlfabric-scheduler (0.0.0.0), applications
//     veth <p>a 10.X.Y.1/30 <-> sctl 10.X.Y.2 in ns <p>s (mlfabricd s1)
//     veth <p>b 10.X.Y.5/30 <-> wctl 10.X.Y.6 in ns <p>w (mlfabricd w1)
//   data: sdata 10.213.0.1 (ns <p>s) <-> wdata 10.213.0.2 (ns <p>w),
//         htb class on wdata = w1's uplink
//
// Applications run in the root namespace: the daemons' local sockets are
// filesystem paths, reachable from any network namespace.
//
//   auto bed = NetnsTestbed::Create({.link_bps = 200e6});
//   if (!bed.ok()) { std::cout << "SKIPPED: " << bed.status().message(); return; }
//   RETURN_IF_ERROR((*bed)->StartCluster({"--planner=fifo"}, {"--log_level=debug"}, {}));
//   (*bed)->StartApp("server", {BinaryPath("testing/apps/dataplane_server"),
//                               "--socket=" + (*bed)->Socket("s1")});
//
// Needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN), `ip` and `tc`; Create() fails
// with kFailedPrecondition saying what is missing, which tests print as
// "SKIPPED: <reason>"; any later setup failure is an error (kInternal). Destruction stops every process it started and
// deletes both namespaces (which removes all the veths).
// Thread safety: none; drive from one thread.
#ifndef MLFABRIC_TESTING_NETNS_TESTBED_H_
#define MLFABRIC_TESTING_NETNS_TESTBED_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tools/launch/process.h"

namespace mlfabric::bench {

struct NetnsTestbedOptions {
  double link_bps = 200e6;  // htb rate (= ceil) of w1's end of the data link
};

class NetnsTestbed {
 public:
  static absl::StatusOr<std::unique_ptr<NetnsTestbed>> Create(const NetnsTestbedOptions& options);
  ~NetnsTestbed();

  // Starts the scheduler (root namespace, with an admin port) and the two
  // daemons in their namespaces, each told its data address on the link.
  absl::Status StartCluster(const std::vector<std::string>& scheduler_flags,
                            const std::vector<std::string>& daemon_flags,
                            const std::map<std::string, std::vector<std::string>>& host_flags);
  absl::StatusOr<launch::Subprocess*> StartApp(const std::string& name,
                                               const std::vector<std::string>& argv);

  const std::string& dir() const { return dir_; }
  std::string Socket(const std::string& host) const { return dir_ + "/" + host + ".sock"; }
  launch::Subprocess& daemon(const std::string& host) { return *daemons_.at(host); }
  int admin_port() const { return admin_port_; }
  double link_bps() const { return options_.link_bps; }

  // Bytes received so far on s1's end of the data link (from the s1
  // daemon's /proc/<pid>/net/dev, i.e. inside its namespace).
  absl::StatusOr<uint64_t> ServerRxBytes();
  // Runs a shell command inside a namespace ("s" or "w"); its output on error.
  absl::Status Exec(const std::string& ns, const std::string& command);

 private:
  NetnsTestbed() = default;
  std::string Namespace(const std::string& which) const { return prefix_ + which; }

  NetnsTestbedOptions options_;
  std::string prefix_;  // unique per process: namespaces <prefix>s, <prefix>w
  std::string root_subnet_;  // "10.X.Y." for the two root links
  std::string dir_;
  std::vector<std::string> namespaces_;  // created, to delete
  int admin_port_ = 0;
  std::unique_ptr<launch::Subprocess> scheduler_;
  std::map<std::string, std::unique_ptr<launch::Subprocess>> daemons_;
  std::vector<std::unique_ptr<launch::Subprocess>> apps_;
};

}  // namespace mlfabric::bench

#endif  // MLFABRIC_TESTING_NETNS_TESTBED_H_
