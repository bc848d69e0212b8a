// The demo's worker: async SGD on its own shard. Each step it gets the
// current model, computes a minibatch gradient and pushes -lr * gradient
// (with its norm and the model version it was computed from), keeping up
// to --window pushes in flight. Runs for --duration_s and prints a summary:
//   worker w1: 140 pushes | applied 140, dropped 0, failed 0 | mean delay 1.9
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <iostream>
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
  std::string server = "ps0";
  int64_t dim = 256, seed = 42, shard = 1, samples = 8000, batch = 64, window = 2;
  double duration_s = 8, lr = 0.3, compute_delay_ms = 0;
  reader.String("socket", &options.daemon_socket);
  reader.String("name", &options.name);
  reader.String("server", &server);
  reader.Int("dim", &dim, 1, 1 << 20);
  reader.Int("seed", &seed, 0, 1 << 30);
  reader.Int("shard", &shard, 1, 1 << 20);
  reader.Int("samples", &samples, 1, 1 << 22);
  reader.Int("batch", &batch, 1, 1 << 16);
  reader.Int("window", &window, 1, 64);
  reader.Double("duration_s", &duration_s, 0.1, 86400);
  reader.Double("lr", &lr, 1e-6, 100);
  // An emulated straggler: each iteration's compute takes this much longer.
  reader.Double("compute_delay_ms", &compute_delay_ms, 0, 60000);
  if (auto status = reader.Finish(); !status.ok()) {
    std::cerr << "logreg_worker: " << status.message() << "\n";
    return 2;
  }
  if (options.name.empty()) options.name = "w" + std::to_string(shard);
  const demo::Dataset data =
      demo::MakeDataset(static_cast<int>(dim), static_cast<int>(samples),
                        static_cast<uint32_t>(seed), static_cast<uint32_t>(shard));
  auto worker = Worker::Connect(options);
  if (!worker.ok()) {
    std::cerr << "logreg_worker: " << worker.status().message() << "\n";
    return 1;
  }
  int64_t pushes = 0, applied = 0, dropped = 0, failed = 0, delay_sum = 0;
  std::string first_error;
  std::deque<std::future<PushResult>> in_flight;
  auto settle = [&] {
    PushResult r = in_flight.front().get();
    in_flight.pop_front();
    if (r.outcome == PushOutcome::kApplied) {
      ++applied;
      delay_sum += r.delay;
    } else if (r.outcome == PushOutcome::kDropped) {
      ++dropped;
    } else {
      ++failed;
      if (first_error.empty()) first_error = r.reason;
    }
  };
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(duration_s);
  size_t cursor = 0;
  while (std::chrono::steady_clock::now() < deadline && failed == 0) {
    auto model = (*worker)->Get(server);
    if (!model.ok()) {
      ++failed;
      first_error = std::string(model.status().message());
      break;
    }
    std::vector<float> weights(model->size() / sizeof(float));
    std::memcpy(weights.data(), model->data(), weights.size() * sizeof(float));
    if (weights.size() != static_cast<size_t>(dim + 1)) {
      first_error = "model from the server has the wrong size";
      ++failed;
      break;
    }
    std::vector<float> update = demo::Gradient(data, weights, cursor, batch);
    if (compute_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(compute_delay_ms));
    }
    cursor += batch;
    double norm2 = 0;
    for (float& g : update) {
      g = static_cast<float>(-lr * g);
      norm2 += double(g) * g;
    }
    in_flight.push_back((*worker)->Push(server, update.data(), update.size() * sizeof(float),
                                        model->version, std::sqrt(norm2)));
    ++pushes;
    while (static_cast<int64_t>(in_flight.size()) >= window) settle();
  }
  while (!in_flight.empty()) settle();
  std::printf("worker %s: %lld pushes | applied %lld, dropped %lld, failed %lld | mean delay %.1f%s%s\n",
              options.name.c_str(), static_cast<long long>(pushes),
              static_cast<long long>(applied), static_cast<long long>(dropped),
              static_cast<long long>(failed),
              applied ? static_cast<double>(delay_sum) / applied : 0.0,
              first_error.empty() ? "" : " | first error: ", first_error.c_str());
  return failed == 0 ? 0 : 3;
}
