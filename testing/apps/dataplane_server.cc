// Data-plane test and benchmark server: accepts updates of any size, checks
// every word of each against dataplane_pusher's pattern (word 0 = seed,
// word j = (seed + j) mod 4096), and prints one line per delivery in the
// order the daemon hands them over:
//   dataplane_server ps0: update sequence 3 transfer 17 bytes 65536 worker w2 count 1 ok
// ("corrupt at word <j>" instead of "ok" when a word differs). With
// --expect_updates=K it also prints "dataplane_server ps0: done" after K.
//
// The model it serves to `get`: by default (--model_bytes=8) 8 bytes
// holding the version (int64, little-endian). With --model_bytes=N > 8 (a
// multiple of 4) it is N bytes of float32 words with integer values,
// word j = (version + j) mod 4096 (dataplane_puller checks every word); the
// pattern is built once per version, not per request. Each request served
// prints, with the steady-clock second the snapshot was handed back (the
// daemon queues the reply's packets right after):
//   dataplane_server ps0: served get version 0 bytes 268435456 at_s 1234.567
// It prints "dataplane_server ps0: serving" once registered (and the model
// built), and runs until its daemon goes away or it is stopped.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "api/mlfabric.h"
#include "common/config.h"
#include "nlohmann/json.hpp"

namespace {

using mlfabric::Server;

// "ok", or how update `u` differs from dataplane_pusher's pattern.
std::string Verdict(const Server::Update& u) {
  if (u.bytes < 4 || u.bytes % 4 != 0) return "corrupt: size is not whole words";
  const size_t words = u.bytes / 4;
  float first;
  std::memcpy(&first, u.data, 4);
  const uint64_t seed = static_cast<uint64_t>(first);
  for (size_t j = 1; j < words; ++j) {
    float value;
    std::memcpy(&value, u.data + 4 * j, 4);
    if (value != static_cast<float>((seed + j) % 4096)) {
      return "corrupt at word " + std::to_string(j);
    }
  }
  return "ok";
}

// The served model of `version` when it is more than 8 bytes: word j =
// (version + j) mod 4096.
void FillPattern(int64_t version, std::vector<uint8_t>* pattern) {
  const uint64_t base = static_cast<uint64_t>(version);
  for (size_t j = 0; j < pattern->size() / 4; ++j) {
    const float value = static_cast<float>((base + j) % 4096);
    std::memcpy(pattern->data() + 4 * j, &value, 4);
  }
}

// The line for a delivered update (the order of these lines is the order
// the daemon handed the updates over).
void PrintUpdate(const std::string& name, const Server::Update& u, const std::string& verdict) {
  std::cout << "dataplane_server " << name << ": update sequence " << u.sequence
            << " transfer " << u.transfer_id << " bytes " << u.bytes << " worker " << u.worker
            << " count " << u.count << " " << verdict << std::endl;
}

// The steady clock's second now, to the microsecond.
std::string SteadyNow() {
  const double now_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  char at[32];
  std::snprintf(at, sizeof(at), "%.6f", now_s);
  return at;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mlfabric;
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) {
    std::cerr << "dataplane_server: " << cl.status().message() << "\n";
    return 2;
  }
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  ClientOptions options;
  options.name = "ps0";
  int64_t expect_updates = 0;
  bool verify = true;
  int64_t model_bytes = 8;
  reader.String("socket", &options.daemon_socket);
  reader.String("name", &options.name);
  reader.String("job", &options.job);
  reader.String("token", &options.job_token);
  reader.Int("expect_updates", &expect_updates, 0, 1 << 30);
  reader.Bool("verify", &verify);
  reader.Int("model_bytes", &model_bytes, 8, int64_t{4} << 30);
  if (auto status = reader.Finish(); !status.ok()) {
    std::cerr << "dataplane_server: " << status.message() << "\n";
    return 2;
  }
  if (model_bytes % 4 != 0) {
    std::cerr << "dataplane_server: --model_bytes must be a multiple of 4 (got " << model_bytes
              << ")\n";
    return 2;
  }
  auto server = Server::Connect(options);
  if (!server.ok()) {
    std::cerr << "dataplane_server: " << server.status().message() << "\n";
    return 1;
  }
  int64_t version = (*server)->initial_version();
  int64_t applied = 0;
  (*server)->RegisterUpdateCallback([&](const Server::Update& u) -> absl::StatusOr<int64_t> {
    const std::string verdict = verify ? Verdict(u) : "ok";
    applied += u.count;
    version += u.count;
    PrintUpdate(options.name, u, verdict);
    if (expect_updates > 0 && applied >= expect_updates && applied - u.count < expect_updates) {
      std::cout << "dataplane_server " << options.name << ": done" << std::endl;
    }
    return version;
  });
  // The served model of `pattern_version`, rebuilt only when the version
  // moved (a 256 MiB pattern takes far longer to build than to copy); built
  // for the initial version before serving, so a first get pays only the copy.
  std::vector<uint8_t> pattern;
  int64_t pattern_version = -1;
  auto build_pattern = [&] {
    pattern.resize(static_cast<size_t>(model_bytes));
    FillPattern(version, &pattern);
    pattern_version = version;
  };
  if (model_bytes > 8) build_pattern();
  (*server)->RegisterRequestCallback([&]() -> absl::StatusOr<Server::Snapshot> {
    Server::Snapshot snapshot;
    snapshot.version = version;
    if (model_bytes == 8) {
      snapshot.bytes.resize(8);
      std::memcpy(snapshot.bytes.data(), &version, 8);
    } else {
      if (pattern_version != version) build_pattern();
      snapshot.bytes = pattern;
    }
    const std::string at = SteadyNow();
    std::cout << "dataplane_server " << options.name << ": served get version " << version
              << " bytes " << snapshot.bytes.size() << " at_s " << at << std::endl;
    return snapshot;
  });
  std::cout << "dataplane_server " << options.name << ": serving" << std::endl;
  absl::Status status = (*server)->Serve();
  if (!status.ok()) {
    std::cerr << "dataplane_server: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
