// The cluster launcher: a scheduler and one mlfabricd per emulated host on
// this machine, for the cross-process tests, the benchmarks, the demo and
// mlfabric-run. Two topologies:
//
//   kLoopback  every host is 127.0.0.1; needs nothing. Rates are whatever
//              the daemons' own pacing enforces (--uplink_bps ...).
//   kNetns     every host in its own network namespace with its own
//              address, htb-shaped uplink and downlink that can be changed
//              while it runs, and byte counters per link (the layout of
//              netns_network.h, with the root namespace linked in). The
//              scheduler runs in the root namespace, reachable by every
//              daemon at the root address, and control traffic has its own
//              unshaped class. Needs root, `ip` and `tc`.
//
// Both keep every file in a private directory under /tmp ("{dir}" in a
// flag becomes it), give each daemon its own Unix socket there (a
// filesystem path, so applications in any namespace reach it), and stop
// everything they started (SIGTERM, then SIGKILL) and delete the
// namespaces and the directory when destroyed, so a failed run leaves no
// orphans.
//
//   auto cluster = Cluster::StartLoopback({"s1", "w1"}, {"--planner=fifo"});
//   (*cluster)->StartApp("server", {BinaryPath("testing/apps/sum_server"),
//                                   "--socket=" + (*cluster)->Socket("s1")});
//
//   ClusterOptions options;                    // two hosts, w1's uplink at 200 Mbit/s
//   options.topology = Topology::kNetns;
//   options.hosts = {"s1", "w1"};
//   options.rates["w1"] = {200e6, 10e9};
//   options.admin = true;
//   auto cluster = Cluster::Create(options);   // kFailedPrecondition: print SKIPPED
//   RETURN_IF_ERROR((*cluster)->Start({"--planner=fifo"}, {"--log_level=debug"}));
//   (*cluster)->ReadLinkBytes();               // {"s1": {up, down}, "w1": ...}
//
// Create() fails with kFailedPrecondition, naming what is missing, only
// when namespaces cannot be used here (tests print "SKIPPED: <reason>" via
// testing/prereq.h); any later failure is an error.
// Thread safety: none; drive from one thread.
#ifndef MLFABRIC_LAUNCH_CLUSTER_H_
#define MLFABRIC_LAUNCH_CLUSTER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "launch/netns_network.h"
#include "launch/process.h"

namespace mlfabric::launch {

enum class Topology { kLoopback, kNetns };

struct LinkRate {
  double up_bps = 10e9;
  double down_bps = 10e9;
};

struct ClusterOptions {
  Topology topology = Topology::kLoopback;
  std::vector<std::string> hosts;
  // Start the scheduler's admin endpoint (on 127.0.0.1, a free port:
  // admin_port()).
  bool admin = false;
  // Hosts authenticate to the scheduler with a cluster secret made for
  // this cluster (<dir>/cluster.secret, mode 0600). false: they do not (a
  // test that reports for a host it is not).
  bool cluster_secret = true;

  // kNetns only.
  // Namespace prefix; empty: unique per process and cluster.
  std::string prefix;
  // "A.B.C" of the hosts' /24; empty: derived from the prefix.
  std::string subnet;
  // Every host's initial rates, and per-host exceptions.
  LinkRate rate;
  std::map<std::string, LinkRate> rates;
};

class Cluster {
 public:
  // Prepares the cluster: its directory and, for kNetns, the network. No
  // process runs yet (write config files into dir() now, then Start()).
  static absl::StatusOr<std::unique_ptr<Cluster>> Create(const ClusterOptions& options);

  // Create() on loopback, then Start(), in one call.
  static absl::StatusOr<std::unique_ptr<Cluster>> StartLoopback(
      const std::vector<std::string>& hosts, const std::vector<std::string>& scheduler_flags = {},
      const std::vector<std::string>& daemon_flags = {},
      const std::map<std::string, std::vector<std::string>>& host_flags = {},
      bool cluster_secret = true);

  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // No job ships by default: when `scheduler_flags` give no --config, the
  // scheduler gets one with job "demo", whose token is $MLFABRIC_JOB_TOKEN
  // if set (the tests set one in .bazelrc), else a random one,
  // which is then exported as MLFABRIC_JOB_TOKEN for the applications
  // (api/mlfabric.h reads it) started here and in this process.
  //
  // Starts mlfabric-scheduler (its flags appended) and one mlfabricd per
  // host (`daemon_flags` to every daemon, `host_flags[host]` to that host's
  // only), and waits until each serves. Each daemon gets --host,
  // --scheduler and --local_socket; on kNetns also --listen_address (its
  // namespace address), and runs inside its namespace. Call once.
  absl::Status Start(const std::vector<std::string>& scheduler_flags = {},
                     const std::vector<std::string>& daemon_flags = {},
                     const std::map<std::string, std::vector<std::string>>& host_flags = {});

