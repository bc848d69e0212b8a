#include "tools/run/elastic.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "launch/process.h"

namespace mlfabric::run {

using Clock = std::chrono::steady_clock;
using launch::Subprocess;

absl::StatusOr<std::vector<HostfileEntry>> RunDiscovery(const std::string& script,
                                                        double timeout_s) {
  char path[] = "/tmp/mlfabric-discovery-XXXXXX";
  const int out = ::mkstemp(path);
  if (out < 0) {
    return absl::InternalError(absl::StrCat("host discovery script ", script,
                                            ": cannot make a file for its output: ",
                                            std::strerror(errno)));
  }
  const pid_t pid = ::fork();
  if (pid > 0) ::setpgid(pid, pid);  // also in the child: whichever runs first
  if (pid == 0) {
    // A group of its own: a timeout kills what the script started too.
    ::setpgid(0, 0);
    ::dup2(out, 1);
    const int in = ::open("/dev/null", O_RDONLY);
    if (in >= 0) ::dup2(in, 0);
    ::execl(script.c_str(), script.c_str(), static_cast<char*>(nullptr));
    std::fprintf(stderr, "mlfabric-run: cannot run the host discovery script %s: %s\n",
                 script.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(out);
  std::optional<int> code;
  if (pid > 0) {
    launch::WaitUntil([&] {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) != pid) return false;
      code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return true;
    }, timeout_s);
    if (!code) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  const std::string text = launch::ReadFile(path);
  ::unlink(path);
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("host discovery script ", script,
                                            ": fork: ", std::strerror(errno)));
  }
  if (!code) {
    return absl::DeadlineExceededError(absl::StrCat(
        "host discovery script ", script, " ran longer than ", timeout_s,
        " s (--discovery_timeout_s) and was killed"));
  }
  if (*code != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("host discovery script ", script, " exited with ", *code));
  }
  return ParseDiscoveryOutput(text, script);
}

namespace {

// A rank's process, or a host's daemon launcher.
struct Launched {
  std::unique_ptr<Subprocess> process;
  std::string host;
  bool stopping = false;
  Clock::time_point stop_sent;
};

class ElasticLauncher {
 public:
  ElasticLauncher(const ElasticOptions& o) : o_(o), plan_(o.limits), local_(LocalNames()) {}

  int Run(const std::vector<HostfileEntry>& first_hosts, const volatile sig_atomic_t* stop);

 private:
  void SetHosts(const std::vector<HostfileEntry>& hosts);
  void Discover();
  void Reap();
  void SyncDaemons();
  void StartRanks();
  void StartRank(const RankStart& start);
  void StartDaemon(const std::string& host);
  void StopDaemon(const std::string& host);
  void StopAll();
  bool IsLocal(const std::string& host);
  // `mpirun -np 1 --host H -x ...` with the user's mpirun arguments.
  std::vector<std::string> RemoteLaunch(const std::string& host) const;
  void Say(const std::string& line) const { std::cerr << "mlfabric-run: " << line << "\n"; }

