// Launching MLfabric's processes on this machine: the demo, the
// cross-process tests and the launchers use it.
//
//   auto proc = Subprocess::Start({BinaryPath("daemon/mlfabricd"), "--host=w1"}, log_path);
//   proc->WaitFor(10.0);   // exit code, or nullopt if still running at the deadline
//
// LocalCluster starts a scheduler and one daemon per emulated host on
// loopback in a private directory under /tmp, and stops everything it
// started (SIGTERM, then SIGKILL) when destroyed, so a failed run leaves no
// orphans.
// Thread safety: none; drive from one thread.
#ifndef MLFABRIC_TOOLS_LAUNCH_PROCESS_H_
#define MLFABRIC_TOOLS_LAUNCH_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mlfabric::launch {

// Path of a binary built in this workspace: from the runfiles of the running
// test or `bazel run` target, else from bazel-bin/.
std::string BinaryPath(const std::string& workspace_relative);

// A private directory under $TEST_TMPDIR (or /tmp).
std::string MakeTempDir(const std::string& prefix);

std::string ReadFile(const std::string& path);

// Polls `condition` every 20 ms until it holds or `timeout_s` passes.
bool WaitUntil(const std::function<bool()>& condition, double timeout_s);

class Subprocess {
 public:
  // Starts argv[0] with stdout and stderr appended to `log_path` (inherited
  // from this process when `log_path` is empty).
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv,
                                                           const std::string& log_path);
  ~Subprocess();

  pid_t pid() const { return pid_; }
  bool Running();
  // The exit code (128+signal when killed), or nullopt if still running.
  std::optional<int> WaitFor(double timeout_s);
  void Signal(int signal);
  // SIGTERM, then SIGKILL after `grace_s`; returns the exit code.
  int Stop(double grace_s = 5.0);
  const std::string& log_path() const { return log_path_; }
  std::string Log() const { return ReadFile(log_path_); }

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::string log_path_;
};

class LocalCluster {
 public:
  // Starts mlfabric-scheduler (extra flags appended; "{dir}" in a flag
  // becomes the cluster's directory) and one mlfabricd per host, each on
  // loopback with its own Unix socket. `daemon_flags` go to
  // every daemon, `host_flags[host]` to that host's only.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(
      const std::vector<std::string>& hosts, const std::vector<std::string>& scheduler_flags = {},
      const std::vector<std::string>& daemon_flags = {},
      const std::map<std::string, std::vector<std::string>>& host_flags = {});
  ~LocalCluster();

  const std::string& dir() const { return dir_; }
  std::string scheduler_address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string Socket(const std::string& host) const { return dir_ + "/" + host + ".sock"; }
  Subprocess& scheduler() { return *scheduler_; }
  Subprocess& daemon(const std::string& host) { return *daemons_.at(host); }

  // Starts an application binary; its log is <dir>/<name>.log, or this
  // process's stdout when `inherit_output`.
  absl::StatusOr<Subprocess*> StartApp(const std::string& name,
                                       const std::vector<std::string>& argv,
                                       bool inherit_output = false);

 private:
  std::string dir_;
  int port_ = 0;
  std::unique_ptr<Subprocess> scheduler_;
  std::map<std::string, std::unique_ptr<Subprocess>> daemons_;
  std::vector<std::unique_ptr<Subprocess>> apps_;
};

}  // namespace mlfabric::launch

#endif  // MLFABRIC_TOOLS_LAUNCH_PROCESS_H_
