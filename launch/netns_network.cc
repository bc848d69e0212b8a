#include "launch/netns_network.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace mlfabric::launch {
namespace {

constexpr int kMaxInterfaceName = 15;  // IFNAMSIZ - 1
constexpr size_t kMaxHosts = 250;      // .2 .. .251 of the /24
// The unshaped class for traffic to and from the root namespace.
constexpr double kControlRateBps = 10e9;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '_';
}

bool IsName(const std::string& name, size_t max_length) {
  return !name.empty() && name.size() <= max_length &&
         std::all_of(name.begin(), name.end(), IsNameChar);
}

// CRC-32 (IEEE 802.3, as zlib.crc32).
uint32_t Crc32(const std::string& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return crc ^ 0xFFFFFFFFu;
}

std::string TcRate(double bps) {
  return absl::StrCat(std::max<int64_t>(8000, static_cast<int64_t>(bps)), "bit");
}

absl::Status Check(const std::vector<std::string>& argv) {
  CommandResult result = RunCommand(argv);
  if (result.exit_code != 0) {
    return absl::InternalError(absl::StrCat("`", absl::StrJoin(argv, " "), "` failed (exit ",
                                            result.exit_code, "): ", result.output));
  }
  return absl::OkStatus();
}

// /proc/net/dev as seen from inside `ns`: read by a thread that joins the
// namespace, so no process is started per sample.
absl::StatusOr<std::string> ReadNetDev(const std::string& ns) {
  const std::string path = "/run/netns/" + ns;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("no namespace ", ns, ": ", path));
  absl::StatusOr<std::string> text = absl::InternalError("not read");
  std::thread reader([&] {
    if (::setns(fd, CLONE_NEWNET) != 0) {
      text = absl::InternalError(absl::StrCat("setns into ", ns, ": ", std::strerror(errno)));
      return;
    }
    std::ifstream in("/proc/thread-self/net/dev");
    std::stringstream content;
    content << in.rdbuf();
    text = content.str();
  });
  reader.join();
  ::close(fd);
  return text;
}

}  // namespace

// ------------------------------------------------------------------ layout

std::string SubnetForPrefix(const std::string& prefix) {
  const uint32_t h = Crc32(prefix);
  return absl::StrCat("10.", 120 + h % 100, ".", (h / 100) % 256);
}

absl::Status NetnsLayout::Validate() const {
  if (!IsName(prefix, kMaxInterfaceName - 3)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix '", prefix, "' must be 1-", kMaxInterfaceName - 3,
        " characters [A-Za-z0-9_-] (it starts interface names of at most ", kMaxInterfaceName,
        ")"));
  }
  if (hosts.empty() || hosts.size() > kMaxHosts) {
    return absl::InvalidArgumentError(
        absl::StrCat("between 1 and ", kMaxHosts, " hosts per /24, got ", hosts.size()));
  }
  std::set<std::string> seen;
  for (const std::string& host : hosts) {
    if (!IsName(host, 12)) {
      return absl::InvalidArgumentError(
          absl::StrCat("host name '", host, "' must be 1-12 characters [A-Za-z0-9_-]"));
    }
    if (host == "sw") {
      return absl::InvalidArgumentError("host name 'sw' is the switch namespace's");
    }
    if (!seen.insert(host).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate host name '", host, "'"));
    }
  }
  if (!IsName(ifname, kMaxInterfaceName)) {
    return absl::InvalidArgumentError(absl::StrCat("bad interface name '", ifname, "'"));
  }
  if (!subnet.empty()) {
    const std::vector<std::string> parts = absl::StrSplit(subnet, '.');
    int octet = 0;
    bool ok = parts.size() == 3;
    for (const std::string& part : parts) {
      ok = ok && absl::SimpleAtoi(part, &octet) && octet >= 0 && octet <= 255;
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("subnet '", subnet, "' must be the first three octets, A.B.C"));
    }
  }
  return absl::OkStatus();
}

std::string NetnsLayout::Subnet() const {
  return subnet.empty() ? SubnetForPrefix(prefix) : subnet;
}

std::string NetnsLayout::Address(const std::string& host) const {
  auto it = std::find(hosts.begin(), hosts.end(), host);
  if (it == hosts.end()) return "";
  return absl::StrCat(Subnet(), ".", 2 + (it - hosts.begin()));
}

