// Running the `tc` command lines of tc_commands.h, and what both
// mlfabric-nicprio and mlfabricd need around them: whether this process
// may change a NIC (CAP_NET_ADMIN) and the NAME:PORT[,PORT...] job syntax.
//
//   if (absl::Status s = CheckNetAdmin("eth0"); !s.ok()) ...   // says why not
//   absl::StatusOr<NicJob> job = ParseNicJob("jobA:2222,2223");
//   absl::Status s = RunTc({"tc", "qdisc", "show", "dev", "eth0"});
//
// Thread safety: free functions, safe to call from any thread.
#ifndef MLFABRIC_DAEMON_NICPRIO_TC_RUNNER_H_
#define MLFABRIC_DAEMON_NICPRIO_TC_RUNNER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/nicprio/tc_commands.h"

namespace mlfabric::nicprio {

// Runs `command` (argv[0] looked up on PATH) and waits for it. Internal
// (with the command line and its exit status) if it could not start or
// did not exit 0; tc's own message goes to this process's stderr.
absl::Status RunTc(const TcCommand& command);

// Runs `commands` in order, stopping at the first failure.
absl::Status RunTcAll(const std::vector<TcCommand>& commands);

// OK if this process has CAP_NET_ADMIN in its effective set; else
// PermissionDenied saying why NIC priorities cannot go on `interface` and
// how to grant the capability.
absl::Status CheckNetAdmin(absl::string_view interface);

// "NAME:PORT[,PORT...]" (a job and its servers' TCP ports on this host);
// InvalidArgument naming the part that is wrong.
absl::StatusOr<NicJob> ParseNicJob(absl::string_view text);

// Jobs separated by ';': "jobA:2222;jobB:3333,3334". Empty text: none.
absl::StatusOr<std::vector<NicJob>> ParseNicJobs(absl::string_view text);

}  // namespace mlfabric::nicprio

#endif  // MLFABRIC_DAEMON_NICPRIO_TC_RUNNER_H_
