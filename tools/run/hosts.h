// mlfabric-run across the hosts of an Open MPI hostfile (docs/architecture.md §9):
// which hosts a hostfile names, which of them is this machine, and the
// per-host daemon launcher that mlfabric-run starts on every host through
// mpirun itself (no ssh of its own):
//
//   mpirun --hostfile F --map-by ppr:1:node -np <hosts>
//       mlfabric-run --exec-daemon --dir D --scheduler A:P --hosts h1,h2,...
//
// Each launcher finds its own entry among the hosts (an address of one of
// its interfaces, or its host name), starts `mlfabricd --host=<entry>
// --listen_address=<its address> --local_socket=D/<entry>.sock` with the
// run's cluster secret (from $MLFABRIC_CLUSTER_SECRET, written to a 0600
// file beside the socket), and stops it -- and removes what it wrote --
// when mpirun signals it (SIGTERM/SIGINT/SIGHUP) or the daemon exits. Each
// rank then finds its daemon as D/<entry of its host>.sock.
#ifndef MLFABRIC_TOOLS_RUN_HOSTS_H_
#define MLFABRIC_TOOLS_RUN_HOSTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mlfabric::run {

struct HostfileEntry {
  std::string host;
  int slots = 1;
};

// Open MPI's hostfile syntax: one host per line, optional "slots=N" (and
// other key=value words, ignored), '#' comments, blank lines. A host named
// twice is an error (Open MPI would merge them; a daemon per host cannot).
absl::StatusOr<std::vector<HostfileEntry>> ParseHostfile(const std::string& text);

// This machine's interface addresses (IPv4 and IPv6, as text) and its host
// names (short and as gethostname reports it).
std::vector<std::string> LocalNames();

// The index of the first of `hosts` that is in `local` (an address or a
// name), or whose name resolves to an address in `local`; -1 if none.
int FindLocalHost(const std::vector<std::string>& hosts, const std::vector<std::string>& local);

// An IPv4 address for `host` (itself when it is one), "" if it does not
// resolve.
std::string ResolveIpv4(const std::string& host);

// This machine's address on its route to `host` (what the host sees
// connections from), "" if there is none.
std::string RouteSource(const std::string& host);

// mlfabric-run --exec-daemon ARGS: the per-host launcher above; returns the
// process's exit code.
int RunHostDaemon(int argc, char** argv, int first);

}  // namespace mlfabric::run

#endif  // MLFABRIC_TOOLS_RUN_HOSTS_H_
