// AdminHandler and the views on a fixed snapshot: routes, JSON shapes,
// Prometheus text, Chrome trace, and the bearer-token rule for POSTs.
#include "scheduler/admin/admin_handler.h"

#include <catch2/catch.hpp>

#include "nlohmann/json.hpp"

namespace mlfabric::admin {
namespace {

using nlohmann::json;

class FakeBackend : public AdminBackend {
 public:
  FakeBackend() {
    snap_.now_s = 110;
    snap_.started_s = 100;
    snap_.planner = "mlfabric";
    HostView w1;
    w1.name = "w1";
    w1.alive = true;
    w1.reported_up_bps = 2.5e9;
    w1.reserved_up_bps = 1e9;
    w1.available_up_bps = 1.5e9;
    w1.last_report_s = 109.5;
    snap_.hosts.push_back(w1);
    JobView job;
    job.params.name = "demo\"x";
    job.servers.push_back({"ps0", "s1", 42, 0, 1});
    ServerView replicated{"ps1", "s1", 10, 0, 0};
    replicated.replica_host = "r1";
    replicated.replica_applied = 7;
    replicated.replica_lag = 3;
    replicated.divergence_estimate = 2.5;
    job.servers.push_back(replicated);
    WorkerTiming slow;
    slow.worker = "w3";
    slow.iterations = 12;
    slow.iteration_s = 0.4;
    slow.slowdown = 4;
    slow.straggler = true;
    job.workers.push_back(slow);
    job.members = {"w1", "w3"};
    job.generation = 4;
    job.membership_changes = {{101.5, "w2", false, "its host w2 is down", 4}};
    snap_.jobs.push_back(job);
    BatchView batch;
    batch.id = 7;
    batch.job = "demo";
    batch.server = "ps0";
    TransferView t;
    t.transfer_id = 3;
    t.src = "w1";
    t.dst = "s1";
    t.start_s = 105;
    t.end_s = 105.5;
    t.segments = {{105, 105.5, 1e9}};
    batch.transfers.push_back(t);
    snap_.recent_batches.push_back(batch);
    snap_.drops_by_category["stale"] = 2;
    snap_.delay_histogram.bounds = {0, 1, 2};
    snap_.delay_histogram.counts = {1, 0, 2, 1};
    snap_.delay_histogram.total = 4;
    snap_.delay_histogram.sum = 9;
    snap_.push_phases["demo"] = {4, 2.0, 0.25, 1.0, 0.75};
    snap_.batch_interval_ms = 100;
    CycleView quick, slow_cycle;
    quick.start_s = 109.0;
    quick.total_ms = 20;
    slow_cycle.start_s = 109.1;
    slow_cycle.total_ms = 120;
    slow_cycle.lock_wait_ms = 30;
    snap_.recent_cycles = {quick, slow_cycle};
  }
  ClusterSnapshot Snapshot() const override {
    ++full_snapshots;
    return snap_;
  }
  ClusterSnapshot CyclesSnapshot() const override {
    ClusterSnapshot cycles;
    cycles.now_s = snap_.now_s;
    cycles.batch_interval_ms = snap_.batch_interval_ms;
    cycles.recent_cycles = snap_.recent_cycles;
    return cycles;
  }
  mutable int full_snapshots = 0;
  absl::Status UpdateJobParams(const std::string& job, const JobParamsUpdate& update) override {
    if (job != "demo") return absl::NotFoundError("unknown job '" + job + "'");
    last_update = update;
    return absl::OkStatus();
  }
  absl::Status DrainHost(const std::string& host, bool drain) override {
    drained = host + (drain ? ":on" : ":off");
    return absl::OkStatus();
  }
  JobParamsUpdate last_update;
  std::string drained;