  const ElasticOptions& o_;
  ElasticPlan plan_;
  std::vector<std::string> local_;      // this machine's names and addresses
  std::map<std::string, bool> is_local_;
  std::map<int, Launched> ranks_;       // by rank number
  std::map<std::string, Launched> daemons_;  // by host
  std::map<std::string, int> daemon_failures_;
  Clock::time_point next_discovery_;
};

bool ElasticLauncher::IsLocal(const std::string& host) {
  auto found = is_local_.find(host);
  if (found != is_local_.end()) return found->second;
  return is_local_[host] = FindLocalHost({host}, local_) >= 0;
}

std::vector<std::string> ElasticLauncher::RemoteLaunch(const std::string& host) const {
  std::vector<std::string> command = {o_.mpirun_path, "-np", "1", "--host", host};
  for (const std::string& name : o_.forwarded_env) {
    if (std::getenv(name.c_str())) command.insert(command.end(), {"-x", name});
  }
  command.insert(command.end(), o_.mpirun_args.begin(), o_.mpirun_args.end());
  command.push_back(o_.self);
  return command;
}

void ElasticLauncher::SetHosts(const std::vector<HostfileEntry>& hosts) {
  const std::vector<std::string> before = plan_.hosts();
  for (const RankStop& stop : plan_.SetHosts(hosts)) {
    Say(absl::StrCat("host ", stop.host, stop.host_vanished ? " vanished" : " has fewer slots",
                     ": stopping rank ", stop.rank));
    Launched& rank = ranks_.at(stop.rank);
    rank.stopping = true;
    rank.stop_sent = Clock::now();
    rank.process->Signal(SIGTERM);
  }
  for (const std::string& host : before) {
    const std::vector<std::string> now = plan_.hosts();
    if (std::find(now.begin(), now.end(), host) == now.end() && plan_.RanksOn(host).empty()) {
      Say(absl::StrCat("host ", host, " vanished"));
    }
  }
}

void ElasticLauncher::Discover() {
  next_discovery_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(o_.discovery_interval_s));
  auto hosts = RunDiscovery(o_.script, o_.discovery_timeout_s);
  if (!hosts.ok()) {
    const std::vector<std::string> kept = plan_.hosts();
    Say(absl::StrCat("warning: ", hosts.status().message(), "; keeping the hosts ",
                     kept.empty() ? "(none)" : absl::StrJoin(kept, ",")));
    return;
  }
  SetHosts(*hosts);
}

// Ranks that exited; stopping ranks past their grace get SIGKILL.
void ElasticLauncher::Reap() {
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    Launched& rank = it->second;
    const std::optional<int> code = rank.process->WaitFor(0);
    if (!code) {
      if (rank.stopping && Clock::now() - rank.stop_sent >
                               std::chrono::duration<double>(o_.stop_grace_s)) {
        rank.process->Signal(SIGKILL);
      }
      ++it;
      continue;
    }
    Say(plan_.Exited(it->first, *code, rank.stopping));
    it = ranks_.erase(it);
  }
}

