// mlfabric-plan: plans one batch of update transfers (docs/architecture.md §4) with the
// same core the scheduler service runs, for what-if analysis and for checking
// the scheduler from outside.
//
//   bazel-bin/tools/mlfabric-plan < batch.json > plan.json
//   bazel-bin/tools/mlfabric-plan --planner fifo --in batch.json --out plan.json
//
// Exit status: 0 plan written; 2 invalid input or usage (the message on
// stderr names the offending field or flag); 1 any other failure.
#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "scheduler/core/plan_json.h"
#include "scheduler/core/planner_factory.h"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitInvalid = 2;

void PrintUsage(std::ostream& out) {
  out << "Usage: mlfabric-plan [--in FILE] [--out FILE] [--planner NAME] [--compact]\n"
         "\n"
         "Reads one batch of update-transfer requests as JSON (stdin, or --in FILE)\n"
         "and writes the plan as JSON (stdout, or --out FILE). The formats are the\n"
         "planner contract of docs/architecture.md section 4; units are bytes, seconds and\n"
         "bits per second.\n"
         "\n"
         "  --in FILE        read the batch from FILE instead of stdin\n"
         "  --out FILE       write the plan to FILE instead of stdout\n"
         "  --planner NAME   mlfabric (default: ordering, aggregation, replication)\n"
         "                   or fifo (vanilla asynchronous parameter server)\n"
         "  --compact        one-line JSON instead of indented\n"
         "  --help           this text\n"
         "\n"
         "Exit status: 0 ok, 2 invalid input or usage (the message names the field),\n"
         "1 other errors.\n";
}

int Fail(int code, const std::string& message) {
  std::cerr << "mlfabric-plan: " << message << "\n";
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  std::string in_path;
  std::string out_path;
  std::string planner_name = "mlfabric";
  bool compact = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    if (arg == "--help" || arg == "-h") {
      PrintUsage(std::cout);
      return 0;
    } else if (arg == "--compact") {
      compact = true;
    } else if (arg.rfind("--in=", 0) == 0) {
      in_path = arg.substr(5);
    } else if (arg.rfind("--out=", 0) == 0) {
      out_path = arg.substr(6);
    } else if (arg.rfind("--planner=", 0) == 0) {
      planner_name = arg.substr(10);
    } else if (arg == "--in" || arg == "--out" || arg == "--planner") {
      std::string* target = arg == "--in" ? &in_path : arg == "--out" ? &out_path : &planner_name;
      if (!value(target)) return Fail(kExitInvalid, arg + ": needs a value (see --help)");
    } else {
      PrintUsage(std::cerr);
      return Fail(kExitInvalid, "unknown argument '" + arg + "'");
    }
  }

  auto planner = mlfabric::core::MakePlanner(planner_name);
  if (!planner.ok()) return Fail(kExitInvalid, "--planner: " + std::string(planner.status().message()));

  std::string text;
  if (in_path.empty() || in_path == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    std::ifstream in(in_path);
    if (!in) return Fail(kExitInvalid, "--in: cannot open '" + in_path + "'");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  auto batch = mlfabric::core::BatchFromJsonText(text);
  if (!batch.ok()) return Fail(kExitInvalid, std::string(batch.status().message()));

  const auto start = std::chrono::steady_clock::now();
  auto plan = (*planner)->PlanBatch(*batch);
  const auto stop = std::chrono::steady_clock::now();
  if (!plan.ok()) {
    const int code = plan.status().code() == absl::StatusCode::kInvalidArgument ? kExitInvalid
                                                                                : kExitFailure;
    return Fail(code, std::string(plan.status().message()));
  }
  plan->compute_ms = std::chrono::duration<double, std::milli>(stop - start).count();

  const std::string json = mlfabric::core::PlanToJson(*plan).dump(compact ? -1 : 2) + "\n";
  if (out_path.empty() || out_path == "-") {
    std::cout << json;
    std::cout.flush();
    if (!std::cout) return Fail(kExitFailure, "cannot write the plan to stdout");
  } else {
    std::ofstream out(out_path);
    out << json;
    out.close();
    if (!out) return Fail(kExitFailure, "--out: cannot write '" + out_path + "'");
  }
  return 0;
}
