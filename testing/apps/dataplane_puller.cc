// Data-plane test and benchmark worker for pulls: gets a server's model
// --repeat times with a chosen get priority (Mercury order of the reply's
// packets in the server daemon's queue, below the job's TensorLights rank;
// lower first) and checks every byte of what came back against
// dataplane_server's model pattern:
//   8 bytes:  the version (int64, little-endian);
//   N > 8:    float32 words, word j = (version + j) mod 4096.
//
//   dataplane_puller --socket=/tmp/w1.sock --job=a --token=token-a --name=w1a
//       --server=psa --priority=10 --go_file=/tmp/go      (one command line)
//
// With --go_file it connects first, prints "dataplane_puller w1a: ready" and
// waits for that file to exist before the first get, so a test can issue a
// get at a chosen moment without paying for start-up then. One line per get:
//   dataplane_puller w1a: got bytes 1048576 version 0 priority 10 start_s 812.123456
//       done_s 812.140001 ok
// (one line; "corrupt at word <j>" / "corrupt: <why>" instead of "ok", or
// "dataplane_puller w1a: get failed: <reason>"). start_s is just before
// Worker::Get, done_s just after it returned, both steady_clock
// (CLOCK_MONOTONIC) seconds, comparable across processes on one machine.
// Exits 0 only if every get returned intact bytes, 3 otherwise, 2 on bad
// flags (the message names the flag), 1 when the daemon is unreachable.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include "api/mlfabric.h"
#include "common/config.h"
#include "nlohmann/json.hpp"

namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string FormatSeconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6f", s);
  return text;
}

// "ok", or where the bytes first differ from dataplane_server's pattern.
std::string Verify(const mlfabric::Model& model, int64_t expect_bytes) {
  if (expect_bytes > 0 && static_cast<int64_t>(model.size()) != expect_bytes) {
    return "corrupt: " + std::to_string(model.size()) + " bytes, expected " +
           std::to_string(expect_bytes);
  }
  if (model.size() == 8) {
    int64_t version = 0;
    std::memcpy(&version, model.data(), 8);
    return version == model.version ? "ok"
                                    : "corrupt: holds version " + std::to_string(version) +
                                          ", the reply says " + std::to_string(model.version);
  }
  if (model.size() < 8 || model.size() % 4 != 0) {
    return "corrupt: " + std::to_string(model.size()) + " bytes is not a pattern model";
  }
  const uint64_t base = static_cast<uint64_t>(model.version);
  const size_t words = model.size() / 4;
  for (size_t j = 0; j < words; ++j) {
    float value;
    std::memcpy(&value, model.data() + 4 * j, 4);
    if (value != static_cast<float>((base + j) % 4096)) {
      return "corrupt at word " + std::to_string(j);
    }
  }
  return "ok";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mlfabric;
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) {
    std::cerr << "dataplane_puller: " << cl.status().message() << "\n";
    return 2;
  }
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  ClientOptions options;
  options.name = "puller";
  std::string server = "ps0", go_file;
  int64_t priority = 0, repeat = 1, expect_bytes = 0;
  reader.String("socket", &options.daemon_socket);
  reader.String("name", &options.name);
  reader.String("job", &options.job);
  reader.String("token", &options.job_token);
  reader.String("server", &server);
  reader.Int("priority", &priority, 0, 65535);
  reader.Int("repeat", &repeat, 1, 1 << 20);
  reader.Int("expect_bytes", &expect_bytes, 0, int64_t{8} << 30);
  reader.String("go_file", &go_file);
  if (auto status = reader.Finish(); !status.ok()) {
    std::cerr << "dataplane_puller: " << status.message() << "\n";
    return 2;
  }
  if (server.empty()) {
    std::cerr << "dataplane_puller: --server must name a server\n";
    return 2;
  }
  auto worker = Worker::Connect(options);
  if (!worker.ok()) {
    std::cerr << "dataplane_puller: " << worker.status().message() << "\n";
    return 1;
  }
  const std::string prefix = "dataplane_puller " + options.name + ": ";
  if (!go_file.empty()) {
    std::cout << prefix << "ready" << std::endl;
    while (::access(go_file.c_str(), F_OK) != 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  int64_t intact = 0;
  for (int64_t i = 0; i < repeat; ++i) {
    const double start_s = NowSeconds();
    absl::StatusOr<Model> model = (*worker)->Get(server, static_cast<int32_t>(priority));
    const double done_s = NowSeconds();
    if (!model.ok()) {
      std::cout << prefix << "get failed: " << model.status().message() << std::endl;
      continue;
    }
    const std::string verdict = Verify(*model, expect_bytes);
    if (verdict == "ok") ++intact;
    std::cout << prefix << "got bytes " << model->size() << " version " << model->version
              << " priority " << priority << " start_s " << FormatSeconds(start_s) << " done_s "
              << FormatSeconds(done_s) << " " << verdict << std::endl;
  }
  return intact == repeat ? 0 : 3;
}
