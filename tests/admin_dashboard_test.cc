// The admin dashboard in a real browser: headless Debian `chromium` loads
// it from a live scheduler (two jobs, four hosts with reported bandwidth,
// workers pushing), with no console messages at all, shows the cluster,
// and a screenshot is saved as a test output (dashboard.png under
// $TEST_UNDECLARED_OUTPUTS_DIR, i.e. bazel-testlogs/tests/admin_dashboard_test/
// test.outputs/). Prints "SKIPPED: ..." and passes when chromium is absent.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "nlohmann/json.hpp"
#include "launch/cluster.h"
#include "launch/process.h"
#include "proto/scheduler.grpc.pb.h"
#include "testing/http_client.h"
#include "testing/prereq.h"

namespace mlfabric {
namespace {

using launch::BinaryPath;
using launch::ReadFile;
using launch::Subprocess;
using launch::WaitUntil;
using nlohmann::json;

constexpr char kChromium[] = "/usr/bin/chromium";

std::vector<std::string> ChromiumArgs(const std::string& profile_dir) {
  return {kChromium,
          "--headless",
          "--no-sandbox",
          "--disable-gpu",
          "--disable-quic",
          "--no-first-run",
          "--disable-background-networking",
          "--disable-component-update",
          "--disable-sync",
          "--disable-dev-shm-usage",
          "--hide-scrollbars",
          "--user-data-dir=" + profile_dir,
          "--enable-logging=stderr",
          "--v=0",
          "--window-size=1440,1250",
          // Lets the page's fetches and a few 1 s refreshes run before the
          // DOM is dumped or the screenshot taken.
          "--virtual-time-budget=3500"};
}

int64_t Applied(int port) {
  testing::HttpResult r = testing::Http(port, "GET", "/api/v1/cluster");
  if (r.status != 200) return -1;
  return json::parse(r.body)["stats"]["applied"].get<int64_t>();
}

TEST_CASE("The dashboard loads in headless chromium without console messages and shows the "
          "live cluster") {
  struct stat st;
  if (::stat(kChromium, &st) != 0) {
    MLFABRIC_SKIP_TEST(std::string(kChromium) +
                       " not installed (tools/deps/admin.deb; run tools/bootstrap)");
  }
  const std::string dir = launch::MakeTempDir("dashboard");
  setenv("HOME", dir.c_str(), 1);  // chromium wants a writable home
  const std::string config_path = dir + "/scheduler.json";
  std::ofstream(config_path) << R"({
    "planner": "fifo",
    "jobs": [
      {"name": "resnet", "token": "resnet-token", "tau_max": 6, "mode": "async",
       "momentum": 0.9, "priority_class": 0},
      {"name": "bert", "token": "bert-token", "tau_max": 4, "mode": "ssp", "staleness_k": 2,
       "priority_class": 1}
    ]})";
  const std::string admin_port_file = dir + "/admin.port";
  auto cluster = launch::Cluster::StartLoopback(
      {"s1", "w1", "w2", "w3"},
      {"--config=" + config_path, "--admin_port=0", "--admin_port_file=" + admin_port_file}, {},
      {}, /*cluster_secret=*/false);  // the test reports bandwidth for the hosts
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  launch::Cluster& c = **cluster;
  const int port = std::atoi(ReadFile(admin_port_file).c_str());
  REQUIRE(port > 0);

  // Measured bandwidth as a monitor would report it (Mbit/s-scale links so
  // transfers take visible time).
  auto stub = v1::Scheduler::NewStub(
      grpc::CreateChannel(c.scheduler_address(), grpc::InsecureChannelCredentials()));
  const std::vector<std::tuple<std::string, double, double>> links = {
      {"s1", 1e9, 400e6}, {"w1", 250e6, 1e9}, {"w2", 100e6, 1e9}, {"w3", 330e6, 500e6}};
  for (const auto& [host, up, down] : links) {
    v1::BandwidthReport report;
    report.set_host(host);
    report.set_uplink_bps(up);
    report.set_downlink_bps(down);
    v1::BandwidthAck ack;
    grpc::ClientContext context;
    REQUIRE(stub->ReportBandwidth(&context, report, &ack).ok());
  }

