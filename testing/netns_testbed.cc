#include "testing/netns_testbed.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace mlfabric::bench {
namespace {

using launch::BinaryPath;
using launch::ReadFile;
using launch::Subprocess;
using launch::WaitUntil;

// The data link between the two namespaces (private to them).
constexpr char kServerDataIp[] = "10.213.0.1";
constexpr char kWorkerDataIp[] = "10.213.0.2";

struct ShellResult {
  int exit_code = -1;
  std::string output;
};

ShellResult Shell(const std::string& command) {
  ShellResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

absl::Status Run(const std::string& command) {
  ShellResult r = Shell(command);
  if (r.exit_code != 0) {
    return absl::InternalError(absl::StrCat("`", command, "` failed: ", r.output));
  }
  return absl::OkStatus();
}

std::string ToolPath(const std::string& tool) {
  ShellResult r = Shell("command -v " + tool);
  if (r.exit_code != 0) return "";
  while (!r.output.empty() && (r.output.back() == '\n' || r.output.back() == ' ')) {
    r.output.pop_back();
  }
  return r.output;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NetnsTestbed>> NetnsTestbed::Create(
    const NetnsTestbedOptions& options) {
  if (ToolPath("ip").empty() || ToolPath("tc").empty()) {
    return absl::FailedPreconditionError("the ip and tc tools are not installed");
  }
  if (::geteuid() != 0) {
    return absl::FailedPreconditionError("network namespaces need root");
  }
  auto bed = std::unique_ptr<NetnsTestbed>(new NetnsTestbed());
  bed->options_ = options;
  // Unique per process and testbed: deleted namespaces' veths may linger
  // for a moment, so a name is never reused within a process.
  static int testbeds = 0;
  const int pid = static_cast<int>(::getpid());
  const int serial = testbeds++ % 100;
  bed->prefix_ = absl::StrCat("h1dp", pid, "x", serial);
  // Root-namespace links: a /29 chosen from pid and serial so that
  // concurrent runs (and other users of 10/8 here) are unlikely to collide.
  bed->root_subnet_ =
      absl::StrCat("10.", 200 + pid % 50, ".", (pid / 50 + serial) % 250, ".");
  char dir_template[] = "/tmp/mlfabric-netns-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) {
    return absl::InternalError("cannot create a directory under /tmp");
  }
  bed->dir_ = dir_template;
  for (const char* which : {"s", "w"}) {
    const std::string ns = bed->Namespace(which);
    ShellResult add = Shell("ip netns add " + ns);
    if (add.exit_code != 0) {
      return absl::FailedPreconditionError("cannot create a network namespace: " + add.output);
    }
    bed->namespaces_.push_back(ns);
  }
  const std::string s = bed->Namespace("s"), w = bed->Namespace("w");
  const std::string root_s = absl::StrCat(bed->prefix_, "a"), root_w = absl::StrCat(bed->prefix_, "b");
  const std::string& net = bed->root_subnet_;
  const std::vector<std::string> setup = {
      // Data link s <-> w.
      absl::StrCat("ip link add sdata netns ", s, " type veth peer name wdata netns ", w),
      absl::StrCat("ip -n ", s, " addr add ", kServerDataIp, "/30 dev sdata"),
      absl::StrCat("ip -n ", w, " addr add ", kWorkerDataIp, "/30 dev wdata"),
      // Control links to the root namespace.
      absl::StrCat("ip link add ", root_s, " type veth peer name sctl netns ", s),
      absl::StrCat("ip link add ", root_w, " type veth peer name wctl netns ", w),
      absl::StrCat("ip addr add ", net, "1/30 dev ", root_s),
      absl::StrCat("ip -n ", s, " addr add ", net, "2/30 dev sctl"),
      absl::StrCat("ip addr add ", net, "5/30 dev ", root_w),
      absl::StrCat("ip -n ", w, " addr add ", net, "6/30 dev wctl"),
      absl::StrCat("ip link set ", root_s, " up"),
      absl::StrCat("ip link set ", root_w, " up"),
      // w1's uplink: one htb class at the link rate (TensorLights-style
      // classes would hang below 1:1).
      absl::StrCat("ip netns exec ", w, " tc qdisc add dev wdata root handle 1: htb default 10"),
      absl::StrCat("ip netns exec ", w, " tc class add dev wdata parent 1: classid 1:1 htb rate ",
                   static_cast<int64_t>(options.link_bps), "bit ceil ",
                   static_cast<int64_t>(options.link_bps), "bit"),
      absl::StrCat("ip netns exec ", w,
                   " tc class add dev wdata parent 1:1 classid 1:10 htb rate ",
                   static_cast<int64_t>(options.link_bps), "bit ceil ",
                   static_cast<int64_t>(options.link_bps), "bit"),
  };
  // Namespaces could be created, so a failure from here on is an error,
  // not a reason to skip.
  for (const std::string& command : setup) {
    if (auto status = Run(command); !status.ok()) return status;
  }
  for (const std::string& ns : {s, w}) {
    for (const char* dev : {"lo", "sdata", "wdata", "sctl", "wctl"}) {
      (void)Shell(absl::StrCat("ip -n ", ns, " link set ", dev, " up"));
    }
  }
  return bed;
}

NetnsTestbed::~NetnsTestbed() {
  for (auto& app : apps_) app->Stop(2.0);
  for (auto& [host, daemon] : daemons_) daemon->Stop(2.0);
  if (scheduler_) scheduler_->Stop(2.0);
  // Deleting a namespace deletes the veths in it, and with them their peers.
  for (const std::string& ns : namespaces_) (void)Shell("ip netns del " + ns);
  (void)Shell("rm -rf " + dir_);
}

absl::Status NetnsTestbed::StartCluster(
    const std::vector<std::string>& scheduler_flags, const std::vector<std::string>& daemon_flags,
    const std::map<std::string, std::vector<std::string>>& host_flags) {
  const std::string port_file = dir_ + "/scheduler.port";
  const std::string admin_port_file = dir_ + "/admin.port";
  std::vector<std::string> argv = {BinaryPath("scheduler/mlfabric-scheduler"),
                                   "--listen_address=0.0.0.0",
                                   "--grpc_port=0",
                                   "--port_file=" + port_file,
                                   "--admin_port=0",
                                   "--admin_port_file=" + admin_port_file};
  argv.insert(argv.end(), scheduler_flags.begin(), scheduler_flags.end());
  auto scheduler = Subprocess::Start(argv, dir_ + "/scheduler.log");
  if (!scheduler.ok()) return scheduler.status();
  scheduler_ = std::move(*scheduler);
  if (!WaitUntil([&] { return !ReadFile(port_file).empty() && !ReadFile(admin_port_file).empty(); },
                 30)) {
    return absl::DeadlineExceededError("scheduler did not start: " + scheduler_->Log());
  }
  const std::string port = ReadFile(port_file);
  admin_port_ = std::atoi(ReadFile(admin_port_file).c_str());
  const std::string ip = ToolPath("ip");
  struct Host {
    std::string name, ns, data_ip, scheduler_ip;
  };
  const std::vector<Host> hosts = {
      {"s1", Namespace("s"), kServerDataIp, root_subnet_ + "1"},
      {"w1", Namespace("w"), kWorkerDataIp, root_subnet_ + "5"},
  };
  for (const Host& host : hosts) {
    std::vector<std::string> daemon_argv = {ip,
                                            "netns",
                                            "exec",
                                            host.ns,
                                            BinaryPath("daemon/mlfabricd"),
                                            "--host=" + host.name,
                                            "--scheduler=" + host.scheduler_ip + ":" +
                                                std::to_string(std::atoi(port.c_str())),
                                            "--listen_address=" + host.data_ip,
                                            "--local_socket=" + Socket(host.name)};
    daemon_argv.insert(daemon_argv.end(), daemon_flags.begin(), daemon_flags.end());
    if (auto extra = host_flags.find(host.name); extra != host_flags.end()) {
      daemon_argv.insert(daemon_argv.end(), extra->second.begin(), extra->second.end());
    }
    auto daemon = Subprocess::Start(daemon_argv, dir_ + "/" + host.name + ".log");
    if (!daemon.ok()) return daemon.status();
    daemons_[host.name] = std::move(*daemon);
  }
  for (const Host& host : hosts) {
    if (!WaitUntil([&] { return daemons_[host.name]->Log().find("serving") != std::string::npos; },
                   30)) {
      return absl::DeadlineExceededError(
          absl::StrCat("daemon ", host.name, " did not start: ", daemons_[host.name]->Log()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Subprocess*> NetnsTestbed::StartApp(const std::string& name,
                                                   const std::vector<std::string>& argv) {
  auto app = Subprocess::Start(argv, dir_ + "/" + name + ".log");
  if (!app.ok()) return app.status();
  apps_.push_back(std::move(*app));
  return apps_.back().get();
}

absl::StatusOr<uint64_t> NetnsTestbed::ServerRxBytes() {
  auto it = daemons_.find("s1");
  if (it == daemons_.end()) return absl::FailedPreconditionError("s1's daemon is not running");
  std::ifstream in(absl::StrCat("/proc/", it->second->pid(), "/net/dev"));
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != "sdata") continue;
    std::istringstream fields(line.substr(colon + 1));
    uint64_t rx_bytes = 0;
    if (fields >> rx_bytes) return rx_bytes;
  }
  return absl::NotFoundError("no sdata interface in s1's namespace");
}

absl::Status NetnsTestbed::Exec(const std::string& which, const std::string& command) {
  return Run(absl::StrCat("ip netns exec ", Namespace(which), " ", command));
}

}  // namespace mlfabric::bench
