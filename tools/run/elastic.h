// mlfabric-run's elastic mode (Horovod's `horovodrun --min-np/--max-np
// --host-discovery-script`): ranks start, stop and are replaced as a host
// discovery script's list of hosts changes (the decisions: elastic_plan.h).
//
// One mpirun cannot add or lose ranks, so every rank is a launch of its own:
//   this machine:  mlfabric-run --exec-rank --rank R --size S --local_rank L
//                      --local_size LS --hostname H -- COMMAND...   (a child)
//   another host:  mpirun -np 1 --host H -x MLFABRIC_... [--mpirun_arg...]
//                      mlfabric-run --exec-rank ... -- COMMAND...
// and every listed host has a daemon of its own, started when the host
// appears and stopped once it has vanished and its ranks are gone:
//   mlfabric-run --exec-daemon --dir D --scheduler A --hosts H   (a child
//   here, through `mpirun -np 1 --host H` elsewhere; tools/run/hosts.h).
// The scheduler was started by the caller (run_main.cc) with the job's
// config writing "member_loss": "shrink".
//
// The script runs at start and every discovery_interval_s; a failing or
// timed-out run, or bad output, is a warning naming the script (the last
// good host list stays). A rank's process is stopped with SIGTERM, then
// SIGKILL after stop_grace_s. The job ends with 0 when its ranks have
// exited 0 (elastic_plan.h: finishing), or with 1 when fewer than min_np
// ranks have run for longer than elastic_timeout_s.
//
// Thread safety: none; one per process, driven by RunElastic.
#ifndef MLFABRIC_TOOLS_RUN_ELASTIC_H_
#define MLFABRIC_TOOLS_RUN_ELASTIC_H_

#include <signal.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/run/elastic_plan.h"
#include "tools/run/hosts.h"

namespace mlfabric::run {

struct ElasticOptions {
  std::string script;  // the host discovery script (run as is, no arguments)
  ElasticLimits limits;
  double discovery_interval_s = 1.0;  // Horovod's default
  double discovery_timeout_s = 10.0;
  double elastic_timeout_s = 600.0;   // Horovod's default
  double stop_grace_s = 5.0;
  // How to start things: this binary, mpirun, the run's socket directory
  // and scheduler, the secret the daemons authenticate with.
  std::string self, mpirun_path, socket_dir, scheduler_address, cluster_secret;
  std::vector<std::string> mpirun_args, daemon_args;
  std::vector<std::string> forwarded_env;  // names mpirun passes on (-x)
  std::vector<std::string> command;        // what every rank runs
  bool verbose = false;
};

// Runs the script (no shell, stdin /dev/null, stderr inherited) and parses
// what it printed. An error names the script: it could not start, exited
// non-zero, ran past `timeout_s` (it is killed, with the processes it
// started: it runs in a process group of its own), or printed a bad line.
absl::StatusOr<std::vector<HostfileEntry>> RunDiscovery(const std::string& script,
                                                        double timeout_s);

// Runs the job from the hosts of the first discovery until it ends, or
// until *stop is set (a signal: everything is stopped, returns 128+signal).
// Stops every rank and daemon it started before returning the job's code.
int RunElastic(const ElasticOptions& options, const std::vector<HostfileEntry>& first_hosts,
               const volatile sig_atomic_t* stop);

}  // namespace mlfabric::run

#endif  // MLFABRIC_TOOLS_RUN_ELASTIC_H_