std::vector<std::string> NetnsLayout::Namespaces() const {
  std::vector<std::string> names;
  for (const std::string& host : hosts) names.push_back(HostNamespace(host));
  names.push_back(SwitchNamespace());
  return names;
}

bool NetnsLayout::HasHost(const std::string& host) const {
  return std::find(hosts.begin(), hosts.end(), host) != hosts.end();
}

// ---------------------------------------------------------- prerequisites

std::string NetnsPrerequisiteProblem(uid_t euid, const std::string& ip_path,
                                     const std::string& tc_path) {
  std::vector<std::string> missing;
  if (ip_path.empty()) missing.push_back("ip");
  if (tc_path.empty()) missing.push_back("tc");
  if (!missing.empty()) {
    return absl::StrCat("network namespaces need the ", absl::StrJoin(missing, " and "),
                        missing.size() == 1 ? " tool" : " tools",
                        " (iproute2), which ", missing.size() == 1 ? "is" : "are",
                        " not installed");
  }
  if (euid != 0) {
    return absl::StrCat("network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN); "
                        "running as uid ",
                        euid);
  }
  return "";
}

std::string FindTool(const std::string& name) {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) dirs = absl::StrSplit(path, ':', absl::SkipEmpty());
  for (const char* dir : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) dirs.push_back(dir);
  for (const std::string& dir : dirs) {
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

CommandResult RunCommand(const std::vector<std::string>& argv) {
  CommandResult result;
  if (argv.empty()) return result;
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    result.output = std::strerror(errno);
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int error = ::posix_spawnp(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (error != 0) {
    ::close(pipe_fds[0]);
    result.output = absl::StrCat("cannot start ", argv[0], ": ", std::strerror(error));
    return result;
  }
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buffer, sizeof(buffer))) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    result.output.append(buffer, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// ---------------------------------------------------------------- network

absl::Status NetnsNetwork::CheckPrerequisites(const std::string& prefix) {
  const std::string ip = FindTool("ip"), tc = FindTool("tc");
  if (std::string problem = NetnsPrerequisiteProblem(::geteuid(), ip, tc); !problem.empty()) {
    return absl::FailedPreconditionError(problem);
  }
  const std::string probe = absl::StrCat(prefix, "probe", ::getpid());
  CommandResult add = RunCommand({ip, "netns", "add", probe});
  if (add.exit_code != 0) {
    return absl::FailedPreconditionError("cannot create a network namespace: " + add.output);
  }
  std::string problem;
  CommandResult veth =
      RunCommand({ip, "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"});
  if (veth.exit_code != 0) {
    problem = "cannot create a veth pair: " + veth.output;
  } else {
    CommandResult htb = RunCommand(
        {tc, "-n", probe, "qdisc", "add", "dev", "p0", "root", "handle", "1:", "htb"});
    if (htb.exit_code != 0) problem = "cannot install an htb qdisc: " + htb.output;
  }
  RunCommand({ip, "netns", "del", probe});
  if (!problem.empty()) return absl::FailedPreconditionError(problem);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NetnsNetwork>> NetnsNetwork::Attach(const NetnsLayout& layout) {
  if (absl::Status valid = layout.Validate(); !valid.ok()) return valid;
  auto network = std::unique_ptr<NetnsNetwork>(new NetnsNetwork());
  network->layout_ = layout;
  network->ip_ = FindTool("ip");
  network->tc_ = FindTool("tc");
  if (std::string problem = NetnsPrerequisiteProblem(::geteuid(), network->ip_, network->tc_);
      !problem.empty()) {
    return absl::FailedPreconditionError(problem);
  }
  return network;
}

absl::StatusOr<std::unique_ptr<NetnsNetwork>> NetnsNetwork::Create(const NetnsLayout& layout,
                                                                   double rate_bps) {
  auto attached = Attach(layout);
  if (!attached.ok()) return attached.status();
  std::unique_ptr<NetnsNetwork> network = std::move(*attached);
  // Only this network's exact names: prefix "mlft-" must not trip over
  // another network's "mlft-h3-...".
  const std::vector<std::string> existing = ListNamespaces(layout.prefix);
  std::vector<std::string> stale;
  for (const std::string& ns : layout.Namespaces()) {
    if (std::find(existing.begin(), existing.end(), ns) != existing.end()) stale.push_back(ns);
  }
  if (!stale.empty()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "namespaces with prefix '", layout.prefix, "' already exist (", absl::StrJoin(stale, " "),
        "): another run is using this prefix, or a killed one left them; remove them with "
        "`mlfabric-netns cleanup --prefix=",
        layout.prefix, "`"));
  }
  network->owned_ = true;  // from here on, a failure deletes what was made
  CommandResult first = RunCommand({network->ip_, "netns", "add", layout.SwitchNamespace()});
  if (first.exit_code != 0) {
    return absl::FailedPreconditionError("cannot create a network namespace: " + first.output);
  }
  if (absl::Status built = network->Build(rate_bps); !built.ok()) return built;
  return network;
}

absl::Status NetnsNetwork::Build(double rate_bps) {
  const NetnsLayout& l = layout_;
  const std::string sw = l.SwitchNamespace(), br = l.Bridge();
  std::vector<std::vector<std::string>> steps = {
      {ip_, "-n", sw, "link", "set", "lo", "up"},
      {ip_, "-n", sw, "link", "add", br, "type", "bridge"},
      {ip_, "-n", sw, "link", "set", br, "up"},
  };
  if (l.root_link) {
    steps.push_back({ip_, "link", "add", l.RootInterface(), "type", "veth", "peer", "name", "gw0",
                     "netns", sw});
    steps.push_back({ip_, "-n", sw, "link", "set", "gw0", "master", br});
    steps.push_back({ip_, "-n", sw, "link", "set", "gw0", "up"});
    steps.push_back({ip_, "addr", "add", l.RootAddress() + "/24", "dev", l.RootInterface()});
    steps.push_back({ip_, "link", "set", l.RootInterface(), "up"});
  }
  for (const std::string& host : l.hosts) {
    const std::string ns = l.HostNamespace(host), port = NetnsLayout::SwitchPort(host);
    const std::vector<std::vector<std::string>> host_steps = {
        {ip_, "netns", "add", ns},
        {ip_, "-n", ns, "link", "set", "lo", "up"},
        {ip_, "-n", sw, "link", "add", port, "type", "veth", "peer", "name", l.ifname, "netns",
         ns},
        {ip_, "-n", sw, "link", "set", port, "master", br},
        {ip_, "-n", sw, "link", "set", port, "up"},
        {ip_, "-n", ns, "addr", "add", l.Address(host) + "/24", "dev", l.ifname},
        {ip_, "-n", ns, "link", "set", l.ifname, "up"},
    };
    steps.insert(steps.end(), host_steps.begin(), host_steps.end());
    // Uplink (host side) and downlink (switch side): one htb class each.
    for (const auto& [where, dev, peer_match] :
         {std::tuple<std::string, std::string, std::string>{ns, l.ifname, "dst"},
          std::tuple<std::string, std::string, std::string>{sw, port, "src"}}) {
      steps.push_back({tc_, "-n", where, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb",
                       "default", "10"});
      steps.push_back({tc_, "-n", where, "class", "add", "dev", dev, "parent", "1:", "classid",
                       "1:10", "htb", "rate", TcRate(rate_bps), "ceil", TcRate(rate_bps)});
      if (l.root_link) {
        steps.push_back({tc_, "-n", where, "class", "add", "dev", dev, "parent", "1:", "classid",
                         "1:20", "htb", "rate", TcRate(kControlRateBps), "ceil",
                         TcRate(kControlRateBps)});
        steps.push_back({tc_, "-n", where, "filter", "add", "dev", dev, "parent", "1:",
                         "protocol", "ip", "prio", "1", "u32", "match", "ip", peer_match,
                         l.RootAddress() + "/32", "flowid", "1:20"});
      }
    }
  }
  for (const std::vector<std::string>& step : steps) {
    if (absl::Status status = Check(step); !status.ok()) return status;
  }
  return absl::OkStatus();
}

NetnsNetwork::~NetnsNetwork() {
  if (owned_) (void)Destroy();
}

absl::Status NetnsNetwork::Destroy() {
  (void)SignalAll(SIGKILL);
  const std::vector<std::string> existing = ListNamespaces(layout_.prefix);
  std::vector<std::string> failed;
  for (const std::string& ns : layout_.Namespaces()) {
    if (std::find(existing.begin(), existing.end(), ns) == existing.end()) continue;
    CommandResult del = RunCommand({ip_, "netns", "del", ns});
    if (del.exit_code != 0) failed.push_back(ns + ": " + del.output);
  }
  owned_ = false;
  if (!failed.empty()) {
    return absl::InternalError("cannot delete namespaces: " + absl::StrJoin(failed, "; "));
  }
  return absl::OkStatus();
}

absl::Status NetnsNetwork::SetRate(const std::string& host, std::optional<double> up_bps,
                                   std::optional<double> down_bps) {
  if (!layout_.HasHost(host)) return absl::NotFoundError("unknown host '" + host + "'");
  for (const auto& [ns, dev, bps] :
       {std::tuple<std::string, std::string, std::optional<double>>{layout_.HostNamespace(host),
                                                                     layout_.ifname, up_bps},
        std::tuple<std::string, std::string, std::optional<double>>{
            layout_.SwitchNamespace(), NetnsLayout::SwitchPort(host), down_bps}}) {
    if (!bps.has_value()) continue;
    absl::Status status = Check({tc_, "-n", ns, "class", "change", "dev", dev, "parent", "1:",
                                 "classid", "1:10", "htb", "rate", TcRate(*bps), "ceil",
                                 TcRate(*bps)});
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, LinkBytes>> NetnsNetwork::ReadLinkBytes() const {
  auto text = ReadNetDev(layout_.SwitchNamespace());
  if (!text.ok()) return text.status();
  std::map<std::string, LinkBytes> counters;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name.rfind("p-", 0) != 0 || !layout_.HasHost(name.substr(2))) continue;
    // rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes ...
    std::istringstream fields(line.substr(colon + 1));
    uint64_t values[9] = {};
    for (uint64_t& value : values) fields >> value;
    if (!fields) return absl::InternalError("cannot parse /proc/net/dev line: " + line);
    // The switch port receives what the host sends and sends what it gets.
    counters[name.substr(2)] = LinkBytes{values[0], values[8]};
  }
  if (counters.size() != layout_.hosts.size()) {
    return absl::NotFoundError(
        absl::StrCat("found ", counters.size(), " of ", layout_.hosts.size(), " switch ports in ",
                     layout_.SwitchNamespace()));
  }
  return counters;
}

std::vector<std::string> NetnsNetwork::Wrap(const std::string& host,
                                            const std::vector<std::string>& argv) const {
  std::vector<std::string> wrapped = {ip_, "netns", "exec", layout_.HostNamespace(host)};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

absl::StatusOr<std::string> NetnsNetwork::Exec(const std::string& host,
                                               const std::vector<std::string>& argv) const {
  if (!layout_.HasHost(host)) return absl::NotFoundError("unknown host '" + host + "'");
  const std::vector<std::string> wrapped = Wrap(host, argv);
  CommandResult result = RunCommand(wrapped);
  if (result.exit_code != 0) {
    return absl::InternalError(absl::StrCat("`", absl::StrJoin(argv, " "), "` in ", host,
                                            " failed (exit ", result.exit_code,
                                            "): ", result.output));
  }
  return result.output;
}

int NetnsNetwork::SignalAll(int signal) const {
  const std::vector<std::string> existing = ListNamespaces(layout_.prefix);
  int count = 0;
  for (const std::string& ns : layout_.Namespaces()) {
    if (std::find(existing.begin(), existing.end(), ns) == existing.end()) continue;
    CommandResult pids = RunCommand({ip_, "netns", "pids", ns});
    std::istringstream in(pids.output);
    int pid = 0;
    while (in >> pid) {
      if (pid > 0 && ::kill(pid, signal) == 0) ++count;
    }
  }
  return count;
}

std::vector<std::string> NetnsNetwork::ListNamespaces(const std::string& prefix) {
  std::vector<std::string> names;
  const std::string ip = FindTool("ip");
  if (ip.empty()) return names;
  CommandResult list = RunCommand({ip, "netns", "list"});
  std::istringstream lines(list.output);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string name;
    if (words >> name && name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

std::vector<std::string> NetnsNetwork::CleanupPrefix(const std::string& prefix) {
  std::vector<std::string> removed;
  const std::string ip = FindTool("ip");
  if (ip.empty() || prefix.empty()) return removed;
  for (const std::string& ns : ListNamespaces(prefix)) {
    CommandResult pids = RunCommand({ip, "netns", "pids", ns});
    std::istringstream in(pids.output);
    int pid = 0;
    while (in >> pid) {
      if (pid > 0) ::kill(pid, SIGKILL);
    }
    if (RunCommand({ip, "netns", "del", ns}).exit_code == 0) removed.push_back(ns);
  }
  return removed;
}

}  // namespace mlfabric::launch
