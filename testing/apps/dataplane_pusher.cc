// Data-plane test and benchmark worker: pushes --pushes updates of --bytes
// bytes, split into --tensors equal tensors whose priorities are
// --priority, --priority + --priority_step, ... (lower = more urgent, the
// Mercury order within a transfer), keeping up to --window pushes in flight.
//
//   dataplane_pusher --socket=/tmp/w1.sock --name=big --bytes=1073741824 --priority=10
//
// Every update is float32 words with integer values a server can check
// (word 0 = the push's seed, word j = (seed + j) mod 4096; see
// dataplane_server). With --go_file the pusher connects and fills its
// buffer first, then waits for that file to exist before pushing, so a test
// can release a push at a chosen moment without paying for start-up then.
// Prints one line per push and a summary:
//   dataplane_pusher big: push 0 applied version 1 delay 0
//   dataplane_pusher big: applied=1 dropped=0 failed=0
// Exits 0 only if every push was applied.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <future>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "api/mlfabric.h"
#include "common/config.h"
#include "nlohmann/json.hpp"

namespace {

void FillUpdate(std::vector<float>* words, int64_t seed) {
  (*words)[0] = static_cast<float>(seed);
  for (size_t j = 1; j < words->size(); ++j) {
    (*words)[j] = static_cast<float>((static_cast<uint64_t>(seed) + j) % 4096);
  }
}

// Equal tensors of whole words of `words`; the last one takes the
// remainder. Tensor t's priority is priority + t * priority_step; false,
// after saying so, when one falls outside [0, 65535].
bool TensorLayout(uint64_t words, int64_t tensors, int64_t priority, int64_t priority_step,
                  std::vector<mlfabric::TensorSpec>* layout) {
  for (int64_t t = 0; t < tensors; ++t) {
    const uint64_t tensor_words =
        t + 1 < tensors ? words / tensors : words - (words / tensors) * (tensors - 1);
    const int64_t p = priority + t * priority_step;
    if (p < 0 || p > 65535) {
      std::cerr << "dataplane_pusher: tensor " << t << " gets priority " << p
                << ", outside [0, 65535]\n";
      return false;
    }
    layout->push_back({static_cast<uint32_t>(t), tensor_words * 4, static_cast<int32_t>(p)});
  }
  return true;
}

// Says "ready", then waits until `go_file` exists.
void AwaitGoFile(const std::string& name, const std::string& go_file) {
  std::cout << "dataplane_pusher " << name << ": ready" << std::endl;
  while (::access(go_file.c_str(), F_OK) != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mlfabric;
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) {
    std::cerr << "dataplane_pusher: " << cl.status().message() << "\n";
    return 2;
  }
  ConfigReader reader(nlohmann::json::object(), "flags", cl->flags);
  ClientOptions options;
  options.name = "pusher";
  std::string server = "ps0", go_file;
  int64_t bytes = 1 << 20, tensors = 1, priority = 0, priority_step = 0, pushes = 1, window = 1,
          seed = 1;
  reader.String("socket", &options.daemon_socket);
  reader.String("name", &options.name);
  reader.String("job", &options.job);
  reader.String("token", &options.job_token);
  reader.String("server", &server);
  reader.Int("bytes", &bytes, 8, int64_t{8} << 30);
  reader.Int("tensors", &tensors, 1, 4096);
  reader.Int("priority", &priority, 0, 65535);
  reader.Int("priority_step", &priority_step, -65535, 65535);
  reader.Int("pushes", &pushes, 1, 1 << 20);
  reader.Int("window", &window, 1, 1024);
  reader.Int("seed", &seed, 1, 1 << 20);
  reader.String("go_file", &go_file);
  if (auto status = reader.Finish(); !status.ok()) {
    std::cerr << "dataplane_pusher: " << status.message() << "\n";
    return 2;
  }
  if (bytes % 4 != 0 || bytes / 4 < tensors) {
    std::cerr << "dataplane_pusher: --bytes must be a multiple of 4 with at least one word per "
                 "tensor (bytes "
              << bytes << ", tensors " << tensors << ")\n";
    return 2;
  }
  const uint64_t words = static_cast<uint64_t>(bytes) / 4;
  std::vector<TensorSpec> layout;
  if (!TensorLayout(words, tensors, priority, priority_step, &layout)) return 2;
  auto worker = Worker::Connect(options);
  if (!worker.ok()) {
    std::cerr << "dataplane_pusher: " << worker.status().message() << "\n";
    return 1;
  }
  std::vector<float> update(words);
  FillUpdate(&update, seed);
  if (!go_file.empty()) AwaitGoFile(options.name, go_file);
  int applied = 0, dropped = 0, failed = 0;
  int64_t known_version = (*worker)->initial_version();
  std::deque<std::future<PushResult>> in_flight;
  int64_t settled = 0;
  auto settle = [&] {
    PushResult result = in_flight.front().get();
    in_flight.pop_front();
    std::cout << "dataplane_pusher " << options.name << ": push " << settled++ << " "
              << PushOutcomeName(result.outcome);
    if (result.outcome == PushOutcome::kApplied) {
      ++applied;
      known_version = std::max(known_version, result.applied_version);
      std::cout << " version " << result.applied_version << " delay " << result.delay;
    } else {
      (result.outcome == PushOutcome::kDropped ? dropped : failed)++;
      std::cout << ": " << result.reason;
    }
    std::cout << std::endl;
  };
  for (int64_t i = 0; i < pushes; ++i) {
    if (i > 0) FillUpdate(&update, seed + i);
    in_flight.push_back((*worker)->Push(server, update.data(), static_cast<size_t>(bytes),
                                        known_version, /*norm=*/1.0, layout));
    if (static_cast<int64_t>(in_flight.size()) >= window) settle();
  }
  while (!in_flight.empty()) settle();
  std::cout << "dataplane_pusher " << options.name << ": applied=" << applied
            << " dropped=" << dropped << " failed=" << failed << std::endl;
  return applied == pushes ? 0 : 3;
}
