#include "tools/run/hosts.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "launch/process.h"

namespace mlfabric::run {

absl::StatusOr<std::vector<HostfileEntry>> ParseHostfile(const std::string& text) {
  std::vector<HostfileEntry> entries;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    line = line.substr(0, line.find('#'));
    std::vector<std::string> words = absl::StrSplit(line, absl::ByAnyChar(" \t\r"),
                                                    absl::SkipEmpty());
    if (words.empty()) continue;
    HostfileEntry entry;
    entry.host = words[0];
    for (size_t i = 1; i < words.size(); ++i) {
      if (words[i].rfind("slots=", 0) == 0) {
        if (!absl::SimpleAtoi(words[i].substr(6), &entry.slots) || entry.slots < 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "hostfile line ", number, ": '", words[i], "' is not slots=N with N >= 1"));
        }
      }
    }
    if (!seen.insert(entry.host).second) {
      return absl::InvalidArgumentError(absl::StrCat("hostfile line ", number, ": host '",
                                                     entry.host, "' is named twice"));
    }
    entries.push_back(entry);
  }
  if (entries.empty()) return absl::InvalidArgumentError("the hostfile names no host");
  return entries;
}

namespace {

// An IPv4 or IPv6 socket address as text; "" for other families.
std::string AddressText(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text,
                sizeof(text));
  } else if (address->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text,
                sizeof(text));
  }
  return text;
}

}  // namespace

std::vector<std::string> LocalNames() {
  std::vector<std::string> names;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr) continue;
      if (std::string text = AddressText(a->ifa_addr); !text.empty()) names.push_back(text);
    }
    ::freeifaddrs(list);
  }
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') {
    names.push_back(host);
    const std::string full = host;
    if (full.find('.') != std::string::npos) names.push_back(full.substr(0, full.find('.')));
  }
  return names;
}

namespace {

std::vector<std::string> Resolve(const std::string& host, int family) {
  std::vector<std::string> addresses;
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0) return addresses;
  for (addrinfo* a = result; a != nullptr; a = a->ai_next) {
    if (std::string text = AddressText(a->ai_addr); !text.empty()) addresses.push_back(text);
  }
  ::freeaddrinfo(result);
  return addresses;
}

volatile sig_atomic_t g_stop = 0;
void OnStop(int) { g_stop = 1; }

}  // namespace

int FindLocalHost(const std::vector<std::string>& hosts, const std::vector<std::string>& local) {
  auto is_local = [&](const std::string& name) {
    return std::find(local.begin(), local.end(), name) != local.end();
  };
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (is_local(hosts[i])) return static_cast<int>(i);
  }
  for (size_t i = 0; i < hosts.size(); ++i) {
    for (const std::string& address : Resolve(hosts[i], AF_UNSPEC)) {
      if (is_local(address)) return static_cast<int>(i);
    }
  }
  return -1;
}

std::string ResolveIpv4(const std::string& host) {
  std::vector<std::string> addresses = Resolve(host, AF_INET);
  return addresses.empty() ? "" : addresses.front();
}

std::string RouteSource(const std::string& host) {
  const std::string ip = ResolveIpv4(host);
  if (ip.empty()) return "";
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return "";
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);
  ::inet_pton(AF_INET, ip.c_str(), &to.sin_addr);
  sockaddr_in from{};
  socklen_t length = sizeof(from);
  std::string source;
  // A UDP connect sends nothing; it only picks the route and its source.
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&from), &length) == 0) {
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &from.sin_addr, text, sizeof(text));
    source = text;
  }
  ::close(fd);
  return source;
}

namespace {

// What the launcher is told (mlfabric-run passes it through mpirun).
struct HostDaemonArgs {
  std::string dir, scheduler;
  std::vector<std::string> hosts, daemon_args;
};

// Parses --dir, --scheduler, --hosts and --daemon_arg. Returns 0, or the
// exit code.
int ParseHostDaemonArgs(int argc, char** argv, int first, HostDaemonArgs* a) {
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--dir") {
      a->dir = value();
    } else if (arg == "--scheduler") {
      a->scheduler = value();
    } else if (arg == "--hosts") {
      a->hosts = absl::StrSplit(value(), ',', absl::SkipEmpty());
    } else if (arg == "--daemon_arg") {
      a->daemon_args.push_back(value());
    } else {
      std::cerr << "mlfabric-run --exec-daemon: unknown argument " << arg << "\n";
      return 2;
    }
  }
  if (a->dir.empty() || a->scheduler.empty() || a->hosts.empty()) {
    std::cerr << "mlfabric-run --exec-daemon: needs --dir, --scheduler and --hosts\n";
    return 2;
  }
  return 0;
}

