#include "launch/cluster.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/secrets.h"

namespace mlfabric::launch {
namespace {

using launch::BinaryPath;
using launch::ReadFile;
using launch::Subprocess;
using launch::WaitUntil;

// Unique per process and cluster, <= 12 characters: deleted namespaces'
// veths may linger for a moment, so a name is never reused in a process.
std::string UniquePrefix() {
  static int clusters = 0;
  return absl::StrCat("m", ::getpid() % 10000000, "x", clusters++ % 100, "-");
}

// For a scheduler started without --config: job "demo" with the token in
// MLFABRIC_JOB_TOKEN (a new one, exported, when unset), written to `dir`.
// Returns the config's path.
std::string WriteDemoJobConfig(const std::string& dir) {
  const char* given = std::getenv("MLFABRIC_JOB_TOKEN");
  const std::string token = given != nullptr && *given != '\0' ? given : RandomHex(16);
  ::setenv("MLFABRIC_JOB_TOKEN", token.c_str(), 1);
  const std::string config = dir + "/jobs.json";
  {
    std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": ")" << token << R"("}]})";
  }
  ::chmod(config.c_str(), 0600);
  return config;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Create(const ClusterOptions& options) {
  auto cluster = std::unique_ptr<Cluster>(new Cluster());
  cluster->topology_ = options.topology;
  cluster->hosts_ = options.hosts;
  cluster->admin_ = options.admin;
  cluster->cluster_secret_ = options.cluster_secret;
  if (options.topology == Topology::kNetns) {
    NetnsLayout layout;
    layout.prefix = options.prefix.empty() ? UniquePrefix() : options.prefix;
    layout.hosts = options.hosts;
    layout.subnet = options.subnet;
    layout.root_link = true;
    if (absl::Status valid = layout.Validate(); !valid.ok()) return valid;
    for (const auto& [host, rate] : options.rates) {
      if (!layout.HasHost(host)) {
        return absl::InvalidArgumentError("a rate for '" + host + "', which is not a host");
      }
    }
    if (absl::Status usable = NetnsNetwork::CheckPrerequisites(layout.prefix); !usable.ok()) {
      return usable;
    }
    // The common rate everywhere, then the exceptions.
    auto network = NetnsNetwork::Create(layout, options.rate.up_bps);
    if (!network.ok()) return network.status();
    cluster->network_ = std::move(*network);
    for (const std::string& host : options.hosts) {
      auto it = options.rates.find(host);
      const LinkRate rate = it == options.rates.end() ? options.rate : it->second;
      if (absl::Status set = cluster->network_->SetRate(host, rate.up_bps, rate.down_bps);
          !set.ok()) {
        return set;
      }
    }
  }
  // Unix socket paths must fit in 108 bytes, which $TEST_TMPDIR may not.
  char dir_template[] = "/tmp/mlfabric-cluster-XXXXXX";
  const char* dir = ::mkdtemp(dir_template);
  if (dir == nullptr) return absl::InternalError("cannot create a directory under /tmp");
  cluster->dir_ = dir;
  return cluster;
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::StartLoopback(
    const std::vector<std::string>& hosts, const std::vector<std::string>& scheduler_flags,
    const std::vector<std::string>& daemon_flags,
    const std::map<std::string, std::vector<std::string>>& host_flags, bool cluster_secret) {
  ClusterOptions options;
  options.hosts = hosts;
  options.cluster_secret = cluster_secret;
  auto cluster = Create(options);
  if (!cluster.ok()) return cluster.status();
  if (absl::Status started = (*cluster)->Start(scheduler_flags, daemon_flags, host_flags);
      !started.ok()) {
    return started;
  }
  return cluster;
}

std::string Cluster::SubstituteDir(std::string flag) const {
  for (size_t at = flag.find("{dir}"); at != std::string::npos;
       at = flag.find("{dir}", at + dir_.size())) {
    flag.replace(at, 5, dir_);
  }
  return flag;
}

absl::Status Cluster::Start(const std::vector<std::string>& scheduler_flags,
                            const std::vector<std::string>& daemon_flags,
                            const std::map<std::string, std::vector<std::string>>& host_flags) {
  if (scheduler_ != nullptr) return absl::FailedPreconditionError("the cluster was started");
  const bool netns = topology_ == Topology::kNetns;
  const std::string port_file = dir_ + "/scheduler.port";
  const std::string admin_port_file = dir_ + "/admin.port";
  std::vector<std::string> argv = {BinaryPath("scheduler/mlfabric-scheduler"), "--grpc_port=0",
                                   "--port_file=" + port_file};
  // The root namespace's address on the hosts' bridge: the daemons' way in.
  if (netns) argv.push_back("--listen_address=" + network_->layout().RootAddress());
  if (admin_) {
    argv.push_back("--admin_port=0");
    argv.push_back("--admin_port_file=" + admin_port_file);
  }
  std::vector<std::string> secret_flags;
  if (cluster_secret_) {
    const std::string secret_file = dir_ + "/cluster.secret";
    {
      std::ofstream(secret_file) << RandomHex(32) << "\n";
    }
    ::chmod(secret_file.c_str(), 0600);
    secret_flags.push_back("--cluster_secret_file=" + secret_file);
    argv.push_back(secret_flags.back());
  }
  const bool configured = std::any_of(scheduler_flags.begin(), scheduler_flags.end(),
                                      [](const std::string& flag) {
                                        return absl::StartsWith(flag, "--config");
                                      });
  if (!configured) argv.push_back("--config=" + WriteDemoJobConfig(dir_));
  // The sealed variants of the data-plane tests (tests/BUILD) run every
  // path with payload encryption on.
  if (const char* sealed = std::getenv("MLFABRIC_TEST_DATA_PLANE_ENCRYPTION");
      sealed != nullptr && std::string(sealed) == "true") {
    argv.push_back("--data_plane_encryption=true");
  }
  for (const std::string& flag : scheduler_flags) argv.push_back(SubstituteDir(flag));
  scheduler_argv_ = argv;
  auto scheduler = Subprocess::Start(argv, dir_ + "/scheduler.log");
  if (!scheduler.ok()) return scheduler.status();
  scheduler_ = std::move(*scheduler);
  if (!WaitUntil(
          [&] {
            return (!ReadFile(port_file).empty() &&
                    (!admin_ || !ReadFile(admin_port_file).empty())) ||
                   !scheduler_->Running();
          },
          30) ||
      ReadFile(port_file).empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("scheduler did not start: ", scheduler_->Log()));
  }
  port_ = std::atoi(ReadFile(port_file).c_str());
  if (admin_) admin_port_ = std::atoi(ReadFile(admin_port_file).c_str());
  for (const std::string& host : hosts_) {
    if (absl::Status started = StartDaemon(host, secret_flags, daemon_flags, host_flags);
        !started.ok()) {
      return started;
    }
  }
  for (const std::string& host : hosts_) {
    if (absl::Status serving = WaitForDaemon(host, 0); !serving.ok()) return serving;
  }
  return absl::OkStatus();
}

absl::Status Cluster::StartDaemon(
    const std::string& host, const std::vector<std::string>& secret_flags,
    const std::vector<std::string>& daemon_flags,
    const std::map<std::string, std::vector<std::string>>& host_flags) {
  const bool netns = topology_ == Topology::kNetns;
  std::vector<std::string> daemon_argv = {BinaryPath("daemon/mlfabricd"), "--host=" + host,
                                          "--scheduler=" + scheduler_address(),
                                          "--local_socket=" + Socket(host)};
  if (netns) {
    daemon_argv.push_back("--listen_address=" + HostAddress(host));
    daemon_argv = network_->Wrap(host, daemon_argv);
  }
  for (const std::string& flag : secret_flags) daemon_argv.push_back(flag);
  for (const std::string& flag : daemon_flags) daemon_argv.push_back(SubstituteDir(flag));
  if (auto extra = host_flags.find(host); extra != host_flags.end()) {
    for (const std::string& flag : extra->second) daemon_argv.push_back(SubstituteDir(flag));
  }
  auto daemon = Subprocess::Start(daemon_argv, dir_ + "/" + host + ".log");
  if (!daemon.ok()) return daemon.status();
  daemons_[host] = std::move(*daemon);
  daemon_argv_[host] = std::move(daemon_argv);
  return absl::OkStatus();
}

absl::Status Cluster::WaitForDaemon(const std::string& host, size_t log_from) {
  Subprocess& daemon = *daemons_.at(host);
  auto serving = [&] { return daemon.Log().find("serving", log_from) != std::string::npos; };
  // Stop waiting as soon as the daemon exits (a bad flag, say).
  if (!WaitUntil([&] { return serving() || !daemon.Running(); }, 30) || !serving()) {
    return absl::DeadlineExceededError(
        absl::StrCat("daemon ", host, " did not start: ", daemon.Log().substr(log_from)));
  }
  return absl::OkStatus();
}

absl::Status Cluster::KillDaemon(const std::string& host) {
  auto daemon = daemons_.find(host);
  if (daemon == daemons_.end()) return absl::NotFoundError("no daemon on host '" + host + "'");
  daemon->second->Signal(SIGKILL);
  if (!daemon->second->WaitFor(10).has_value()) {
    return absl::DeadlineExceededError("the daemon of " + host + " survived SIGKILL for 10 s");
  }
  return absl::OkStatus();
}

absl::Status Cluster::RestartDaemon(const std::string& host) {
  if (absl::Status killed = KillDaemon(host); !killed.ok()) return killed;
  const std::string log_path = dir_ + "/" + host + ".log";
  const size_t log_from = ReadFile(log_path).size();
  auto daemon = Subprocess::Start(daemon_argv_.at(host), log_path);
  if (!daemon.ok()) return daemon.status();
  daemons_[host] = std::move(*daemon);
  return WaitForDaemon(host, log_from);
}

absl::Status Cluster::RestartScheduler() {
  if (scheduler_ == nullptr) return absl::FailedPreconditionError("the cluster was not started");
  scheduler_->Signal(SIGKILL);
  (void)scheduler_->WaitFor(10);
  const std::string port_file = dir_ + "/scheduler.port";
  std::remove(port_file.c_str());
  std::vector<std::string> argv = scheduler_argv_;
  for (std::string& flag : argv) {
    if (flag == "--grpc_port=0") flag = absl::StrCat("--grpc_port=", port_);
  }
  auto scheduler = Subprocess::Start(argv, dir_ + "/scheduler.log");
  if (!scheduler.ok()) return scheduler.status();
  scheduler_ = std::move(*scheduler);
  if (!WaitUntil([&] { return !ReadFile(port_file).empty() || !scheduler_->Running(); }, 30) ||
      ReadFile(port_file).empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("the restarted scheduler did not start: ", scheduler_->Log()));
  }
  return absl::OkStatus();
}

std::string Cluster::scheduler_address() const {
  const std::string ip =
      topology_ == Topology::kNetns ? network_->layout().RootAddress() : "127.0.0.1";
  return absl::StrCat(ip, ":", port_);
}

std::string Cluster::HostAddress(const std::string& host) const {
  return topology_ == Topology::kNetns ? network_->layout().Address(host) : "127.0.0.1";
}

absl::StatusOr<Subprocess*> Cluster::StartApp(const std::string& name,
                                              const std::vector<std::string>& argv,
                                              bool inherit_output) {
  auto app = Subprocess::Start(argv, inherit_output ? "" : dir_ + "/" + name + ".log");
  if (!app.ok()) return app.status();
  apps_.push_back(std::move(*app));
  return apps_.back().get();
}

absl::StatusOr<Subprocess*> Cluster::StartAppInHost(const std::string& host,
                                                    const std::string& name,
                                                    const std::vector<std::string>& argv) {
  if (topology_ != Topology::kNetns) return StartApp(name, argv);
  if (!network_->layout().HasHost(host)) {
    return absl::NotFoundError("unknown host '" + host + "'");
  }
  return StartApp(name, network_->Wrap(host, argv));
}

absl::Status Cluster::RequireNetns() const {
  if (topology_ != Topology::kNetns) {
    return absl::FailedPreconditionError("a loopback cluster has no per-host links");
  }
  return absl::OkStatus();
}

absl::Status Cluster::SetRate(const std::string& host, std::optional<double> up_bps,
                              std::optional<double> down_bps) {
  if (absl::Status netns = RequireNetns(); !netns.ok()) return netns;
  return network_->SetRate(host, up_bps, down_bps);
}

absl::StatusOr<std::map<std::string, LinkBytes>> Cluster::ReadLinkBytes() const {
  if (absl::Status netns = RequireNetns(); !netns.ok()) return netns;
  return network_->ReadLinkBytes();
}

absl::StatusOr<std::string> Cluster::Exec(const std::string& host,
                                          const std::vector<std::string>& argv) const {
  if (absl::Status netns = RequireNetns(); !netns.ok()) return netns;
  return network_->Exec(host, argv);
}

Cluster::~Cluster() {
  for (auto& app : apps_) app->Stop(2.0);
  for (auto& [host, daemon] : daemons_) daemon->Stop(2.0);
  if (scheduler_) scheduler_->Stop(2.0);
  network_.reset();  // kills what is left inside, deletes the namespaces
  if (!dir_.empty()) {
    // MLFABRIC_KEEP_CLUSTER_DIR=1 keeps the logs and configs for a look.
    if (const char* keep = std::getenv("MLFABRIC_KEEP_CLUSTER_DIR"); keep && *keep == '1') {
      std::fprintf(stderr, "cluster: kept %s\n", dir_.c_str());
      return;
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

}  // namespace mlfabric::launch
