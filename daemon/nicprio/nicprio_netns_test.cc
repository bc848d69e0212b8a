// Integration test: real tc in a throw-away network namespace.
//
// Needs `ip netns add` (root / CAP_SYS_ADMIN + CAP_NET_ADMIN). When the
// namespace cannot be created the test prints "SKIPPED: <reason>" and
// asserts nothing else, so a skip is always visible in the test log.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/nicprio/tc_commands.h"
#include "testing/prereq.h"

namespace mlfabric::nicprio {
namespace {

struct Result {
  int exit_code;
  std::string output;  // stdout + stderr
};

Result Shell(const std::string& command) {
  Result result{-1, ""};
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// A namespace with veth0 <-> veth1, deleted on destruction.
class Namespace {
 public:
  Namespace() : name_(absl::StrCat("mlfnp", getpid())) {}
  ~Namespace() {
    if (created_) Shell("ip netns del " + name_);
  }
  // Empty on success, else why not.
  std::string Create() {
    if (Shell("command -v ip && command -v tc").exit_code != 0) {
      return "the ip and tc tools are not installed";
    }
    Result add = Shell("ip netns add " + name_);
    if (add.exit_code != 0) return "cannot create a network namespace: " + add.output;
    created_ = true;
    Result veth = Shell("ip -n " + name_ + " link add veth0 type veth peer name veth1 && ip -n " +
                        name_ + " link set veth0 up && ip -n " + name_ + " link set veth1 up");
    if (veth.exit_code != 0) return "cannot create a veth pair: " + veth.output;
    return "";
  }
  Result Exec(const std::string& command) {
    return Shell("ip netns exec " + name_ + " " + command);
  }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  bool created_ = false;
};

// The class line of `classid` in `tc class show` output ("" if absent).
std::string ClassLine(const std::string& show, const std::string& classid) {
  for (absl::string_view line : absl::StrSplit(show, '\n')) {
    if (absl::StartsWith(line, absl::StrCat("class htb ", classid, " "))) {
      return std::string(line);
    }
  }
  return "";
}

bool WaitFor(Namespace& ns, const std::string& classid, const std::string& needle,
             double deadline_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (absl::StrContains(ClassLine(ns.Exec("tc class show dev veth0").output, classid),
                          needle)) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::string BinaryPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "mlfabric",
                      "/daemon/nicprio/mlfabric-nicprio");
}

const std::vector<NicJob> kJobs = {{"a", {2222}}, {"b", {3333, 3334}}};

TEST_CASE("Library commands install, re-rank and remove htb classes in a namespace") {
  Namespace ns;
  if (std::string why = ns.Create(); !why.empty()) {
    MLFABRIC_SKIP_TEST(why);
  }
  NicPrioConfig config{"veth0", 1e9, 1e6, 7};
  auto setup = SetupCommands(config, kJobs, {0, 1});
  REQUIRE(setup.ok());
  for (const TcCommand& c : *setup) {
    Result r = ns.Exec(FormatCommand(c));
    INFO(FormatCommand(c) << ": " << r.output);
    REQUIRE(r.exit_code == 0);
  }
  std::string classes = ns.Exec("tc class show dev veth0").output;
  INFO(classes);
  CHECK(absl::StrContains(ClassLine(classes, "1:10"), "parent 1:1 prio 0"));
  CHECK(absl::StrContains(ClassLine(classes, "1:11"), "parent 1:1 prio 1"));
  CHECK(absl::StrContains(ClassLine(classes, "1:ff"), "prio 7"));
  CHECK(absl::StrContains(ClassLine(classes, "1:1"), "rate 1Gbit ceil 1Gbit"));
  std::string filters = ns.Exec("tc filter show dev veth0").output;
  INFO(filters);
  // Port 3333 = 0x0d05 as source (high half) and destination (low half).
  CHECK(absl::StrContains(filters, "match 0d050000/ffff0000 at 20"));
  CHECK(absl::StrContains(filters, "match 00000d05/0000ffff at 20"));
  CHECK(absl::StrContains(filters, "flowid 1:11"));

  auto rotate = RankCommands(config, kJobs, {1, 0});
  REQUIRE(rotate.ok());
  for (const TcCommand& c : *rotate) REQUIRE(ns.Exec(FormatCommand(c)).exit_code == 0);
  classes = ns.Exec("tc class show dev veth0").output;
  CHECK(absl::StrContains(ClassLine(classes, "1:10"), "prio 1"));
  CHECK(absl::StrContains(ClassLine(classes, "1:11"), "prio 0"));

  for (const TcCommand& c : TeardownCommands(config)) {
    REQUIRE(ns.Exec(FormatCommand(c)).exit_code == 0);
  }
  CHECK_FALSE(absl::StrContains(ns.Exec("tc qdisc show dev veth0").output, "htb"));
}

TEST_CASE("mlfabric-nicprio rotates every period (rr) and cleans up on SIGTERM") {
  Namespace ns;
  if (std::string why = ns.Create(); !why.empty()) {
    MLFABRIC_SKIP_TEST(why);
  }
  const std::string binary = BinaryPath();
  REQUIRE(access(binary.c_str(), X_OK) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    execlp("ip", "ip", "netns", "exec", ns.name().c_str(), binary.c_str(),
           "--interface=veth0", "--mode=rr", "--period_s=1", "--job=a:2222",
           "--job=b:3333,3334", static_cast<char*>(nullptr));
    _exit(127);
  }
  // Installed with a ranked first, then rotated so b is first.
  CHECK(WaitFor(ns, "1:10", "prio 0", 5.0));
  CHECK(WaitFor(ns, "1:11", "prio 1", 1.0));
  CHECK(WaitFor(ns, "1:11", "prio 0", 5.0));
  CHECK(WaitFor(ns, "1:10", "prio 1", 1.0));
  // And back (period 2).
  CHECK(WaitFor(ns, "1:10", "prio 0", 5.0));
  REQUIRE(kill(pid, SIGTERM) == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_FALSE(absl::StrContains(ns.Exec("tc qdisc show dev veth0").output, "htb"));
}

TEST_CASE("Without CAP_NET_ADMIN the tool explains and changes nothing") {
  Namespace ns;
  if (std::string why = ns.Create(); !why.empty()) {
    MLFABRIC_SKIP_TEST(why);
  }
  if (Shell("command -v capsh").exit_code != 0) {
    MLFABRIC_SKIP_TEST("capsh is not installed, cannot drop CAP_NET_ADMIN");
  }
  const std::string before = ns.Exec("tc qdisc show dev veth0").output;
  Result r = ns.Exec("capsh --drop=cap_net_admin -- -c '" + BinaryPath() +
                     " --interface=veth0 --mode=one --job=a:2222'");
  INFO(r.output);
  CHECK(r.exit_code == 3);
  CHECK(absl::StrContains(r.output, "CAP_NET_ADMIN"));
  CHECK(absl::StrContains(r.output, "Nothing was changed"));
  CHECK(ns.Exec("tc qdisc show dev veth0").output == before);
}

}  // namespace
}  // namespace mlfabric::nicprio
