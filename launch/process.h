// Starting and stopping processes on this machine, and the small helpers
// around it: a general process library for the user tools (mlfabric-run,
// the demo), the cluster launcher (launch/cluster.h) and the tests.
//
//   auto proc = Subprocess::Start({BinaryPath("daemon/mlfabricd"), "--host=w1"}, log_path);
//   proc->WaitFor(10.0);   // exit code, or nullopt if still running at the deadline
//
// A Subprocess stops its process (SIGTERM, then SIGKILL) when destroyed,
// unless it has exited, so a failed run leaves no orphans.
// Thread safety: none; drive each Subprocess from one thread. The free
// functions are safe from any thread.
#ifndef MLFABRIC_LAUNCH_PROCESS_H_
#define MLFABRIC_LAUNCH_PROCESS_H_

#include <sys/types.h>

#include <functional>
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

}  // namespace mlfabric::launch

#endif  // MLFABRIC_LAUNCH_PROCESS_H_
