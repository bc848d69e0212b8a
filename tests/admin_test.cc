// Cross-process tests of the admin endpoint and the monitor -> scheduler
// path: the real scheduler (with --admin_port), real daemons and
// applications on loopback, and real HTTP.
//  - /metrics parsed by the Python prometheus_client parser;
//  - JSON documents reflect a live cluster (model version, delays, batches,
//    trace export);
//  - POSTs need the bearer token; malformed requests get 4xx and the
//    scheduler keeps serving;
//  - end to end: a BandwidthMonitor replaying an N3 trace reports over real
//    gRPC; each change shows in the scheduler's network view within
//    lag + one period, and the next plan runs at the reported rate.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "common/clock.h"
#include "monitor/bandwidth_monitor.h"
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
using testing::Http;
using testing::RawHttp;

constexpr char kToken[] = "test-admin-token";

struct AdminCluster {
  std::unique_ptr<launch::Cluster> cluster;
  int admin_port = 0;

  static AdminCluster Start(const std::vector<std::string>& hosts,
                            std::vector<std::string> extra_flags = {},
                            std::map<std::string, std::vector<std::string>> host_flags = {}) {
    AdminCluster out;
    const std::string dir = launch::MakeTempDir("admin");
    const std::string port_file = dir + "/admin.port";
    std::vector<std::string> flags = {"--admin_port=0", "--admin_port_file=" + port_file,
                                      std::string("--admin_token=") + kToken};
    flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
    // Hosts are not authenticated: one test reports bandwidth for w1 as
    // its monitor would (tests/security_test covers authenticated hosts).
    auto cluster = launch::Cluster::StartLoopback(hosts, flags, {}, host_flags,
                                                   /*cluster_secret=*/false);
    INFO(cluster.status().ToString());
    REQUIRE(cluster.ok());
    out.cluster = std::move(*cluster);
    out.admin_port = std::atoi(ReadFile(port_file).c_str());
    REQUIRE(out.admin_port > 0);
    return out;
  }

  json Get(const std::string& target) const {
    testing::HttpResult r = Http(admin_port, "GET", target);
    INFO(target << " -> " << r.status << " " << r.body);
    REQUIRE(r.status == 200);
    return json::parse(r.body);
  }
};

std::string VenvPython() {
  const char* venv = std::getenv("MLFABRIC_VENV");
  return std::string(venv && *venv ? venv : "/opt/mlfabric/venv") + "/bin/python";
}

// A data file of this test (BinaryPath only finds executables).
std::string RunfilePath(const std::string& path) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return std::string(dir ? dir : ".") + "/mlfabric/" + path;
}

void RunWorkers(launch::Cluster& c, const std::vector<std::string>& workers, int pushes) {
  // Pushes to a server that has not registered yet are refused: wait for it.
  REQUIRE(WaitUntil(
      [&] { return ReadFile(c.dir() + "/scheduler.log").find("server ps0") != std::string::npos; },
      30));
  std::vector<Subprocess*> procs;
  for (const std::string& name : workers) {
    auto worker = c.StartApp(name, {BinaryPath("testing/apps/vector_worker"),
                                    "--socket=" + c.Socket(name), "--name=" + name, "--dim=256",
                                    "--pushes=" + std::to_string(pushes), "--window=4"});
    REQUIRE(worker.ok());
    procs.push_back(*worker);
  }
  for (Subprocess* proc : procs) {
    auto code = proc->WaitFor(60);
    INFO(proc->Log());
    REQUIRE(code.has_value());
    CHECK(*code == 0);
  }
}

