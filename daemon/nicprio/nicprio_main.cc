// mlfabric-nicprio: installs TensorLights job priorities on a host NIC
// (tensorlights.md §IV-B/C, §V) with tc htb classes and u32 port filters,
// keeps them (rotating every --period_s in rr mode, TLs-RR) until SIGTERM,
// SIGINT or SIGHUP, then removes them.
//
//   mlfabric-nicprio --interface=eth0 --mode=rr --period_s=20
//       --job=jobA:2222 --job=jobB:3333,3334 [--link_rate_bps=1e10]
//       [--min_rate_bps=1e6] [--max_bands=7] [--dry_run]
//
// Jobs are ranked in the order given (first = highest) for --mode=one; rr
// rotates that order. Without CAP_NET_ADMIN it explains why it cannot and
// changes nothing (exit 3). --dry_run prints the commands and exits.
// Exit codes: 0 ok, 1 tc failed (whatever was installed is removed),
// 2 usage, 3 missing capability.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/nicprio/tc_commands.h"
#include "daemon/nicprio/tc_runner.h"
#include "daemon/queue/job_priority_policy.h"

namespace mlfabric::nicprio {
namespace {

struct Flags {
  NicPrioConfig config;
  std::vector<NicJob> jobs;
  daemon::JobPriorityMode mode = daemon::JobPriorityMode::kOne;
  double period_s = 20.0;
  bool dry_run = false;
};

const char kUsage[] =
    "usage: mlfabric-nicprio --interface=IF --mode=one|rr --job=NAME:PORT[,PORT...] "
    "[--job=...] [--period_s=20] [--link_rate_bps=1e10] [--min_rate_bps=1e6] "
    "[--max_bands=7] [--dry_run]\n";

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  bool have_mode = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--dry_run") {
      flags.dry_run = true;
      continue;
    }
    std::vector<std::string> kv = absl::StrSplit(arg, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || !absl::StartsWith(kv[0], "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unrecognised argument '", arg, "'"));
    }
    const std::string& key = kv[0];
    const std::string& value = kv[1];
    auto number = [&](double* out) -> absl::Status {
      if (!absl::SimpleAtod(value, out) || !std::isfinite(*out)) {
        return absl::InvalidArgumentError(absl::StrCat(key, ": '", value, "' is not a number"));
      }
      return absl::OkStatus();
    };
    absl::Status status;
    if (key == "--interface") {
      flags.config.interface = value;
    } else if (key == "--mode") {
      auto mode = daemon::ParseJobPriorityMode(value);
      if (!mode.ok()) return mode.status();
      if (*mode == daemon::JobPriorityMode::kFifo) {
        return absl::InvalidArgumentError(
            "--mode=fifo is the default NIC behaviour: nothing to install");
      }
      flags.mode = *mode;
      have_mode = true;
    } else if (key == "--period_s") {
      status = number(&flags.period_s);
    } else if (key == "--link_rate_bps") {
      status = number(&flags.config.link_rate_bps);
    } else if (key == "--min_rate_bps") {
      status = number(&flags.config.min_rate_bps);
    } else if (key == "--max_bands") {
      if (!absl::SimpleAtoi(value, &flags.config.max_bands)) {
        status = absl::InvalidArgumentError("--max_bands: not an integer");
      }
    } else if (key == "--job") {
      absl::StatusOr<NicJob> job = ParseNicJob(value);
      if (!job.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--job=", job.status().message()));
      }
      flags.jobs.push_back(*std::move(job));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", key, "'"));
    }
    if (!status.ok()) return status;
  }
  if (flags.config.interface.empty()) return absl::InvalidArgumentError("--interface is required");
  if (!have_mode) return absl::InvalidArgumentError("--mode is required (one or rr)");
  if (flags.jobs.empty()) return absl::InvalidArgumentError("at least one --job is required");
  return flags;
}

// Runs `command`, saying so on stderr first.
absl::Status Run(const TcCommand& command) {
  std::fprintf(stderr, "mlfabric-nicprio: %s\n", FormatCommand(command).c_str());
  return RunTc(command);
}