  const std::string dim = "--dim=131072";  // 512 KiB updates
  REQUIRE(c.StartApp("ps-resnet", {BinaryPath("testing/apps/sum_server"), "--socket=" + c.Socket("s1"),
                                   "--job=resnet", "--token=resnet-token", "--name=ps0", dim})
              .ok());
  REQUIRE(c.StartApp("ps-bert", {BinaryPath("testing/apps/sum_server"), "--socket=" + c.Socket("s1"),
                                 "--job=bert", "--token=bert-token", "--name=ps1", dim})
              .ok());
  REQUIRE(WaitUntil([&] {
    const std::string log = ReadFile(c.dir() + "/scheduler.log");
    return log.find("server ps0") != std::string::npos && log.find("server ps1") != std::string::npos;
  }, 30));
  std::vector<Subprocess*> workers;
  for (const auto& [name, job, server] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"w1", "resnet", "ps0"}, {"w2", "resnet", "ps0"}, {"w3", "bert", "ps1"}}) {
    auto worker = c.StartApp(name, {BinaryPath("testing/apps/vector_worker"),
                                    "--socket=" + c.Socket(name), "--name=" + name, "--job=" + job,
                                    "--token=" + job + "-token", "--server=" + server, dim,
                                    "--pushes=300", "--window=6"});
    REQUIRE(worker.ok());
    workers.push_back(*worker);
  }
  // Let a few seconds of history build up, then look while pushes go on.
  const bool progressed = WaitUntil([&] { return Applied(port) >= 40; }, 60);
  if (!progressed) {
    std::cout << "scheduler log:\n" << ReadFile(c.dir() + "/scheduler.log").substr(0, 6000)
              << "\nw1 log:\n" << workers[0]->Log().substr(0, 3000) << "\nw3 log:\n"
              << workers[2]->Log().substr(0, 3000) << "\ns1 daemon log:\n"
              << ReadFile(c.dir() + "/s1.log").substr(0, 3000) << "\n";
  }
  REQUIRE(progressed);
  // A vanished daemon: its pushes fail with a reason, the host shows down.
  c.daemon("w2").Signal(SIGKILL);
  REQUIRE(WaitUntil([&] {
    testing::HttpResult r = testing::Http(port, "GET", "/api/v1/cluster");
    return r.status == 200 && json::parse(r.body)["hosts_alive"] == 3;
  }, 30));
  std::this_thread::sleep_for(std::chrono::seconds(2));

  {
    testing::HttpResult drops = testing::Http(port, "GET", "/api/v1/drops");
    REQUIRE(drops.status == 200);
    INFO(drops.body.substr(0, 2000));
    // w2's in-flight pushes fail either because the receiving daemon saw
    // the session end or because the scheduler saw the host go down.
    const json by_reason = json::parse(drops.body)["by_reason"];
    CHECK((by_reason.contains("host_down") || by_reason.contains("connection_lost")));
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/";
  auto dom_args = ChromiumArgs(dir + "/profile-dom");
  dom_args.push_back("--dump-dom");
  dom_args.push_back(url);
  const std::string dom_log = dir + "/chromium-dom.log";
  // Subprocess merges stdout and stderr into the log: the DOM and the
  // browser's console lines end up in one file, which is all we need.
  auto dom = Subprocess::Start(dom_args, dom_log);
  REQUIRE(dom.ok());
  auto dom_code = (*dom)->WaitFor(90);
  const std::string dom_text = ReadFile(dom_log);
  INFO(dom_text.substr(0, 4000));
  REQUIRE(dom_code.has_value());
  CHECK(*dom_code == 0);
  std::istringstream lines(dom_text);
  std::string line;
  int console_lines = 0;
  while (std::getline(lines, line)) {
    if (line.find(":CONSOLE") != std::string::npos) {
      ++console_lines;
      std::cout << "browser console: " << line << "\n";
    }
  }
  CHECK(console_lines == 0);
  CHECK(dom_text.find("class=\"ok\">● live") != std::string::npos);
  CHECK(dom_text.find("data-updates=\"") != std::string::npos);
  for (const char* expected : {"<b>w1</b>", "<b>w3</b>", "<b>resnet</b>", "<b>bert</b>",
                               "ssp K=2", "250 Mbit/s", "planner fifo", ">down<"}) {
    INFO(expected);
    CHECK(dom_text.find(expected) != std::string::npos);
  }

  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string png = std::string(outputs ? outputs : dir.c_str()) + "/dashboard.png";
  auto shot_args = ChromiumArgs(dir + "/profile-shot");
  shot_args.push_back("--screenshot=" + png);
  shot_args.push_back(url);
  auto shot = Subprocess::Start(shot_args, dir + "/chromium-shot.log");
  REQUIRE(shot.ok());
  auto shot_code = (*shot)->WaitFor(90);
  INFO(ReadFile(dir + "/chromium-shot.log"));
  REQUIRE(shot_code.has_value());
  CHECK(*shot_code == 0);
  REQUIRE(::stat(png.c_str(), &st) == 0);
  CHECK(st.st_size > 20000);
  std::cout << "screenshot: " << png << " (" << st.st_size << " bytes)\n";
  for (Subprocess* worker : workers) worker->Stop(2.0);
  (void)workers;
}

}  // namespace
}  // namespace mlfabric