TEST_CASE("JSON and /metrics describe the live cluster; prometheus_client parses /metrics") {
  AdminCluster ac = AdminCluster::Start({"s1", "w1", "w2"});
  launch::Cluster& c = *ac.cluster;
  auto server = c.StartApp("server", {BinaryPath("testing/apps/sum_server"),
                                      "--socket=" + c.Socket("s1"), "--dim=256"});
  REQUIRE(server.ok());
  RunWorkers(c, {"w1", "w2"}, 10);

  json jobs = ac.Get("/api/v1/jobs");
  REQUIRE(jobs["jobs"].size() == 1);
  CHECK(jobs["jobs"][0]["name"] == "demo");
  CHECK(jobs["jobs"][0]["applied"] == 20);
  CHECK(jobs["jobs"][0]["servers"][0]["model_version"] >= 20);
  json hosts = ac.Get("/api/v1/hosts");
  CHECK(hosts["hosts"].size() == 3);
  json delays = ac.Get("/api/v1/delays");
  CHECK(delays["histogram"]["total"] == 20);
  json batches = ac.Get("/api/v1/batches?limit=4");
  REQUIRE(!batches["recent"].empty());
  CHECK(batches["current"]["compute_ms"].get<double>() >= 0);
  CHECK(batches["current"]["transfers"].size() >= 1);
  json trace = ac.Get("/api/v1/trace");
  int complete = 0;
  for (const json& e : trace["traceEvents"]) complete += e["ph"] == "X";
  CHECK(complete >= 2);
  json cluster = ac.Get("/api/v1/cluster");
  CHECK(cluster["stats"]["applied"] == 20);
  CHECK(cluster["hosts_alive"] == 3);

  testing::HttpResult metrics = Http(ac.admin_port, "GET", "/metrics");
  REQUIRE(metrics.status == 200);
  const std::string out_dir =
      std::getenv("TEST_UNDECLARED_OUTPUTS_DIR") ? std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")
                                                 : c.dir();
  const std::string metrics_path = out_dir + "/metrics.txt";
  std::ofstream(metrics_path) << metrics.body;
  if (access(VenvPython().c_str(), X_OK) != 0) {
    MLFABRIC_SKIP_TEST(VenvPython() + " not found (run tools/bootstrap); /metrics was not "
                       "parsed by prometheus_client");
  }
  auto check = Subprocess::Start(
      {VenvPython(), RunfilePath("tests/admin_metrics_check.py"), metrics_path},
      c.dir() + "/metrics_check.log");
  REQUIRE(check.ok());
  auto code = (*check)->WaitFor(60);
  std::cout << (*check)->Log();
  INFO((*check)->Log());
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

TEST_CASE("POSTs need the token; malformed requests get 4xx; the scheduler keeps serving") {
  AdminCluster ac = AdminCluster::Start({"s1", "w1"});
  const int port = ac.admin_port;
  const std::string body = R"({"tau_max": 4, "priority_class": 2})";
  CHECK(Http(port, "POST", "/api/v1/jobs/demo", body).status == 401);
  CHECK(Http(port, "POST", "/api/v1/jobs/demo", body, "Bearer wrong").status == 401);
  CHECK(Http(port, "POST", "/api/v1/jobs/demo", body, kToken).status == 401);
  testing::HttpResult ok =
      Http(port, "POST", "/api/v1/jobs/demo", body, std::string("Bearer ") + kToken);
  INFO(ok.body);
  CHECK(ok.status == 200);
  json jobs = ac.Get("/api/v1/jobs");
  CHECK(jobs["jobs"][0]["tau_max"] == 4);
  CHECK(jobs["jobs"][0]["priority_class"] == 2);
  testing::HttpResult bad_key = Http(port, "POST", "/api/v1/jobs/demo", R"({"tau": 1})",
                                     std::string("Bearer ") + kToken);
  CHECK(bad_key.status == 400);
  CHECK(bad_key.body.find("tau") != std::string::npos);
  CHECK(Http(port, "POST", "/api/v1/hosts/w1/drain", "", std::string("Bearer ") + kToken).status ==
        200);
  CHECK(ac.Get("/api/v1/hosts")["hosts"][1]["draining"] == true);
  CHECK(Http(port, "POST", "/api/v1/hosts/zz/drain", "", std::string("Bearer ") + kToken).status ==
        404);

  CHECK(RawHttp(port, "GARBAGE\r\n\r\n").status == 400);
  CHECK(RawHttp(port, "GET /metrics HTTP/1.1\r\nNoColonHere\r\n\r\n").status == 400);
  CHECK(RawHttp(port, "GET / HTTP/1.1\r\nContent-Length: zz\r\n\r\n").status == 400);
  CHECK(RawHttp(port, "POST /api/v1/jobs/demo HTTP/1.1\r\nContent-Length: 5000000\r\n\r\nx")
            .status == 413);
  CHECK(Http(port, "GET", "/api/v1/nothing").status == 404);
  CHECK(Http(port, "PUT", "/api/v1/jobs").status == 405);
  // Still serving, over HTTP and gRPC.
  CHECK(ac.Get("/api/v1/cluster")["hosts_alive"] == 2);
  CHECK(ac.cluster->scheduler().Running());
}

TEST_CASE("With --admin_read_auth reads need the token too, over real HTTP") {
  AdminCluster ac = AdminCluster::Start({"s1"}, {"--admin_read_auth=true"});
  const int port = ac.admin_port;
  for (const std::string target : {"/api/v1/jobs", "/metrics"}) {
    INFO(target);
    const testing::HttpResult refused = Http(port, "GET", target);
    CHECK(refused.status == 401);
    CHECK(refused.body.find("bearer token") != std::string::npos);
    CHECK(Http(port, "GET", target, "", std::string("Bearer ") + kToken).status == 200);
  }
  CHECK(Http(port, "GET", "/healthz").status == 200);
  CHECK(Http(port, "GET", "/dashboard").status == 200);
}

TEST_CASE("A daemon's own monitor feeds the scheduler's network view") {
  // w1's daemon replays N3 scaled to 0.1/1 Gbit/s; its reports reach the
  // scheduler over the daemon's real ReportBandwidth path.
  AdminCluster ac = AdminCluster::Start(
      {"s1", "w1"}, {},
      {{"w1", {"--monitor_trace=n3,seed=2,period_s=1,scale=0.1", "--report_lag_s=0.2"}}});
  std::set<double> seen;
  auto poll = [&] {
    const json hosts = ac.Get("/api/v1/hosts");
    for (const json& h : hosts["hosts"]) {
      if (h["name"] == "w1" && h["reports"].get<int64_t>() > 0) {
        seen.insert(h["reported_up_bps"].get<double>());
      }
    }
    return seen.size() >= 2;
  };
  // N3 at this scale switches between 0.1 and 1 Gbit/s every second.
  const bool changed = WaitUntil(poll, 20);
  std::string values;
  for (double bps : seen) values += std::to_string(bps) + " ";
  INFO("w1 uplink values seen in the scheduler's view: " << values);
  INFO("w1 daemon log: " << ac.cluster->daemon("w1").Log());
  REQUIRE(changed);
  for (double bps : seen) CHECK((bps == Approx(1e8) || bps == Approx(1e9)));
}

TEST_CASE("A replayed bandwidth change reaches the network view within lag + period; "
          "the next plan uses it") {
  AdminCluster ac = AdminCluster::Start({"s1", "w1"});
  launch::Cluster& c = *ac.cluster;
  auto stub = v1::Scheduler::NewStub(
      grpc::CreateChannel(c.scheduler_address(), grpc::InsecureChannelCredentials()));

  monitor::MonitorConfig config;
  config.trace = "n3,seed=2,period_s=1,scale=0.1";  // w1 switches between 0.1 and 1 Gbit/s
  config.period_s = 0.1;
  config.report_lag_s = 0.2;
  config.report_max_interval_s = 5;
  RealClock clock;
  std::atomic<int> report_errors{0};
  auto monitor = monitor::BandwidthMonitor::Create(config, &clock, [&](double up, double down) {
    v1::BandwidthReport report;
    report.set_host("w1");
    report.set_uplink_bps(up);
    report.set_downlink_bps(down);
    v1::BandwidthAck ack;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!stub->ReportBandwidth(&context, report, &ack).ok()) ++report_errors;
  });
  REQUIRE(monitor.ok());
  monitor::BandwidthMonitor& m = **monitor;
  const monitor::BandwidthTrace& trace = *m.trace();
  m.Start();

  auto reported_up = [&] {
    const json hosts = ac.Get("/api/v1/hosts");
    for (const json& h : hosts["hosts"]) {
      if (h["name"] == "w1") return h["reported_up_bps"].get<double>();
    }
    return -1.0;
  };
  // Tolerance on top of lag + period: the HTTP poll interval and loaded CI.
  const double kBudgetS = config.report_lag_s + config.period_s;
  const double kSlackS = 0.25;
  int changes_seen = 0;
  double worst_s = 0;
  double t = 0;
  while (changes_seen < 2 && t < 12) {
    const double step_at = trace.NextChangeAfter(t);
    const double before = trace.RateAt(t).up_bps, after = trace.RateAt(step_at).up_bps;
    t = step_at;
    if (before == after) continue;
    const double change_s = m.trace_start_s() + step_at;
    while (clock.NowSeconds() < change_s) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const bool seen = WaitUntil([&] { return reported_up() == after; }, kBudgetS + 2.0);
    INFO("scheduler shows " << reported_up() << ", monitor last reported "
                            << (m.LastReport() ? m.LastReport()->up_bps : -1) << ", report errors "
                            << report_errors << ", estimate " << m.LastEstimate().up_bps);
    REQUIRE(seen);
    const double seen_after_s = clock.NowSeconds() - change_s;
    std::cout << "w1 uplink " << before << " -> " << after << " bps: in the scheduler's view after "
              << seen_after_s << " s (lag " << config.report_lag_s << " s + period "
              << config.period_s << " s)\n";
    CHECK(seen_after_s <= kBudgetS + kSlackS);
    worst_s = std::max(worst_s, seen_after_s);
    ++changes_seen;
  }
  REQUIRE(changes_seen == 2);
  m.Stop();
  CHECK(report_errors == 0);

  // The view is now fixed at the last report; the next plan uses it.
  const double final_up = m.LastReport()->up_bps;
  REQUIRE(WaitUntil([&] { return reported_up() == final_up; }, 2));
  auto server = c.StartApp("server", {BinaryPath("testing/apps/sum_server"),
                                      "--socket=" + c.Socket("s1"), "--dim=256"});
  REQUIRE(server.ok());
  RunWorkers(c, {"w1"}, 3);
  json batches = ac.Get("/api/v1/batches?limit=64");
  int checked = 0;
  for (const json& batch : batches["recent"]) {
    for (const json& host : batch["network"]) {
      if (host["host"] == "w1") CHECK(host["uplink_bps"].get<double>() == final_up);
    }
    for (const json& transfer : batch["transfers"]) {
      CHECK(transfer["src"] == "w1");
      CHECK(transfer["segments"][0][2].get<double>() == final_up);  // fifo: min(up, down)
      ++checked;
    }
  }
  CHECK(checked == 3);
  std::cout << "worst observed report-to-view latency " << worst_s << " s; " << checked
            << " transfers planned at " << final_up << " bps\n";
}

