// mlfabricd keeps TensorLights classes on its host's NIC
// (--nic_priority_interface; daemon/nicprio/nic_classes.h), end to end:
// a real scheduler with its admin endpoint, a real daemon in a network
// namespace, real tc. The daemon installs the jobs' classes when it
// starts, re-ranks them when the admin endpoint changes a job's priority
// class, and removes them when it stops. A daemon that may not or cannot
// install them does not start, and says why.
//
// Needs root, `ip` and `tc` (a namespace per host): prints
// "SKIPPED: <reason>" without them, fails under CI.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "launch/cluster.h"
#include "launch/process.h"
#include "testing/http_client.h"
#include "testing/prereq.h"

namespace mlfabric {
namespace {

using launch::ReadFile;
using launch::WaitUntil;

constexpr char kToken[] = "test-admin-token";
constexpr char kNic[] = "nicp0";

// `tc ... show dev nicp0` inside w1's namespace.
std::string Show(launch::Cluster& c, const std::string& what) {
  absl::StatusOr<std::string> out = c.Exec("w1", {"tc", what, "show", "dev", kNic});
  return out.ok() ? *out : "error: " + out.status().ToString();
}

// The htb prio of class `classid` in `tc class show` output, or -1.
int Prio(const std::string& classes, const std::string& classid) {
  const std::string head = "class htb " + classid + " ";
  size_t at = classes.find(head);
  if (at == std::string::npos) return -1;
  const size_t end = classes.find('\n', at);
  const std::string line = classes.substr(at, end - at);
  const size_t prio = line.find(" prio ");
  return prio == std::string::npos ? -1 : std::atoi(line.c_str() + prio + 6);
}

TEST_CASE("mlfabricd ranks jobs on its NIC, follows the admin endpoint and cleans up") {
  launch::ClusterOptions options;
  options.topology = launch::Topology::kNetns;
  options.hosts = {"s1", "w1"};
  options.admin = true;
  auto cluster = launch::Cluster::Create(options);
  if (cluster.status().code() == absl::StatusCode::kFailedPrecondition) {
    MLFABRIC_SKIP_TEST(std::string(cluster.status().message()));
  }
  REQUIRE(cluster.ok());
  launch::Cluster& c = **cluster;
  // A second NIC in w1's namespace for the classes: veth0 carries the
  // emulated link's own htb shaping.
  auto added = c.Exec("w1", {"ip", "link", "add", kNic, "type", "veth", "peer", "name", "nicp1"});
  INFO(added.status().ToString());
  REQUIRE(added.ok());
  const std::string config = c.dir() + "/scheduler.json";
  std::ofstream(config) << R"({"jobs": [{"name": "demo", "token": "demo-token-0123456789"},)"
                        << R"( {"name": "other", "token": "other-token-0123456789"}]})";
  const std::vector<std::string> nic_flags = {
      "--job_priority=one", std::string("--nic_priority_interface=") + kNic,
      "--nic_priority_jobs=demo:2222,2223;other:3333", "--nic_priority_link_bps=1e9"};
  absl::Status started = c.Start({"--config=" + config, "--admin_token=" + std::string(kToken)},
                                 {}, {{"w1", nic_flags}});
  INFO(started.ToString() << "\nw1.log:\n" << ReadFile(c.dir() + "/w1.log"));
  REQUIRE(started.ok());

  // Installed at start-up in list order: demo (class 1:10) first.
  std::string classes = Show(c, "class");
  INFO("tc class show:\n" << classes);
  CHECK(Prio(classes, "1:10") == 0);
  CHECK(Prio(classes, "1:11") == 1);
  const std::string filters = Show(c, "filter");
  INFO("tc filter show:\n" << filters);
  for (const char* port : {"08ae", "08af", "0d05"}) {  // 2222, 2223, 3333
    CHECK(filters.find(std::string("0000") + port) != std::string::npos);
  }

  // The admin endpoint puts demo in class 2: "other" (class 0) goes first
  // on the NIC, without the daemon carrying either job's traffic.
  testing::HttpResult posted = testing::Http(c.admin_port(), "POST", "/api/v1/jobs/demo",
                                             R"({"priority_class": 2})",
                                             std::string("Bearer ") + kToken);
  INFO(posted.body);
  REQUIRE(posted.status == 200);
  CHECK(WaitUntil([&] {
    const std::string now = Show(c, "class");
    return Prio(now, "1:10") == 1 && Prio(now, "1:11") == 0;
  }, 10));
  CHECK(WaitUntil([&] {
    return ReadFile(c.dir() + "/w1.log").find("NIC priorities on nicp0: other > demo") !=
           std::string::npos;
  }, 10));
  // s1 keeps no NIC classes: it hears the class for its queue only.
  CHECK(ReadFile(c.dir() + "/s1.log").find("NIC priorities") == std::string::npos);

  // A daemon that stops removes what it installed.
  c.daemon("w1").Signal(SIGTERM);
  CHECK(WaitUntil([&] { return !c.daemon("w1").Running(); }, 20));
  CHECK(Show(c, "qdisc").find("htb") == std::string::npos);
  CHECK(ReadFile(c.dir() + "/w1.log").find("NIC priorities on nicp0 removed") !=
        std::string::npos);

  // The interface now has someone else's root qdisc: the restarted daemon
  // refuses to start, says why, and leaves that qdisc alone.
  REQUIRE(c.Exec("w1", {"tc", "qdisc", "add", "dev", kNic, "root", "handle", "1:", "htb"}).ok());
  absl::Status restarted = c.RestartDaemon("w1");
  CHECK_FALSE(restarted.ok());
  const std::string log = ReadFile(c.dir() + "/w1.log");
  INFO(log);
  CHECK(log.find("--nic_priority_interface=nicp0: 'tc qdisc add dev nicp0 root handle 1: htb "
                 "default ff' failed (exit status 2); nothing was changed on nicp0") !=
        std::string::npos);
  CHECK(Show(c, "qdisc").find("qdisc htb 1: root") != std::string::npos);
}

}  // namespace
}  // namespace mlfabric
