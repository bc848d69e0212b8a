#include "scheduler/core/plan_json.h"

#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "scheduler/core/internal/random_batch.h"
#include "scheduler/core/mlfabric_planner.h"

namespace mlfabric::core {
namespace {

using Json = nlohmann::ordered_json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Json Minimal() {
  return Json::parse(R"({
    "now_s": 1.5, "mode": "async", "tau_max": 30, "v_init": 100, "server": "s1",
    "aggregators": [], "replica": null,
    "hosts": [{"name": "s1", "uplink_bps": 1e10, "downlink_bps": 1e10},
              {"name": "w1", "uplink_bps": 1e10, "downlink_bps": 1e10,
               "uplink_profile": [[0.0, 1e10], [5.0, 2.5e9]]}],
    "updates": [{"id": "g1", "worker": "w1", "bytes": 30000000, "version": 95, "norm": 1.5}]
  })");
}

std::string ErrorOf(const Json& json) {
  auto batch = BatchFromJson(json);
  REQUIRE_FALSE(batch.ok());
  return std::string(batch.status().message());
}

TEST_CASE("The DESIGN §4 example input parses") {
  auto batch = BatchFromJson(Minimal());
  REQUIRE(batch.ok());
  CHECK(batch->now_s == 1.5);
  CHECK(batch->tau_max == 30);
  CHECK(batch->hosts[1].uplink_profile.size() == 2);
  CHECK(batch->hosts[1].uplink_profile[1].second == 2.5e9);
  CHECK(batch->updates[0].bytes == 30000000);
  CHECK(batch->updates[0].version == 95);
  CHECK_FALSE(batch->replica.has_value());
}

TEST_CASE("Batches round-trip through JSON") {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    internal::RandomBatchOptions o;
    o.seed = seed;
    o.updates = 5;
    o.aggregators = 2;
    o.replica = seed % 2 == 0;
    o.profiles = true;
    o.shards = seed % 3 == 0 ? 1 : 0;
    const Batch batch = internal::RandomBatch(o);
    const Json json = BatchToJson(batch);
    auto back = BatchFromJsonText(json.dump());
    REQUIRE(back.ok());
    CHECK(BatchToJson(*back) == json);
  }
}

TEST_CASE("Errors name the offending field") {
  Json j = Minimal();
  j["updates"][0]["bytes"] = -4;
  CHECK(ErrorOf(j) == "updates[0].bytes: must be a positive integer");
  j = Minimal();
  j["updates"][0]["bytes"] = 1.5;
  CHECK(ErrorOf(j) == "updates[0].bytes: must be a positive integer");
  j = Minimal();
  j["updates"][0].erase("worker");
  CHECK(ErrorOf(j) == "updates[0].worker: missing");
  j = Minimal();
  j["updates"][0]["byts"] = 3;
  CHECK(ErrorOf(j).find("updates[0].byts: unknown key") == 0);
  j = Minimal();
  j["mode"] = "semi";
  CHECK(ErrorOf(j).find("mode:") == 0);
  j = Minimal();
  j.erase("tau_max");
  CHECK(ErrorOf(j) == "tau_max: missing");
  j = Minimal();
  j["hosts"][1]["uplink_profile"][1] = Json::array({5.0});
  CHECK(ErrorOf(j).find("hosts[1].uplink_profile[1]") == 0);
  j = Minimal();
  j["replica"] = Json::parse(R"({"host": "s1", "divergence_bound": 1, "momentum": 1.5})");
  CHECK(ErrorOf(j).find("replica.momentum") == 0);
  j = Minimal();
  j["hosts"] = "none";
  CHECK(ErrorOf(j) == "hosts: must be an array");
  auto bad = BatchFromJsonText("{\"server\": ");
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find("input: not valid JSON") == 0);
}

TEST_CASE("Unknown top-level keys are tolerated (the contract may grow)") {
  Json j = Minimal();
  j["comment"] = "a what-if batch";
  CHECK(BatchFromJson(j).ok());
  j = Minimal();
  j.erase("tau_max");
  j.erase("v_init");
  j["mode"] = "sync";
  CHECK(BatchFromJson(j).ok());  // deadlines do not apply to synchronous batches
}

TEST_CASE("Plans are written exactly as DESIGN §4 lays them out") {
  auto batch = BatchFromJsonText(ReadFile("scheduler/core/testdata/example_batch.json"));
  REQUIRE(batch.ok());
  auto plan = MlfabricPlanner().PlanBatch(*batch);
  REQUIRE(plan.ok());
  const Json json = PlanToJson(*plan);
  std::vector<std::string> keys;
  for (auto it = json.begin(); it != json.end(); ++it) keys.push_back(it.key());
  CHECK(keys == std::vector<std::string>{"order", "dropped", "transfers", "commits",
                                         "replica_commits", "punted", "stats"});
  CHECK(json["order"] == Json::parse(R"(["g4", "g1", "g2"])"));
  CHECK(json["dropped"] == Json::parse(R"([{"id": "g3", "reason": "deadline_lookahead"}])"));
  const Json& t = json["transfers"][0];
  for (const char* key : {"update", "src", "dst", "kind", "start_s", "end_s", "segments"}) {
    CHECK(t.contains(key));
  }
  CHECK(t["kind"] == "direct");
  CHECK(t["segments"][0].size() == 3);
  const Json& c = json["commits"][0];
  CHECK(c["update"] == "g4");
  CHECK(c["position"] == 1);
  CHECK(c["at_s"].is_number());
  CHECK(json["stats"].contains("compute_ms"));
  CHECK(json["punted"] == Json::parse(R"(["g2"])"));
}

}  // namespace
}  // namespace mlfabric::core
