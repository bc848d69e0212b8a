// Runs the real `mlfabric-plan` binary (a data dependency) the way a user
// or an outside checker does: files and pipes in, JSON and exit codes out.
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "nlohmann/json.hpp"
#include "scheduler/core/plan_checker.h"
#include "scheduler/core/plan_json.h"

namespace mlfabric::core {
namespace {

constexpr char kBinary[] = "tools/mlfabric-plan";
constexpr char kExample[] = "scheduler/core/testdata/example_batch.json";

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Run {
  int exit_code;
  std::string out;
  std::string err;
};

Run Execute(const std::string& args) {
  const std::string out = TempPath("out.txt"), err = TempPath("err.txt");
  const std::string command = std::string(kBinary) + " " + args + " >" + out + " 2>" + err;
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, Read(out), Read(err)};
}

TEST_CASE("mlfabric-plan plans the example batch from a file and from stdin") {
  const Run from_file = Execute(std::string("--in ") + kExample);
  REQUIRE(from_file.exit_code == 0);
  const Run from_stdin = Execute(std::string("--compact < ") + kExample);
  REQUIRE(from_stdin.exit_code == 0);
  const auto a = nlohmann::json::parse(from_file.out);
  const auto b = nlohmann::json::parse(from_stdin.out);
  CHECK(a["order"] == nlohmann::json::parse(R"(["g4", "g1", "g2"])"));
  CHECK(a["order"] == b["order"]);
  CHECK(a["dropped"][0]["reason"] == "deadline_lookahead");
  CHECK(a["commits"].size() == 3);
  CHECK(a["stats"]["compute_ms"].get<double>() >= 0);

  // The plan it wrote passes every invariant (checked against the batch).
  auto batch = BatchFromJsonText(Read(kExample));
  REQUIRE(batch.ok());
  Plan plan;
  for (const auto& id : a["order"]) plan.order.push_back(id);
  for (const auto& d : a["dropped"]) plan.dropped.push_back({d["id"], d["reason"]});
  for (const auto& t : a["transfers"]) {
    Transfer x;
    x.update = t["update"];
    x.src = t["src"];
    x.dst = t["dst"];
    const std::string kind = t["kind"];
    for (TransferKind k : {TransferKind::kDirect, TransferKind::kToAggregator,
                           TransferKind::kAggregate, TransferKind::kReplica,
                           TransferKind::kReplicaAggregate}) {
      if (kind == TransferKindName(k)) x.kind = k;
    }
    x.start_s = t["start_s"];
    x.end_s = t["end_s"];
    x.bytes = t["bytes"];
    for (const auto& s : t["segments"]) x.segments.push_back({s[0], s[1], s[2]});
    if (t.contains("constituents")) {
      for (const auto& c : t["constituents"]) x.constituents.push_back(c);
    }
    plan.transfers.push_back(std::move(x));
  }
  for (const auto& c : a["commits"]) plan.commits.push_back({c["update"], c["at_s"], c["position"]});
  for (const auto& c : a["replica_commits"]) {
    plan.replica_commits.push_back({c["update"], c["at_s"], c["position"]});
  }
  for (const auto& p : a["punted"]) plan.punted.push_back(p);
  const auto problems = CheckPlan(*batch, plan);
  INFO((problems.empty() ? "" : problems[0]));
  CHECK(problems.empty());
}

TEST_CASE("mlfabric-plan --out writes the file; --planner fifo switches planner") {
  const std::string out = TempPath("plan.json");
  const Run run = Execute(std::string("--planner fifo --in ") + kExample + " --out " + out);
  REQUIRE(run.exit_code == 0);
  CHECK(run.out.empty());
  const auto plan = nlohmann::json::parse(Read(out));
  // FIFO keeps arrival order and drops nothing.
  CHECK(plan["order"] == nlohmann::json::parse(R"(["g1", "g2", "g3", "g4"])"));
  CHECK(plan["dropped"].empty());
}

TEST_CASE("mlfabric-plan exits 2 naming the field on invalid input") {
  const Run bad = Execute("--in scheduler/core/testdata/bad_batch.json");
  CHECK(bad.exit_code == 2);
  CHECK(bad.out.empty());
  CHECK(bad.err.find("updates[2].bytes: must be a positive integer") != std::string::npos);

  const Run not_json = Execute("< /dev/null");
  CHECK(not_json.exit_code == 2);
  CHECK(not_json.err.find("input: not valid JSON") != std::string::npos);

  const Run unknown_planner = Execute(std::string("--planner nope --in ") + kExample);
  CHECK(unknown_planner.exit_code == 2);
  CHECK(unknown_planner.err.find("--planner") != std::string::npos);

  const Run missing_file = Execute("--in /nonexistent.json");
  CHECK(missing_file.exit_code == 2);

  const Run unknown_flag = Execute("--frobnicate");
  CHECK(unknown_flag.exit_code == 2);

  const Run help = Execute("--help");
  CHECK(help.exit_code == 0);
  CHECK(help.out.find("Usage: mlfabric-plan") == 0);
}

}  // namespace
}  // namespace mlfabric::core