// Which of the hosts this machine is: by address or name, else by the
// launcher's rank (mpirun places one launcher per host in hostfile
// order). Empty if neither says.
std::string ThisHost(const std::vector<std::string>& hosts) {
  int index = FindLocalHost(hosts, LocalNames());
  if (index < 0) {
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    index = rank != nullptr ? std::atoi(rank) : -1;
    if (index < 0 || index >= static_cast<int>(hosts.size())) {
      std::cerr << "mlfabric-run --exec-daemon: none of the hosts (" << absl::StrJoin(hosts, ",")
                << ") is an address or name of this machine\n";
      return "";
    }
  }
  return hosts[index];
}

// Forks and execs the daemon with its output in `log`; it goes when this
// launcher goes, even by SIGKILL (mpirun kills what is left of a job it
// tears down). Returns its pid, or -1.
pid_t StartDaemon(std::vector<std::string> args, const std::string& log) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (out >= 0) {
      ::dup2(out, 1);
      ::dup2(out, 2);
      ::close(out);
    }
    std::vector<char*> exec_args;
    for (std::string& a : args) exec_args.push_back(a.data());
    exec_args.push_back(nullptr);
    ::execv(exec_args[0], exec_args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", exec_args[0], std::strerror(errno));
    ::_exit(127);
  }
  if (pid < 0) std::cerr << "mlfabric-run --exec-daemon: fork: " << std::strerror(errno) << "\n";
  return pid;
}

// Until the launcher is told to stop or the daemon exits: once the daemon
// listens it has read its secret, which is removed, and the host says it
// serves. Returns the daemon's exit code if it exited (a failure: a daemon
// that leaves during a job), or 0 once it was stopped.
int SuperviseDaemon(pid_t pid, const std::string& host, const std::string& socket,
                    const std::string& secret_file, const std::string& log) {
  int status = 0;
  bool secret_removed = false;
  while (!g_stop) {
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      std::string tail = launch::ReadFile(log);
      if (tail.size() > 600) tail = "..." + tail.substr(tail.size() - 600);
      std::cerr << "mlfabric-run: host " << host << ": mlfabricd exited with " << code << "; "
                << log << " ends:\n" << tail << "\n";
      return code == 0 ? 1 : code;
    }
    if (!secret_removed && ::access(socket.c_str(), F_OK) == 0) {
      ::unlink(secret_file.c_str());
      secret_removed = true;
      // mlfabric-run waits for this line from every host (mpirun forwards
      // it) before it starts the job.
      // One write: mpirun interleaves the hosts' output otherwise.
      const std::string line = "mlfabric-run: host " + host + ": mlfabricd serving\n";
      (void)!::write(2, line.data(), line.size());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(pid, SIGTERM);
  for (int i = 0; i < 100 && ::waitpid(pid, &status, WNOHANG) != pid; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (::kill(pid, 0) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  return 0;
}

}  // namespace

int RunHostDaemon(int argc, char** argv, int first) {
  HostDaemonArgs a;
  if (int code = ParseHostDaemonArgs(argc, argv, first, &a); code != 0) return code;
  const std::string host = ThisHost(a.hosts);
  if (host.empty()) return 1;
  const std::string address = ResolveIpv4(host);
  if (address.empty()) {
    std::cerr << "mlfabric-run --exec-daemon: host '" << host << "' has no IPv4 address\n";
    return 1;
  }
  ::mkdir(a.dir.c_str(), 0700);  // on other machines (here it exists)
  const std::string socket = a.dir + "/" + host + ".sock";
  const std::string secret_file = a.dir + "/" + host + ".secret";
  std::vector<std::string> args = {launch::BinaryPath("daemon/mlfabricd"), "--host=" + host,
                                   "--scheduler=" + a.scheduler, "--local_socket=" + socket,
                                   "--listen_address=" + address};
  if (const char* secret = std::getenv("MLFABRIC_CLUSTER_SECRET"); secret && *secret) {
    const int fd = ::open(secret_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::write(fd, secret, std::strlen(secret)) < 0) {
      std::cerr << "mlfabric-run --exec-daemon: cannot write " << secret_file << ": "
                << std::strerror(errno) << "\n";
      if (fd >= 0) ::close(fd);
      return 1;
    }
    ::close(fd);
    args.push_back("--cluster_secret_file=" + secret_file);
  }
  args.insert(args.end(), a.daemon_args.begin(), a.daemon_args.end());
  const std::string log = a.dir + "/" + host + ".log";

  signal(SIGTERM, OnStop);
  signal(SIGINT, OnStop);
  signal(SIGHUP, OnStop);
  const pid_t pid = StartDaemon(std::move(args), log);
  if (pid < 0) return 1;
  std::cerr << "mlfabric-run: host " << host << ": mlfabricd (pid " << pid << ") at " << address
            << ", socket " << socket << ", log " << log << "\n";
  const int code = SuperviseDaemon(pid, host, socket, secret_file, log);
  ::unlink(secret_file.c_str());
  ::unlink(socket.c_str());
  return code;
}

}  // namespace mlfabric::run
