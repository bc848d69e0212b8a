#include "scheduler/service/batch_work.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace mlfabric {

void PlanInParallel(const core::Planner& planner, int threads, std::vector<BatchWork>* work) {
  std::stable_sort(work->begin(), work->end(), [](const BatchWork& a, const BatchWork& b) {
    return a.priority_class < b.priority_class;
  });
  std::atomic<size_t> next{0};
  auto run = [&](int thread_index) {
    for (size_t i = next.fetch_add(1); i < work->size(); i = next.fetch_add(1)) {
      BatchWork& item = (*work)[i];
      const auto started = std::chrono::steady_clock::now();
      item.plan = planner.PlanBatch(item.batch);
      item.compute_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
              .count();
      item.worker_thread = thread_index;
    }
  };
  const int count = std::min<int>(std::max(1, threads), static_cast<int>(work->size()));
  std::vector<std::thread> helpers;
  for (int t = 1; t < count; ++t) helpers.emplace_back(run, t);
  run(0);
  for (std::thread& helper : helpers) helper.join();
}

}  // namespace mlfabric
