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
#include <string>
#include <thread>
#include <vector>

#include "api/mlfabric.h"
#include "common/config.h"
#include "nlohmann/json.hpp"
#include "tools/demo/logreg.h"

namespace {

struct Flags {
  mlfabric::ClientOptions options;
  std::string server = "ps0";
  int64_t dim = 256, seed = 42, shard = 1, samples = 8000, batch = 64, window = 2;
  double duration_s = 8, lr = 0.3, compute_delay_ms = 0;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  auto cl = mlfabric::ParseCommandLine(argc, argv);
  if (!cl.ok()) return false;
  mlfabric::ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  reader.String("socket", &f->options.daemon_socket);
  reader.String("name", &f->options.name);
  reader.String("server", &f->server);
  reader.Int("dim", &f->dim, 1, 1 << 20);
  reader.Int("seed", &f->seed, 0, 1 << 30);
  reader.Int("shard", &f->shard, 1, 1 << 20);
  reader.Int("samples", &f->samples, 1, 1 << 22);
  reader.Int("batch", &f->batch, 1, 1 << 16);
  reader.Int("window", &f->window, 1, 64);
  reader.Double("duration_s", &f->duration_s, 0.1, 86400);
  reader.Double("lr", &f->lr, 1e-6, 100);
  // An emulated straggler: each iteration's compute takes this much longer.
  reader.Double("compute_delay_ms", &f->compute_delay_ms, 0, 60000);
  if (auto status = reader.Finish(); !status.ok()) {
    std::cerr << "logreg_worker: " << status.message() << "\n";
    return false;
  }
  if (f->options.name.empty()) f->options.name = "w" + std::to_string(f->shard);
  return true;
}

// How this worker's pushes ended.
struct Outcomes {
  int64_t pushes = 0, applied = 0, dropped = 0, failed = 0, delay_sum = 0;
  std::string first_error;

  void Count(const mlfabric::PushResult& r) {
    if (r.outcome == mlfabric::PushOutcome::kApplied) {
      ++applied;
      delay_sum += r.delay;
    } else if (r.outcome == mlfabric::PushOutcome::kDropped) {
      ++dropped;
    } else {
      Fail(r.reason);
    }
  }
  void Fail(const std::string& why) {
    ++failed;
    if (first_error.empty()) first_error = why;
  }
};

}  // namespace

int main(int argc, char** argv) {
  using namespace mlfabric;
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  const demo::Dataset data =
      demo::MakeDataset(static_cast<int>(f.dim), static_cast<int>(f.samples),
                        static_cast<uint32_t>(f.seed), static_cast<uint32_t>(f.shard));
  auto worker = Worker::Connect(f.options);
  if (!worker.ok()) {
    std::cerr << "logreg_worker: " << worker.status().message() << "\n";
    return 1;
  }
  Outcomes o;
  std::deque<std::future<PushResult>> in_flight;
  auto settle = [&] {
    o.Count(in_flight.front().get());
    in_flight.pop_front();
  };
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(f.duration_s);
  size_t cursor = 0;
  while (std::chrono::steady_clock::now() < deadline && o.failed == 0) {
    auto model = (*worker)->Get(f.server);
    if (!model.ok()) {
      o.Fail(std::string(model.status().message()));
      break;
    }
    std::vector<float> weights(model->size() / sizeof(float));
    std::memcpy(weights.data(), model->data(), weights.size() * sizeof(float));
    if (weights.size() != static_cast<size_t>(f.dim + 1)) {
      o.Fail("model from the server has the wrong size");
      break;
    }
    std::vector<float> update = demo::Gradient(data, weights, cursor, f.batch);
    if (f.compute_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(f.compute_delay_ms));
    }
    cursor += f.batch;
    double norm2 = 0;
    for (float& g : update) {
      g = static_cast<float>(-f.lr * g);
      norm2 += double(g) * g;
    }
    in_flight.push_back((*worker)->Push(f.server, update.data(), update.size() * sizeof(float),
                                        model->version, std::sqrt(norm2)));
    ++o.pushes;
    while (static_cast<int64_t>(in_flight.size()) >= f.window) settle();
  }
  while (!in_flight.empty()) settle();
  std::printf("worker %s: %lld pushes | applied %lld, dropped %lld, failed %lld | mean delay %.1f%s%s\n",
              f.options.name.c_str(), static_cast<long long>(o.pushes),
              static_cast<long long>(o.applied), static_cast<long long>(o.dropped),
              static_cast<long long>(o.failed),
              o.applied ? static_cast<double>(o.delay_sum) / o.applied : 0.0,
              o.first_error.empty() ? "" : " | first error: ", o.first_error.c_str());
  return o.failed == 0 ? 0 : 3;
}
