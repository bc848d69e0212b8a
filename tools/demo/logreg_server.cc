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
#include <vector>

#include "api/mlfabric.h"
#include "common/config.h"
#include "nlohmann/json.hpp"
#include "tools/demo/logreg.h"

namespace {

// The model and how far it got; the callbacks and the progress lines share it.
struct LogregModel {
  std::mutex mu;
  std::vector<float> weights;
  int64_t version = 0;
  int64_t applied = 0;
};

// model += update, in commit order; gets read a copy.
void ServeModel(mlfabric::Server& server, LogregModel* m) {
  using mlfabric::Server;
  server.RegisterUpdateCallback([m](const Server::Update& u) -> absl::StatusOr<int64_t> {
    if (u.bytes != m->weights.size() * sizeof(float)) {
      return absl::InvalidArgumentError("update has the wrong size for this model");
    }
    const float* delta = reinterpret_cast<const float*>(u.data);
    std::lock_guard<std::mutex> lock(m->mu);
    for (size_t j = 0; j < m->weights.size(); ++j) m->weights[j] += delta[j];
    m->applied += u.count;
    m->version += u.count;
    return m->version;
  });
  server.RegisterRequestCallback([m]() -> absl::StatusOr<Server::Snapshot> {
    std::lock_guard<std::mutex> lock(m->mu);
    Server::Snapshot snapshot;
    snapshot.version = m->version;
    snapshot.bytes.resize(m->weights.size() * sizeof(float));
    std::memcpy(snapshot.bytes.data(), m->weights.data(), snapshot.bytes.size());
    return snapshot;
  });
}

// Once a second until `duration_s`: the test loss and accuracy of a copy.
void PrintProgress(const mlfabric::demo::Dataset& test, double duration_s, LogregModel* m) {
  const auto start = std::chrono::steady_clock::now();
  for (int tick = 1; tick <= static_cast<int>(duration_s); ++tick) {
    std::this_thread::sleep_until(start + std::chrono::seconds(tick));
    std::vector<float> snapshot;
    int64_t seen_applied, seen_version;
    {
      std::lock_guard<std::mutex> lock(m->mu);
      snapshot = m->weights;
      seen_applied = m->applied;
      seen_version = m->version;
    }
    const mlfabric::demo::Evaluation now = mlfabric::demo::Evaluate(test, snapshot);
    std::printf("[%4.1fs] server: %5lld updates applied | model v%-5lld | test loss %.4f | accuracy %5.1f%%\n",
                static_cast<double>(tick), static_cast<long long>(seen_applied),
                static_cast<long long>(seen_version), now.loss, 100 * now.accuracy);
    std::fflush(stdout);
  }
  std::this_thread::sleep_until(start + std::chrono::duration<double>(duration_s));
}

}  // namespace

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
  LogregModel m;
  m.weights.assign(dim + 1, 0.0f);
  m.version = (*server)->initial_version();
  ServeModel(**server, &m);
  std::thread serving([&] {
    if (auto status = (*server)->Serve(); !status.ok()) {
      std::cerr << "logreg_server: " << status.message() << "\n";
    }
  });
  const double initial_loss = demo::Evaluate(test, m.weights).loss;
  PrintProgress(test, duration_s, &m);
  (*server)->Stop();
  serving.join();
  std::lock_guard<std::mutex> lock(m.mu);
  const demo::Evaluation last = demo::Evaluate(test, m.weights);
  std::printf("server: done | %lld updates applied | model v%lld | test loss %.4f -> %.4f | accuracy %.1f%%\n",
              static_cast<long long>(m.applied), static_cast<long long>(m.version), initial_loss,
              last.loss, 100 * last.accuracy);
  return last.loss < initial_loss ? 0 : 4;
}