absl::Status RunAll(const std::vector<TcCommand>& commands) {
  for (const TcCommand& c : commands) {
    if (absl::Status s = Run(c); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::vector<size_t> Ranking(const daemon::JobPriorityPolicy& policy, double now_s) {
  std::vector<size_t> ranking;
  for (daemon::JobId job : policy.Ranking(now_s)) ranking.push_back(job);
  return ranking;
}

// --dry_run: the commands that would set up, rotate (rr) and remove the
// priorities.
void PrintDryRun(const Flags& flags, const std::vector<TcCommand>& setup,
                 const daemon::JobPriorityPolicy& policy) {
  for (const TcCommand& c : setup) std::printf("%s\n", FormatCommand(c).c_str());
  if (flags.mode == daemon::JobPriorityMode::kRr && flags.jobs.size() > 1) {
    std::printf("# every %g s, e.g. at %g s:\n", flags.period_s, flags.period_s);
    auto rotated = RankCommands(flags.config, flags.jobs, Ranking(policy, flags.period_s));
    for (const TcCommand& c : rotated.value()) {
      std::printf("%s\n", FormatCommand(c).c_str());
    }
  }
  std::printf("# on exit:\n");
  for (const TcCommand& c : TeardownCommands(flags.config)) {
    std::printf("%s\n", FormatCommand(c).c_str());
  }
}

// Whether tc may change `interface` here (CAP_NET_ADMIN); says why not.
bool CanChangeNic(const std::string& interface) {
  absl::Status status = CheckNetAdmin(interface);
  if (status.ok()) return true;
  std::fprintf(stderr, "mlfabric-nicprio: %s. Nothing was changed.\n",
               std::string(status.message()).c_str());
  return false;
}

// Blocks the stop signals (SIGTERM, SIGINT, SIGHUP) and returns them.
// Signals are taken synchronously with sigtimedwait: no handler, no
// global flag.
sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&stop_signals, sig);
  sigprocmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

// Removes the priorities; false (having said why) if that failed.
bool Teardown(const NicPrioConfig& config) {
  absl::Status s = RunAll(TeardownCommands(config));
  if (!s.ok()) std::fprintf(stderr, "mlfabric-nicprio: teardown: %s\n", s.ToString().c_str());
  return s.ok();
}

// Runs `setup`; false (having said why, and removed what was installed)
// if a command failed.
bool Install(const NicPrioConfig& config, const std::vector<TcCommand>& setup) {
  // The first command creates the root qdisc; if it fails nothing of ours
  // exists and we must not delete someone else's qdisc.
  if (absl::Status s = Run(setup.front()); !s.ok()) {
    std::fprintf(stderr, "mlfabric-nicprio: %s; nothing was changed\n", s.ToString().c_str());
    return false;
  }
  if (absl::Status s = RunAll({setup.begin() + 1, setup.end()}); !s.ok()) {
    std::fprintf(stderr, "mlfabric-nicprio: %s; removing what was installed\n",
                 s.ToString().c_str());
    Teardown(config);
    return false;
  }
  return true;
}

// Re-ranks the jobs at each change time of `policy` (its clock started at
// `start`) until a stop signal, then removes the priorities; returns the
// exit code.
int HoldUntilStopped(const Flags& flags, const daemon::JobPriorityPolicy& policy,
                     const sigset_t& stop_signals, std::chrono::steady_clock::time_point start) {
  auto elapsed_s = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (;;) {
    const double next_s = policy.NextChangeTime(elapsed_s());
    siginfo_t info;
    int sig;
    if (std::isinf(next_s)) {
      sig = sigwaitinfo(&stop_signals, &info);
    } else {
      const double wait_s = std::max(0.0, next_s - elapsed_s());
      timespec timeout;
      timeout.tv_sec = static_cast<time_t>(wait_s);
      timeout.tv_nsec = static_cast<long>((wait_s - std::floor(wait_s)) * 1e9);
      sig = sigtimedwait(&stop_signals, &info, &timeout);
    }
    if (sig > 0) {
      std::fprintf(stderr, "mlfabric-nicprio: %s: removing NIC priorities\n", strsignal(sig));
      break;
    }
    if (errno == EINTR) continue;
    if (elapsed_s() < next_s) continue;  // woke early
    auto rank = RankCommands(flags.config, flags.jobs, Ranking(policy, next_s));
    if (absl::Status s = rank.ok() ? RunAll(*rank) : rank.status(); !s.ok()) {
      std::fprintf(stderr, "mlfabric-nicprio: rotation failed: %s\n", s.ToString().c_str());
      Teardown(flags.config);
      return 1;
    }
  }
  return Teardown(flags.config) ? 0 : 1;
}

int Main(int argc, char** argv) {
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "mlfabric-nicprio: %s\n%s", flags.status().ToString().c_str(), kUsage);
    return 2;
  }
  auto policy = daemon::JobPriorityPolicy::Create({flags->mode, flags->period_s, 0.0});
  if (!policy.ok()) {
    std::fprintf(stderr, "mlfabric-nicprio: --period_s: %s\n", policy.status().ToString().c_str());
    return 2;
  }
  for (size_t i = 0; i < flags->jobs.size(); ++i) {
    // rank_key = position on the command line: first listed ranks first.
    (void)policy->AddJob(i, static_cast<double>(i));
  }
  auto setup = SetupCommands(flags->config, flags->jobs, Ranking(*policy, 0));
  if (!setup.ok()) {
    std::fprintf(stderr, "mlfabric-nicprio: %s\n%s", setup.status().ToString().c_str(), kUsage);
    return 2;
  }
  if (flags->dry_run) {
    PrintDryRun(*flags, *setup, *policy);
    return 0;
  }
  if (!CanChangeNic(flags->config.interface)) return 3;

  const sigset_t stop_signals = BlockStopSignals();
  const auto start = std::chrono::steady_clock::now();
  if (!Install(flags->config, *setup)) return 1;
  std::fprintf(stderr, "mlfabric-nicprio: installed %zu job classes on %s (mode %s)\n",
               flags->jobs.size(), flags->config.interface.c_str(),
               daemon::JobPriorityModeName(flags->mode));
  return HoldUntilStopped(*flags, *policy, stop_signals, start);
}

}  // namespace
}  // namespace mlfabric::nicprio

int main(int argc, char** argv) { return mlfabric::nicprio::Main(argc, argv); }