// A daemon for every listed host; a host no longer listed keeps its daemon
// until its last rank has exited.
void ElasticLauncher::SyncDaemons() {
  const std::vector<std::string> hosts = plan_.hosts();
  for (auto it = daemons_.begin(); it != daemons_.end();) {
    const std::string host = it->first;
    const bool listed = std::find(hosts.begin(), hosts.end(), host) != hosts.end();
    if (!listed && plan_.RanksOn(host).empty()) {
      StopDaemon(host);
      it = daemons_.erase(it);
    } else if (auto code = it->second.process->WaitFor(0)) {
      Say(absl::StrCat("warning: the daemon launcher of host ", host, " exited with ", *code,
                       "; its log: ", it->second.process->log_path()));
      ++daemon_failures_[host];
      it = daemons_.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& host : hosts) {
    // A host whose daemon keeps failing has the failure limit's starts.
    if (daemons_.count(host) == 0 &&
        daemon_failures_[host] < o_.limits.host_failure_limit) {
      StartDaemon(host);
    }
  }
}

void ElasticLauncher::StartDaemon(const std::string& host) {
  std::vector<std::string> command;
  if (IsLocal(host)) {
    command = {o_.self};
  } else {
    command = RemoteLaunch(host);
    command.insert(command.end() - 1, {"-x", "MLFABRIC_CLUSTER_SECRET"});
  }
  command.insert(command.end(), {"--exec-daemon", "--dir", o_.socket_dir, "--scheduler",
                                 o_.scheduler_address, "--hosts", host});
  for (const std::string& flag : o_.daemon_args) command.insert(command.end(), {"--daemon_arg", flag});
  // Only the daemons' launchers see the secret, not the ranks.
  setenv("MLFABRIC_CLUSTER_SECRET", o_.cluster_secret.c_str(), 1);
  auto started = Subprocess::Start(command, o_.socket_dir + "/" + host + ".launcher.log");
  unsetenv("MLFABRIC_CLUSTER_SECRET");
  if (!started.ok()) {
    Say(absl::StrCat("warning: cannot start the daemon of host ", host, ": ",
                     started.status().message()));
    ++daemon_failures_[host];
    return;
  }
  Say(absl::StrCat("host ", host, ": starting its mlfabricd", IsLocal(host) ? "" : " through mpirun",
                   " (log ", o_.socket_dir, "/", host, ".log)"));
  daemons_[host] = Launched{std::move(*started), host};
}

// SIGTERM: the launcher stops its daemon and removes its socket.
void ElasticLauncher::StopDaemon(const std::string& host) {
  daemons_.at(host).process->Stop(15);
  const std::string socket = o_.socket_dir + "/" + host + ".sock";
  if (!launch::WaitUntil([&] { return ::access(socket.c_str(), F_OK) != 0; }, 15)) {
    Say(absl::StrCat("warning: host ", host, "'s daemon socket ", socket, " is still there"));
  }
  Say(absl::StrCat("host ", host, ": stopped its mlfabricd"));
}

void ElasticLauncher::StartRanks() {
  for (const RankStart& start : plan_.Fill()) {
    Say(absl::StrCat("host ", start.host, start.host_appeared ? " appeared" : "",
                     ": starting rank ", start.rank, " (slot ", start.slot + 1, " of ",
                     start.host_slots, "; size ", start.size, ")"));
    StartRank(start);
  }
}

void ElasticLauncher::StartRank(const RankStart& start) {
  std::vector<std::string> command =
      IsLocal(start.host) ? std::vector<std::string>{o_.self} : RemoteLaunch(start.host);
  command.insert(command.end(),
                 {"--exec-rank", "--rank", std::to_string(start.rank), "--size",
                  std::to_string(start.size), "--local_rank", std::to_string(start.slot),
                  "--local_size", std::to_string(start.local_size), "--hostname", start.host,
                  "--"});
  command.insert(command.end(), o_.command.begin(), o_.command.end());
  if (o_.verbose) Say(absl::StrJoin(command, " "));
  auto started = Subprocess::Start(command, "");
  if (!started.ok()) {
    // As a rank that failed at once: the plan counts it against its host.
    Say(absl::StrCat("cannot start rank ", start.rank, ": ", started.status().message()));
    Say(plan_.Exited(start.rank, 127, false));
    return;
  }
  ranks_[start.rank] = Launched{std::move(*started), start.host};
}

void ElasticLauncher::StopAll() {
  for (auto& [number, rank] : ranks_) rank.process->Signal(SIGTERM);
  for (auto& [number, rank] : ranks_) {
    if (!rank.process->WaitFor(o_.stop_grace_s)) rank.process->Stop(0);
  }
  ranks_.clear();
  for (auto& [host, daemon] : daemons_) StopDaemon(host);
  daemons_.clear();
}

int ElasticLauncher::Run(const std::vector<HostfileEntry>& first_hosts,
                         const volatile sig_atomic_t* stop) {
  SetHosts(first_hosts);
  next_discovery_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(o_.discovery_interval_s));
  // Since when fewer than min_np ranks run (max(): enough run).
  Clock::time_point short_since = Clock::time_point::max();
  int code = 0;
  while (true) {
    if (*stop != 0) {
      Say("interrupted; stopping the ranks and daemons");
      code = 128 + *stop;
      break;
    }
    if (Clock::now() >= next_discovery_) Discover();
    Reap();
    if (plan_.done()) {
      code = plan_.exit_code();
      break;
    }
    SyncDaemons();
    StartRanks();
    if (plan_.running() >= o_.limits.min_np || plan_.finishing()) {
      short_since = Clock::time_point::max();
    } else if (short_since == Clock::time_point::max()) {
      short_since = Clock::now();
    } else if (Clock::now() - short_since >
               std::chrono::duration<double>(o_.elastic_timeout_s)) {
      Say(absl::StrCat("only ", plan_.running(), " rank(s) running, fewer than --min-np ",
                       o_.limits.min_np, ", for more than ", o_.elastic_timeout_s,
                       " s (--elastic_timeout_s); ending the job"));
      code = 1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  StopAll();
  return code;
}

}  // namespace

int RunElastic(const ElasticOptions& options, const std::vector<HostfileEntry>& first_hosts,
               const volatile sig_atomic_t* stop) {
  return ElasticLauncher(options).Run(first_hosts, stop);
}

}  // namespace mlfabric::run