  Topology topology() const { return topology_; }
  const std::vector<std::string>& hosts() const { return hosts_; }
  const std::string& dir() const { return dir_; }
  // Where daemons (and this process) reach the scheduler's gRPC port.
  std::string scheduler_address() const;
  // Kills the scheduler (SIGKILL: a crash) and starts a new one with the
  // same flags on the same port (its log appended to the same file); the
  // daemons find it again as they re-register. Returns once it serves.
  absl::Status RestartScheduler();
  // Kills `host`'s daemon (SIGKILL: a crash) and waits until it is gone.
  absl::Status KillDaemon(const std::string& host);
  // Starts `host`'s daemon again with the flags it was first started with
  // (its log appended to the same file; killed first if still running):
  // a fresh process with no state, which registers with the scheduler
  // anew. Returns once it serves.
  absl::Status RestartDaemon(const std::string& host);
  // 0 unless ClusterOptions::admin.
  int admin_port() const { return admin_port_; }
  std::string Socket(const std::string& host) const { return dir_ + "/" + host + ".sock"; }
  // The host's address: 127.0.0.1 (loopback) or its namespace address.
  std::string HostAddress(const std::string& host) const;
  launch::Subprocess& scheduler() { return *scheduler_; }
  launch::Subprocess& daemon(const std::string& host) { return *daemons_.at(host); }

  // Starts an application binary here (the root namespace); its log is
  // <dir>/<name>.log, or this process's stdout when `inherit_output`.
  absl::StatusOr<launch::Subprocess*> StartApp(const std::string& name,
                                               const std::vector<std::string>& argv,
                                               bool inherit_output = false);
  // The same inside `host`'s namespace (kNetns), so it sends from the
  // host's address; on loopback the same as StartApp.
  absl::StatusOr<launch::Subprocess*> StartAppInHost(const std::string& host,
                                                     const std::string& name,
                                                     const std::vector<std::string>& argv);

  // kNetns only (kFailedPrecondition on loopback): see NetnsNetwork.
  absl::Status SetRate(const std::string& host, std::optional<double> up_bps,
                       std::optional<double> down_bps);
  absl::StatusOr<std::map<std::string, LinkBytes>> ReadLinkBytes() const;
  absl::StatusOr<std::string> Exec(const std::string& host,
                                   const std::vector<std::string>& argv) const;
  // The network (kNetns), else nullptr.
  const NetnsNetwork* network() const { return network_.get(); }

 private:
  Cluster() = default;
  absl::Status RequireNetns() const;
  // Start: `host`'s daemon, with the cluster secret's flags, then every
  // daemon's flags and then the host's own.
  absl::Status StartDaemon(const std::string& host, const std::vector<std::string>& secret_flags,
                           const std::vector<std::string>& daemon_flags,
                           const std::map<std::string, std::vector<std::string>>& host_flags);
  // Waits until `host`'s daemon logs "serving" after byte `log_from` of its log.
  absl::Status WaitForDaemon(const std::string& host, size_t log_from);
  std::string SubstituteDir(std::string flag) const;

  Topology topology_ = Topology::kLoopback;
  std::vector<std::string> hosts_;
  bool admin_ = false;
  bool cluster_secret_ = true;
  std::string dir_;
  int port_ = 0;
  int admin_port_ = 0;
  std::unique_ptr<NetnsNetwork> network_;  // destroyed after every process
  std::unique_ptr<launch::Subprocess> scheduler_;
  std::vector<std::string> scheduler_argv_;  // as started, for RestartScheduler
  std::map<std::string, std::unique_ptr<launch::Subprocess>> daemons_;
  std::map<std::string, std::vector<std::string>> daemon_argv_;  // for RestartDaemon
  std::vector<std::unique_ptr<launch::Subprocess>> apps_;
};

}  // namespace mlfabric::launch

#endif  // MLFABRIC_LAUNCH_CLUSTER_H_
