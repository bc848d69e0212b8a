#include "scheduler/service/straggler_tracker.h"

#include <algorithm>

namespace mlfabric {
namespace {

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double upper = values[mid];
  const double lower = *std::max_element(values.begin(), values.begin() + mid);
  return (lower + upper) / 2;
}

double Median(const std::deque<double>& values) {
  return Median(std::vector<double>(values.begin(), values.end()));
}

}  // namespace

StragglerTracker::StragglerTracker(StragglerOptions options) : options_(options) {}

void StragglerTracker::Keep(std::deque<double>* samples, double value) const {
  samples->push_back(value);
  while (static_cast<int>(samples->size()) > std::max(1, options_.window)) samples->pop_front();
}

void StragglerTracker::OnPush(const std::string& job, const std::string& worker, double now_s) {
  Samples& s = workers_[{job, worker}];
  ++s.iterations;
  if (s.last_push_s >= 0 && now_s >= s.last_push_s) {
    const double iteration = now_s - s.last_push_s;
    Keep(&s.iteration_s, iteration);
    if (s.last_transfer_s >= 0) Keep(&s.compute_s, std::max(0.0, iteration - s.last_transfer_s));
  }
  s.last_push_s = now_s;
  s.last_transfer_s = -1;  // the new push's, once it ends
}

void StragglerTracker::OnOutcome(const std::string& job, const std::string& worker,
                                 double submitted_s, double now_s) {
  auto it = workers_.find({job, worker});
  if (it == workers_.end() || now_s < submitted_s) return;
  Samples& s = it->second;
  Keep(&s.transfer_s, now_s - submitted_s);
  if (submitted_s >= s.last_push_s) s.last_transfer_s = now_s - submitted_s;
}

void StragglerTracker::Leave(const std::string& job, const std::string& worker) {
  auto it = workers_.find({job, worker});
  if (it != workers_.end()) it->second.left = true;
}

void StragglerTracker::Rejoin(const std::string& job, const std::string& worker) {
  auto it = workers_.find({job, worker});
  if (it == workers_.end() || !it->second.left) return;
  it->second.left = false;
  it->second.last_push_s = -1;  // its next push starts a new iteration
  it->second.last_transfer_s = -1;
}

std::vector<WorkerTiming> StragglerTracker::Evaluate(const std::string& job) const {
  std::vector<WorkerTiming> out;
  std::vector<double> judged;
  for (auto it = workers_.lower_bound({job, ""}); it != workers_.end() && it->first.first == job;
       ++it) {
    const Samples& s = it->second;
    if (s.left) continue;
    WorkerTiming t;
    t.worker = it->first.second;
    t.iterations = s.iterations;
    t.iteration_s = Median(s.iteration_s);
    t.transfer_s = Median(s.transfer_s);
    t.compute_s = Median(s.compute_s);
    if (static_cast<int>(s.iteration_s.size()) >= options_.min_samples) {
      judged.push_back(t.iteration_s);
    }
    out.push_back(std::move(t));
  }
  // A straggler needs peers to be slower than: at least two judged workers.
  if (judged.size() < 2) return out;
  const double median = Median(judged);
  if (median <= 0) return out;
  for (WorkerTiming& t : out) {
    const auto& s = workers_.at({job, t.worker});
    if (static_cast<int>(s.iteration_s.size()) < options_.min_samples) continue;
    t.slowdown = t.iteration_s / median;
    t.straggler = t.slowdown > options_.factor;
  }
  return out;
}

int64_t StragglerTracker::Iterations(const std::string& job, const std::string& worker) const {
  auto it = workers_.find({job, worker});
  return it == workers_.end() ? 0 : it->second.iterations;
}

bool StragglerTracker::IsStraggler(const std::string& job, const std::string& worker) const {
  for (const WorkerTiming& t : Evaluate(job)) {
    if (t.worker == worker) return t.straggler;
  }
  return false;
}

}  // namespace mlfabric
