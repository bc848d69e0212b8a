// The demo's parameter server: holds a logistic-regression model, applies
// every update MLfabric delivers (model += update, in commit order), serves
// the model to workers' gets, and once a second prints its progress on a
// held-out test set. Runs for --duration_s, then prints a summary line:
//   server: done | 412 updates applied | model v412 | loss 0.693 -> 0.284 | accuracy 91.2%
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>

#include "api/mlfabric.h"
#include "common/config.h"
#include "tools/demo/logreg.h"

int main(int argc, char** argv) {
  using namespace mlfabric;
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) return 2;
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  ClientOptions options;
  options.name = "ps0";
  int64_t dim = 256, seed = 42, test_samples = 4000;
  double duration_s = 10;
  reader.String("socket", &options.daemon_socket);
  reader.String("name", &options.name);
  reader.Int("dim", &dim, 1, 1 << 20);
  reader.Int("seed", &seed, 0, 1 << 30);
  reader.Int("test_samples", &test_samples, 10, 1 << 22);
  reader.Double("duration_s", &duration_s, 0.1, 86400);
  if (auto status = reader.Finish(); !status.ok()) {
    std::cerr << "logreg_server: " << status.message() << "\n";
    return 2;
  }
  const demo::Dataset test = demo::MakeDataset(static_cast<int>(dim), static_cast<int>(test_samples),
                                               static_cast<uint32_t>(seed), /*shard=*/0);
  auto server = Server::Connect(options);
  if (!server.ok()) {
    std::cerr << "logreg_server: " << server.status().message() << "\n";
    return 1;
  }
  std::mutex mu;
  std::vector<float> model(dim + 1, 0.0f);
  int64_t version = (*server)->initial_version();
  int64_t applied = 0;
  (*server)->RegisterUpdateCallback([&](const Server::Update& u) -> absl::StatusOr<int64_t> {
    if (u.bytes != model.size() * sizeof(float)) {
      return absl::InvalidArgumentError("update has the wrong size for this model");
    }
    const float* delta = reinterpret_cast<const float*>(u.data);
    std::lock_guard<std::mutex> lock(mu);
    for (size_t j = 0; j < model.size(); ++j) model[j] += delta[j];
    applied += u.count;
    version += u.count;
    return version;
  });
  (*server)->RegisterRequestCallback([&]() -> absl::StatusOr<Server::Snapshot> {
    std::lock_guard<std::mutex> lock(mu);
    Server::Snapshot snapshot;
    snapshot.version = version;
    snapshot.bytes.resize(model.size() * sizeof(float));
    std::memcpy(snapshot.bytes.data(), model.data(), snapshot.bytes.size());
    return snapshot;
  });
  std::thread serving([&] {
    if (auto status = (*server)->Serve(); !status.ok()) {
      std::cerr << "logreg_server: " << status.message() << "\n";
    }
  });
  const double initial_loss = demo::Evaluate(test, model).loss;
  const auto start = std::chrono::steady_clock::now();
  demo::Evaluation last{initial_loss, 0};
  for (int tick = 1; tick <= static_cast<int>(duration_s); ++tick) {
    std::this_thread::sleep_until(start + std::chrono::seconds(tick));
    std::vector<float> snapshot;
    int64_t seen_applied, seen_version;
    {
      std::lock_guard<std::mutex> lock(mu);
      snapshot = model;
      seen_applied = applied;
      seen_version = version;
    }
    last = demo::Evaluate(test, snapshot);
    std::printf("[%4.1fs] server: %5lld updates applied | model v%-5lld | test loss %.4f | accuracy %5.1f%%\n",
                static_cast<double>(tick), static_cast<long long>(seen_applied),
                static_cast<long long>(seen_version), last.loss, 100 * last.accuracy);
    std::fflush(stdout);
  }
  std::this_thread::sleep_until(start + std::chrono::duration<double>(duration_s));
  (*server)->Stop();
  serving.join();
  {
    std::lock_guard<std::mutex> lock(mu);
    last = demo::Evaluate(test, model);
    std::printf("server: done | %lld updates applied | model v%lld | test loss %.4f -> %.4f | accuracy %.1f%%\n",
                static_cast<long long>(applied), static_cast<long long>(version), initial_loss,
                last.loss, 100 * last.accuracy);
  }
  return last.loss < initial_loss ? 0 : 4;
}
