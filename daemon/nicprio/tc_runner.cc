#include "daemon/nicprio/tc_runner.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace mlfabric::nicprio {
namespace {

constexpr int kCapNetAdmin = 12;  // linux/capability.h

}  // namespace

absl::Status RunTc(const TcCommand& command) {
  if (command.empty()) return absl::InvalidArgumentError("empty command");
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // posix_spawn, not fork: the daemon is large and many-threaded, and the
  // child only execs.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);  // tc must not inherit blocked stop signals
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, argv[0], nullptr, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  if (spawned != 0) {
    return absl::InternalError(
        absl::StrCat("cannot run '", FormatCommand(command), "': ", std::strerror(spawned)));
  }
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("waiting for '", FormatCommand(command), "': ", std::strerror(errno)));
    }
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return absl::InternalError(absl::StrCat("'", FormatCommand(command), "' failed (",
                                            WIFEXITED(wstatus) ? "exit status " : "signal ",
                                            WIFEXITED(wstatus) ? WEXITSTATUS(wstatus)
                                                               : WTERMSIG(wstatus),
                                            ")"));
  }
  return absl::OkStatus();
}

absl::Status RunTcAll(const std::vector<TcCommand>& commands) {
  for (const TcCommand& c : commands) {
    if (absl::Status s = RunTc(c); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckNetAdmin(absl::string_view interface) {
  std::ifstream status("/proc/self/status");
  std::string line;
  std::string why = "no CapEff line in /proc/self/status";
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, "CapEff:")) continue;
    uint64_t caps = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line.substr(7)), &caps)) {
      why = absl::StrCat("cannot parse '", line, "'");
      break;
    }
    if ((caps >> kCapNetAdmin) & 1) return absl::OkStatus();
    why = "CAP_NET_ADMIN is not in this process's effective capability set";
    break;
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "cannot install NIC priorities on ", interface, ": ", why,
      ". tc needs CAP_NET_ADMIN (run as root, or grant it with `setcap cap_net_admin+ep`)"));
}

absl::StatusOr<NicJob> ParseNicJob(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, absl::MaxSplits(':', 1));
  if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "': expected NAME:PORT[,PORT...]"));
  }
  NicJob job{std::string(parts[0]), {}};
  for (absl::string_view p : absl::StrSplit(parts[1], ',')) {
    uint32_t port = 0;
    if (!absl::SimpleAtoi(p, &port) || port == 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", text, "': '", p, "' is not a TCP port"));
    }
    job.ports.push_back(static_cast<uint16_t>(port));
  }
  return job;
}

absl::StatusOr<std::vector<NicJob>> ParseNicJobs(absl::string_view text) {
  std::vector<NicJob> jobs;
  for (absl::string_view item : absl::StrSplit(text, ';', absl::SkipWhitespace())) {
    absl::StatusOr<NicJob> job = ParseNicJob(absl::StripAsciiWhitespace(item));
    if (!job.ok()) return job.status();
    for (const NicJob& other : jobs) {
      if (other.name == job->name) {
        return absl::InvalidArgumentError(
            absl::StrCat("job '", job->name, "' is listed twice"));
      }
    }
    jobs.push_back(*std::move(job));
  }
  return jobs;
}

}  // namespace mlfabric::nicprio