 private:
  ClusterSnapshot snap_;
};

TEST_CASE("GET routes return JSON with the snapshot's values") {
  FakeBackend backend;
  AdminHandler handler(&backend, {"secret"});
  HttpResponse r = handler.Handle({"GET", "/api/v1/hosts", "", ""});
  REQUIRE(r.status == 200);
  json hosts = json::parse(r.body);
  CHECK(hosts["hosts"][0]["available_up_bps"] == 1.5e9);
  CHECK(hosts["hosts"][0]["report_age_s"] == 0.5);
  json batches = json::parse(handler.Handle({"GET", "/api/v1/batches?limit=1", "", ""}).body);
  CHECK(batches["current"]["id"] == 7);
  CHECK(batches["recent"].size() == 1);
  json jobs = json::parse(handler.Handle({"GET", "/api/v1/jobs", "", ""}).body);
  CHECK(jobs["jobs"][0]["servers"][0]["model_version"] == 42);
  CHECK(jobs["jobs"][0]["servers"][0]["replica"].is_null());
  const json replica = jobs["jobs"][0]["servers"][1]["replica"];
  CHECK(replica["host"] == "r1");
  CHECK(replica["applied"] == 7);
  CHECK(replica["lag_updates"] == 3);
  CHECK(replica["divergence_estimate"] == 2.5);
  CHECK(jobs["jobs"][0]["workers"][0]["name"] == "w3");
  CHECK(jobs["jobs"][0]["workers"][0]["straggler"] == true);
  CHECK(jobs["jobs"][0]["workers"][0]["iterations"] == 12);
  CHECK(jobs["jobs"][0]["members"] == 2);
  CHECK(jobs["jobs"][0]["member_names"] == json({"w1", "w3"}));
  CHECK(jobs["jobs"][0]["generation"] == 4);
  CHECK(jobs["jobs"][0]["member_loss"] == "shrink");
  const json change = jobs["jobs"][0]["membership_changes"][0];
  CHECK(change["worker"] == "w2");
  CHECK(change["event"] == "left");
  CHECK(change["reason"] == "its host w2 is down");
  CHECK(change["generation"] == 4);
  CHECK(change["at_s"] == 101.5);
  json delays = json::parse(handler.Handle({"GET", "/api/v1/delays", "", ""}).body);
  CHECK(delays["push_phases"]["demo"]["applied"] == 4);
  CHECK(delays["push_phases"]["demo"]["latency_s"] == 0.5);  // means over the 4
  CHECK(delays["push_phases"]["demo"]["planned_s"] == 0.25);
  CHECK(handler.Handle({"GET", "/api/v1/nope", "", ""}).status == 404);
  // Bytes that are not UTF-8 in what is echoed back (found by the fuzzer:
  // the JSON encoder threw and took the scheduler down).
  HttpResponse bad_utf8 = handler.Handle({"GET", "/api/v1/n\xffpe", "", ""});
  CHECK(bad_utf8.status == 404);
  CHECK_NOTHROW(json::parse(bad_utf8.body));
  CHECK(handler.Handle({"DELETE", "/api/v1/hosts", "", ""}).status == 405);
  CHECK(handler.Handle({"GET", "/", "", ""}).content_type.find("text/html") == 0);
}

TEST_CASE("GET /api/v1/cycles reads the cycles alone, not a full snapshot") {
  FakeBackend backend;
  AdminHandler handler(&backend, {"secret"});
  HttpResponse r = handler.Handle({"GET", "/api/v1/cycles", "", ""});
  REQUIRE(r.status == 200);
  const json cycles = json::parse(r.body);
  REQUIRE(cycles["cycles"].size() == 2);
  CHECK(cycles["cycles"][1]["total_ms"] == 120.0);
  CHECK(cycles["cycles"][1]["lock_wait_ms"] == 30.0);
  CHECK(cycles["max_ms"] == 120.0);
  CHECK(cycles["batch_interval_ms"] == 100);
  CHECK(backend.full_snapshots == 0);
  handler.Handle({"GET", "/api/v1/hosts", "", ""});
  CHECK(backend.full_snapshots == 1);
}

TEST_CASE("Prometheus text has typed families, escaped labels, cumulative buckets") {
  FakeBackend backend;
  AdminHandler handler(&backend, {});
  HttpResponse r = handler.Handle({"GET", "/metrics", "", ""});
  REQUIRE(r.status == 200);
  CHECK(r.content_type.find("version=0.0.4") != std::string::npos);
  CHECK(r.body.find("# TYPE mlfabric_update_delay histogram") != std::string::npos);
  CHECK(r.body.find("mlfabric_update_delay_bucket{le=\"2\"} 3\n") != std::string::npos);
  CHECK(r.body.find("mlfabric_update_delay_bucket{le=\"+Inf\"} 4\n") != std::string::npos);
  CHECK(r.body.find("job=\"demo\\\"x\"") != std::string::npos);
  CHECK(r.body.find("mlfabric_link_available_bps{host=\"w1\",direction=\"up\"} 1500000000") !=
        std::string::npos);
  CHECK(r.body.find("mlfabric_drops_total{reason=\"stale\"} 2") != std::string::npos);
  CHECK(r.body.find("mlfabric_push_phase_seconds_total{job=\"demo\",phase=\"late\"} 0.75\n") !=
        std::string::npos);
  CHECK(r.body.find("mlfabric_push_phase_pushes_total{job=\"demo\"} 4\n") != std::string::npos);
  CHECK(r.body.find("mlfabric_job_membership_generation{job=\"demo\\\"x\"} 4\n") !=
        std::string::npos);
  CHECK(r.body.find("mlfabric_job_members{job=\"demo\\\"x\"} 2\n") != std::string::npos);
  CHECK(r.body.find("mlfabric_worker_straggler{job=\"demo\\\"x\",worker=\"w3\"} 1") !=
        std::string::npos);
  CHECK(r.body.find("mlfabric_worker_iterations_total{job=\"demo\\\"x\",worker=\"w3\"} 12") !=
        std::string::npos);
  // The replica's lag and the planner's divergence bound, for servers that
  // have a replica only.
  CHECK(r.body.find("mlfabric_replica_lag_updates{job=\"demo\\\"x\",server=\"ps1\"} 3\n") !=
        std::string::npos);
  CHECK(r.body.find(
            "mlfabric_replica_divergence_estimate{job=\"demo\\\"x\",server=\"ps1\"} 2.5\n") !=
        std::string::npos);
  CHECK(r.body.find("mlfabric_replica_lag_updates{job=\"demo\\\"x\",server=\"ps0\"}") ==
        std::string::npos);
}

TEST_CASE("Chrome trace puts a transfer on its uplink and downlink tracks") {
  FakeBackend backend;
  AdminHandler handler(&backend, {});
  json trace = json::parse(handler.Handle({"GET", "/api/v1/trace", "", ""}).body);
  int complete = 0;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") {
      ++complete;
      CHECK(e["ts"] == 5e6);
      CHECK(e["dur"] == 5e5);
    }
  }
  CHECK(complete == 2);
}

