// Test worker application: pushes --pushes integer-valued float32 vectors
// of --dim values (deterministic from --seed), keeping up to --window pushes
// in flight, then gets the model once. Writes the element-wise sum of what
// it pushed to --out and prints one line per outcome kind:
//   vector_worker w1: applied=20 dropped=0 failed=0 get_version=57 buffers_reused=16
// Stops pushing after the first failed push. Exits 0 only if every push
// was applied, 3 otherwise.
#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <future>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "api/mlfabric.h"
#include "common/config.h"
#include "nlohmann/json.hpp"

namespace {

using mlfabric::TensorSpec;
using mlfabric::Worker;

// A push of `dim` floats as two tensors: the front half first, as layer
// order would have it (one tensor when there is no front half).
std::vector<TensorSpec> Tensors(int64_t dim) {
  const uint64_t half = static_cast<uint64_t>(dim / 2) * sizeof(float);
  std::vector<TensorSpec> tensors = {{0, half, 0},
                                     {1, static_cast<uint64_t>(dim) * sizeof(float) - half, 1}};
  if (half == 0) tensors.erase(tensors.begin());
  return tensors;
}

// Gets the model once: its version, or -1 with `failed` counted (also when
// it is not `dim` floats long, with its version).
int64_t GetOnce(Worker& worker, const std::string& name, const std::string& server, int64_t dim,
                int* failed) {
  auto model = worker.Get(server);
  if (!model.ok()) {
    std::cout << "vector_worker " << name << ": get failed: " << model.status().message()
              << std::endl;
    ++*failed;
    return -1;
  }
  if (model->size() != static_cast<size_t>(dim) * sizeof(float)) ++*failed;
  return model->version;
}

// Writes `sum`, one value a line, to `out` (through a temporary file, so
// a reader never sees half of it).
void WriteSum(const std::string& out, const std::vector<double>& sum) {
  std::ofstream file(out + ".tmp");
  for (double v : sum) file << v << "\n";
  file.close();
  std::rename((out + ".tmp").c_str(), out.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mlfabric;
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) return 2;
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  ClientOptions options;
  options.name = "worker";
  std::string server = "ps0", out;
  int64_t dim = 1024, pushes = 10, window = 4, seed = 1;
  bool do_get = true;
  reader.String("socket", &options.daemon_socket);
  reader.String("name", &options.name);
  reader.String("job", &options.job);
  reader.String("token", &options.job_token);
  reader.String("server", &server);
  reader.Int("dim", &dim, 1, 1 << 28);
  reader.Int("pushes", &pushes, 0, 1 << 20);
  reader.Int("window", &window, 1, 1024);
  reader.Int("seed", &seed, 0, 1 << 30);
  reader.Bool("get", &do_get);
  reader.String("out", &out);
  if (auto status = reader.Finish(); !status.ok()) {
    std::cerr << "vector_worker: " << status.message() << "\n";
    return 2;
  }
  auto worker = Worker::Connect(options);
  if (!worker.ok()) {
    std::cerr << "vector_worker: " << worker.status().message() << "\n";
    return 1;
  }
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int> value(-50, 50);
  std::vector<double> sum(dim, 0.0);
  std::deque<std::future<PushResult>> in_flight;
  int applied = 0, dropped = 0, failed = 0;
  // The freshest model version this worker knows of: each applied push
  // tells it (as a worker that keeps getting the model would know).
  int64_t known_version = (*worker)->initial_version();
  auto settle = [&](PushResult result) {
    if (result.outcome == PushOutcome::kApplied) {
      ++applied;
      known_version = std::max(known_version, result.applied_version);
    }
    if (result.outcome == PushOutcome::kDropped) ++dropped;
    if (result.outcome == PushOutcome::kFailed) {
      ++failed;
      std::cout << "vector_worker " << options.name << ": push failed: " << result.reason
                << std::endl;
    }
  };
  // A failure means the path is broken (e.g. the daemon died): stop pushing.
  for (int64_t i = 0; i < pushes && failed == 0; ++i) {
    std::vector<float> update(dim);
    double norm2 = 0;
    for (int64_t j = 0; j < dim; ++j) {
      update[j] = static_cast<float>(value(rng));
      sum[j] += update[j];
      norm2 += double(update[j]) * update[j];
    }
    std::vector<TensorSpec> tensors = Tensors(dim);
    in_flight.push_back((*worker)->Push(server, update.data(), update.size() * sizeof(float),
                                        known_version, std::sqrt(norm2), tensors));
    if (static_cast<int64_t>(in_flight.size()) >= window) {
      settle(in_flight.front().get());
      in_flight.pop_front();
    }
  }
  while (!in_flight.empty()) {
    settle(in_flight.front().get());
    in_flight.pop_front();
  }
  int64_t get_version = -1;
  if (do_get) get_version = GetOnce(**worker, options.name, server, dim, &failed);
  if (!out.empty()) WriteSum(out, sum);
  std::cout << "vector_worker " << options.name << ": applied=" << applied
            << " dropped=" << dropped << " failed=" << failed << " get_version=" << get_version
            << " buffers_reused=" << (*worker)->push_buffers_reused() << std::endl;
  return applied == pushes && failed == 0 ? 0 : 3;
}
