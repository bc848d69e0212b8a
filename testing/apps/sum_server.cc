// Test server application: keeps a float32 vector model and adds every
// delivered update to it (model += update). With --expect_updates=K it
// exits after K applied updates and writes the model, one value per line,
// to --out. Used by tests/ to check end-to-end exactness.
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>

#include "api/mlfabric.h"
#include "common/config.h"
#include "nlohmann/json.hpp"

int main(int argc, char** argv) {
  using namespace mlfabric;
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) return 2;
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  ClientOptions options;
  options.name = "ps0";
  int64_t dim = 1024, expect_updates = 0, progress_every = 0;
  std::string out;
  reader.String("socket", &options.daemon_socket);
  reader.String("name", &options.name);
  reader.String("job", &options.job);
  reader.String("token", &options.job_token);
  reader.Int("dim", &dim, 1, 1 << 28);
  reader.Int("expect_updates", &expect_updates, 0, 1 << 30);
  reader.String("out", &out);
  reader.Int("progress_every", &progress_every, 0, 1 << 30);
  if (auto status = reader.Finish(); !status.ok()) {
    std::cerr << "sum_server: " << status.message() << "\n";
    return 2;
  }
  auto server = Server::Connect(options);
  if (!server.ok()) {
    std::cerr << "sum_server: " << server.status().message() << "\n";
    return 1;
  }
  std::vector<float> model(dim, 0.0f);
  int64_t version = (*server)->initial_version();
  int64_t applied = 0;
  auto write_model = [&] {
    if (out.empty()) return;
    std::ofstream file(out + ".tmp");
    for (float v : model) file << v << "\n";
    file.close();
    std::rename((out + ".tmp").c_str(), out.c_str());
  };
  (*server)->RegisterUpdateCallback([&](const Server::Update& u) -> absl::StatusOr<int64_t> {
    if (u.bytes != model.size() * sizeof(float)) {
      return absl::InvalidArgumentError("update size does not match the model");
    }
    const float* values = reinterpret_cast<const float*>(u.data);
    for (size_t i = 0; i < model.size(); ++i) model[i] += values[i];
    applied += u.count;
    if (u.count > 1) {
      std::cout << "sum_server: aggregate of " << u.count << " updates (" << u.worker << ")"
                << std::endl;
    }
    if (progress_every > 0 && (applied / progress_every) != ((applied - u.count) / progress_every)) {
      std::cout << "sum_server: applied " << applied << std::endl;
    }
    if (expect_updates > 0 && applied >= expect_updates && applied - u.count < expect_updates) {
      write_model();
      std::cout << "sum_server: applied " << applied << " updates, version " << version + u.count
                << std::endl;
    }
    version += u.count;
    return version;
  });
  (*server)->RegisterRequestCallback([&]() -> absl::StatusOr<Server::Snapshot> {
    Server::Snapshot snapshot;
    snapshot.version = version;
    snapshot.bytes.resize(model.size() * sizeof(float));
    std::memcpy(snapshot.bytes.data(), model.data(), snapshot.bytes.size());
    return snapshot;
  });
  absl::Status status = (*server)->Serve();
  if (!status.ok()) {
    std::cerr << "sum_server: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