TEST_CASE("A job's priority class set at the admin endpoint reaches every daemon") {
  // The daemons rank co-located jobs (TensorLights TLs-One) by the class,
  // in their queues and (tests/nic_priority_test) on their NICs.
  AdminCluster ac = AdminCluster::Start({"s1", "w1", "w2"}, {}, {{"s1", {"--job_priority=one"}},
                                                                 {"w1", {"--job_priority=one"}},
                                                                 {"w2", {"--job_priority=one"}}});
  launch::Cluster& c = *ac.cluster;
  auto server = c.StartApp("server", {BinaryPath("testing/apps/sum_server"),
                                      "--socket=" + c.Socket("s1"), "--dim=256"});
  REQUIRE(server.ok());
  RunWorkers(c, {"w1"}, 3);  // s1 and w1 carry the job; w2 never does, and hears it too
  testing::HttpResult ok = Http(ac.admin_port, "POST", "/api/v1/jobs/demo",
                                R"({"priority_class": 4})", std::string("Bearer ") + kToken);
  INFO(ok.body);
  REQUIRE(ok.status == 200);
  const std::string line = "has priority class 4";
  for (const std::string host : {"s1", "w1", "w2"}) {
    INFO(host << ".log:\n" << ReadFile(c.dir() + "/" + host + ".log"));
    CHECK(WaitUntil([&] { return ReadFile(c.dir() + "/" + host + ".log").find(line) !=
                                 std::string::npos; },
                    10));
  }
  // Back to 0: the daemons hear that too.
  ok = Http(ac.admin_port, "POST", "/api/v1/jobs/demo", R"({"priority_class": 0})",
            std::string("Bearer ") + kToken);
  REQUIRE(ok.status == 200);
  CHECK(WaitUntil([&] { return ReadFile(c.dir() + "/w1.log").find("has priority class 0") !=
                               std::string::npos; },
                  10));
}

}  // namespace
}  // namespace mlfabric