TEST_CASE("With read_auth every read but the dashboard page and /healthz needs the token") {
  FakeBackend backend;
  AdminHandler handler(&backend, {"secret", /*read_auth=*/true});
  for (const std::string target : {"/api/v1/jobs", "/api/v1/cluster", "/metrics",
                                   "/api/v1/trace", "/api/v1/nope"}) {
    INFO(target);
    const HttpResponse refused = handler.Handle({"GET", target, "", ""});
    CHECK(refused.status == 401);
    CHECK(refused.body.find("bearer token") != std::string::npos);
    CHECK(handler.Handle({"GET", target, "Bearer nope", ""}).status == 401);
  }
  CHECK(handler.Handle({"GET", "/api/v1/jobs", "Bearer secret", ""}).status == 200);
  CHECK(handler.Handle({"GET", "/metrics", "Bearer secret", ""}).status == 200);
  CHECK(handler.Handle({"GET", "/api/v1/nope", "Bearer secret", ""}).status == 404);
  // The page holds no data; its script sends the token from #token=...
  const HttpResponse page = handler.Handle({"GET", "/dashboard", "", ""});
  CHECK(page.status == 200);
  CHECK(page.body.find("Authorization") != std::string::npos);
  CHECK(handler.Handle({"GET", "/healthz", "", ""}).status == 200);
  // Without a token configured, reads are refused to everyone, saying why.
  AdminHandler no_token(&backend, {"", /*read_auth=*/true});
  const HttpResponse disabled = no_token.Handle({"GET", "/api/v1/jobs", "Bearer x", ""});
  CHECK(disabled.status == 403);
  CHECK(disabled.body.find("no admin_token") != std::string::npos);
  // Without read_auth, reads stay open (the default).
  AdminHandler open(&backend, {"secret"});
  CHECK(open.Handle({"GET", "/api/v1/jobs", "", ""}).status == 200);
}

TEST_CASE("POSTs need the bearer token and validate their body") {
  FakeBackend backend;
  AdminHandler handler(&backend, {"secret"});
  const std::string body = R"({"tau_max": 12, "momentum": 0.5})";
  CHECK(handler.Handle({"POST", "/api/v1/jobs/demo", "", body}).status == 401);
  CHECK(handler.Handle({"POST", "/api/v1/jobs/demo", "Bearer nope", body}).status == 401);
  CHECK(handler.Handle({"POST", "/api/v1/jobs/demo", "secret", body}).status == 401);
  HttpResponse ok = handler.Handle({"POST", "/api/v1/jobs/demo", "Bearer secret", body});
  CHECK(ok.status == 200);
  CHECK(backend.last_update.tau_max == 12);
  CHECK(backend.last_update.momentum == 0.5);
  CHECK(!backend.last_update.priority_class.has_value());
  HttpResponse bad = handler.Handle({"POST", "/api/v1/jobs/demo", "Bearer secret", R"({"tau": 1})"});
  CHECK(bad.status == 400);
  CHECK(bad.body.find("tau") != std::string::npos);
  CHECK(handler.Handle({"POST", "/api/v1/jobs/demo", "Bearer secret", "{"}).status == 400);
  CHECK(handler.Handle({"POST", "/api/v1/jobs/ghost", "Bearer secret", "{}"}).status == 404);
  CHECK(handler.Handle({"POST", "/api/v1/hosts/w1/drain", "Bearer secret", ""}).status == 200);
  CHECK(backend.drained == "w1:on");

  AdminHandler no_token(&backend, {});
  CHECK(no_token.Handle({"POST", "/api/v1/hosts/w1/drain", "Bearer ", ""}).status == 403);
}

}  // namespace
}  // namespace mlfabric::admin
