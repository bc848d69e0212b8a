// NicClasses with a recording runner and a fake clock: what tc would be
// asked to do at start-up, on a class change, on a TLs-RR rotation, on a
// tc failure and at stop. nicprio_netns_test runs real tc; the daemon's
// own use of it is tests/nic_classes_daemon_test.sh.
#include "daemon/nicprio/nic_classes.h"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "daemon/nicprio/tc_runner.h"

namespace mlfabric::nicprio {
namespace {

// Records every command line; fails those that contain `fail_on`.
class Recorder {
 public:
  NicClasses::Runner runner() {
    return [this](const std::vector<TcCommand>& commands) -> absl::Status {
      MutexLock lock(&mu_);
      for (const TcCommand& c : commands) {
        const std::string line = FormatCommand(c);
        if (!fail_on_.empty() && line.find(fail_on_) != std::string::npos) {
          return absl::InternalError("'" + line + "' failed (exit status 2)");
        }
        lines_.push_back(line);
      }
      return absl::OkStatus();
    };
  }
  void FailOn(std::string text) {
    MutexLock lock(&mu_);
    fail_on_ = std::move(text);
  }
  std::vector<std::string> Take() {
    MutexLock lock(&mu_);
    return std::exchange(lines_, {});
  }

 private:
  Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  std::string fail_on_ ABSL_GUARDED_BY(mu_);
};

NicClasses::Options TwoJobs(daemon::JobPriorityMode mode) {
  NicClasses::Options options;
  options.nic.interface = "veth0";
  options.nic.link_rate_bps = 1e9;
  options.jobs = ParseNicJobs("jobA:2222;jobB:3333,3334").value();
  options.priority.mode = mode;
  options.priority.rotation_period_s = 20;
  return options;
}

// Waits (up to 10 s; the thread runs tc asynchronously) for `ready`.
template <typename Ready>
bool Eventually(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

std::string Joined(const std::vector<std::string>& v) { return absl::StrJoin(v, ","); }

TEST_CASE("NicClasses installs the listed jobs in order and removes them at stop") {
  FakeClock clock(1000);
  Recorder tc;
  auto classes = NicClasses::Start(TwoJobs(daemon::JobPriorityMode::kOne), &clock, tc.runner());
  REQUIRE(classes.ok());
  CHECK(Joined((*classes)->Installed()) == "jobA,jobB");
  std::vector<std::string> setup = tc.Take();
  REQUIRE(setup.size() >= 3);
  CHECK(setup[0] == "tc qdisc add dev veth0 root handle 1: htb default ff");
  // jobA (class 1:10) prio 0, jobB (1:11) prio 1.
  CHECK(Joined(setup).find("classid 1:10 htb rate 1000kbit ceil 1000000kbit prio 0") !=
        std::string::npos);
  CHECK(Joined(setup).find("classid 1:11 htb rate 1000kbit ceil 1000000kbit prio 1") !=
        std::string::npos);
  (*classes)->Stop();
  CHECK(Joined(tc.Take()) == "tc qdisc del dev veth0 root");
  (*classes)->Stop();  // once only
  CHECK(tc.Take().empty());
}

TEST_CASE("A job's priority class from the scheduler re-ranks the NIC classes") {
  FakeClock clock(1000);
  Recorder tc;
  auto classes = NicClasses::Start(TwoJobs(daemon::JobPriorityMode::kOne), &clock, tc.runner());
  REQUIRE(classes.ok());
  tc.Take();
  CHECK_FALSE((*classes)->SetJobClass("jobC", 3));  // not listed here: nothing to do
  CHECK((*classes)->SetJobClass("jobA", 2));         // jobB (class 0) goes first now
  REQUIRE(Eventually([&] { return (*classes)->rerankings() == 1; }));
  CHECK(Joined((*classes)->Installed()) == "jobB,jobA");
  std::vector<std::string> rerank = tc.Take();
  // Only the prio values change: classes and filters stay.
  REQUIRE(rerank.size() == 2);
  CHECK(rerank[0].find("tc class change dev veth0") == 0);
  CHECK(Joined(rerank).find("classid 1:11 htb rate 1000kbit ceil 1000000kbit prio 0") !=
        std::string::npos);
  CHECK(Joined(rerank).find("classid 1:10 htb rate 1000kbit ceil 1000000kbit prio 1") !=
        std::string::npos);
  // The same class again changes nothing.
  CHECK((*classes)->SetJobClass("jobA", 2));
  CHECK((*classes)->SetJobClass("jobB", 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK((*classes)->rerankings() == 1);
  CHECK(tc.Take().empty());
  // Back to class 0: list order again.
  CHECK((*classes)->SetJobClass("jobA", 0));
  REQUIRE(Eventually([&] { return (*classes)->rerankings() == 2; }));
  CHECK(Joined((*classes)->Installed()) == "jobA,jobB");
}

TEST_CASE("TLs-RR rotates the NIC classes every period of the daemon's clock") {
  FakeClock clock(5);  // period 20 s from epoch 0: rotation 0 until 20
  Recorder tc;
  auto classes = NicClasses::Start(TwoJobs(daemon::JobPriorityMode::kRr), &clock, tc.runner());
  REQUIRE(classes.ok());
  CHECK(Joined((*classes)->Installed()) == "jobA,jobB");
  clock.Set(21);
  REQUIRE(Eventually([&] { return (*classes)->rerankings() == 1; }));
  CHECK(Joined((*classes)->Installed()) == "jobB,jobA");
  clock.Set(41);
  REQUIRE(Eventually([&] { return (*classes)->rerankings() == 2; }));
  CHECK(Joined((*classes)->Installed()) == "jobA,jobB");
}

TEST_CASE("A tc failure after start-up keeps the old ranking and is retried at the next change") {
  FakeClock clock(1000);
  Recorder tc;
  auto classes = NicClasses::Start(TwoJobs(daemon::JobPriorityMode::kOne), &clock, tc.runner());
  REQUIRE(classes.ok());
  tc.Take();
  tc.FailOn("class change");
  CHECK((*classes)->SetJobClass("jobA", 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK((*classes)->rerankings() == 0);
  CHECK(Joined((*classes)->Installed()) == "jobA,jobB");
  tc.FailOn("");
  CHECK((*classes)->SetJobClass("jobA", 2));  // a change: tried again
  REQUIRE(Eventually([&] { return (*classes)->rerankings() == 1; }));
  CHECK(Joined((*classes)->Installed()) == "jobB,jobA");
}

TEST_CASE("Start-up errors say what is wrong and leave the NIC as it was") {
  FakeClock clock(0);
  Recorder tc;
  SECTION("fifo has no ranking to install") {
    auto classes =
        NicClasses::Start(TwoJobs(daemon::JobPriorityMode::kFifo), &clock, tc.runner());
    REQUIRE_FALSE(classes.ok());
    CHECK(classes.status().message().find("job_priority one or rr") != std::string::npos);
  }
  SECTION("a bad interface name") {
    NicClasses::Options options = TwoJobs(daemon::JobPriorityMode::kOne);
    options.nic.interface = "eth 0";
    auto classes = NicClasses::Start(options, &clock, tc.runner());
    REQUIRE_FALSE(classes.ok());
    CHECK(classes.status().message().find("'eth 0' is not a valid Linux interface name") !=
          std::string::npos);
  }
  SECTION("the NIC already has a root qdisc: nothing is removed") {
    tc.FailOn("qdisc add");
    auto classes = NicClasses::Start(TwoJobs(daemon::JobPriorityMode::kOne), &clock, tc.runner());
    REQUIRE_FALSE(classes.ok());
    CHECK(classes.status().message().find("nothing was changed on veth0") != std::string::npos);
  }
  SECTION("a later set-up command fails: what was installed is removed") {
    tc.FailOn("filter add");
    auto classes = NicClasses::Start(TwoJobs(daemon::JobPriorityMode::kOne), &clock, tc.runner());
    REQUIRE_FALSE(classes.ok());
    CHECK(classes.status().message().find("was removed") != std::string::npos);
    std::vector<std::string> lines = tc.Take();
    REQUIRE_FALSE(lines.empty());
    CHECK(lines.back() == "tc qdisc del dev veth0 root");
  }
  CHECK(Joined(tc.Take()).find("qdisc del") == std::string::npos);
}

TEST_CASE("ParseNicJobs names what is wrong") {
  CHECK(ParseNicJobs("").value().empty());
  auto jobs = ParseNicJobs("a:1;b:2,3").value();
  REQUIRE(jobs.size() == 2);
  CHECK(jobs[1].ports == std::vector<uint16_t>{2, 3});
  CHECK(ParseNicJobs("a").status().message() == "'a': expected NAME:PORT[,PORT...]");
  CHECK(ParseNicJobs("a:70000").status().message() == "'a:70000': '70000' is not a TCP port");
  CHECK(ParseNicJobs("a:1;a:2").status().message() == "job 'a' is listed twice");
}

}  // namespace
}  // namespace mlfabric::nicprio
