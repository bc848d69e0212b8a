#include "daemon/queue/job_priority_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace mlfabric::daemon {

absl::StatusOr<JobPriorityMode> ParseJobPriorityMode(absl::string_view name) {
  if (name == "fifo") return JobPriorityMode::kFifo;
  if (name == "one") return JobPriorityMode::kOne;
  if (name == "rr") return JobPriorityMode::kRr;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown job priority mode '", name,
                   "' (expected fifo, one or rr)"));
}

const char* JobPriorityModeName(JobPriorityMode mode) {
  switch (mode) {
    case JobPriorityMode::kFifo:
      return "fifo";
    case JobPriorityMode::kOne:
      return "one";
    case JobPriorityMode::kRr:
      return "rr";
  }
  return "?";
}

JobPriorityPolicy::JobPriorityPolicy(JobPriorityOptions options)
    : options_(options) {}

absl::StatusOr<JobPriorityPolicy> JobPriorityPolicy::Create(
    JobPriorityOptions options) {
  if (options.mode == JobPriorityMode::kRr &&
      !(std::isfinite(options.rotation_period_s) &&
        options.rotation_period_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rotation_period_s must be positive and finite, got ",
                     options.rotation_period_s));
  }
  if (!std::isfinite(options.epoch_s)) {
    return absl::InvalidArgumentError("epoch_s must be finite");
  }
  return JobPriorityPolicy(options);
}

absl::Status JobPriorityPolicy::AddJob(JobId job, double rank_key) {
  if (base_index_.contains(job)) {
    return absl::AlreadyExistsError(absl::StrCat("job ", job, " already registered"));
  }
  if (std::isnan(rank_key)) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job, ": rank_key is NaN"));
  }
  base_order_.push_back({job, rank_key, next_arrival_++});
  Rebuild();
  return absl::OkStatus();
}

absl::Status JobPriorityPolicy::RemoveJob(JobId job) {
  auto it = base_index_.find(job);
  if (it == base_index_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", job, " not registered"));
  }
  base_order_.erase(base_order_.begin() + it->second);
  Rebuild();
  return absl::OkStatus();
}

absl::Status JobPriorityPolicy::SetRankKey(JobId job, double rank_key) {
  auto it = base_index_.find(job);
  if (it == base_index_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", job, " not registered"));
  }
  if (std::isnan(rank_key)) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job, ": rank_key is NaN"));
  }
  base_order_[it->second].rank_key = rank_key;
  Rebuild();
  return absl::OkStatus();
}

void JobPriorityPolicy::Rebuild() {
  // Strict weak ordering on (rank_key, arrival): arrival is unique.
  std::sort(base_order_.begin(), base_order_.end(),
            [](const Entry& a, const Entry& b) {
              return std::tie(a.rank_key, a.arrival) <
                     std::tie(b.rank_key, b.arrival);
            });
  base_index_.clear();
  for (size_t i = 0; i < base_order_.size(); ++i) {
    base_index_[base_order_[i].job] = i;
  }
}

int64_t JobPriorityPolicy::RotationIndex(double now_s) const {
  if (options_.mode != JobPriorityMode::kRr || !(now_s > options_.epoch_s)) {
    return 0;
  }
  return static_cast<int64_t>(
      std::floor((now_s - options_.epoch_s) / options_.rotation_period_s));
}

JobPriorityPolicy::Rank JobPriorityPolicy::RankOfRegistered(
    JobId job, double now_s) const {
  if (options_.mode == JobPriorityMode::kFifo) return 0;
  auto it = base_index_.find(job);
  if (it == base_index_.end()) return std::numeric_limits<Rank>::max();
  const int64_t index = static_cast<int64_t>(it->second);
  if (options_.mode == JobPriorityMode::kOne) return static_cast<Rank>(index);
  const int64_t n = static_cast<int64_t>(base_order_.size());
  const int64_t k = RotationIndex(now_s) % n;
  return static_cast<Rank>(((index - k) % n + n) % n);
}

absl::StatusOr<JobPriorityPolicy::Rank> JobPriorityPolicy::RankOf(
    JobId job, double now_s) const {
  if (!base_index_.contains(job)) {
    return absl::NotFoundError(absl::StrCat("job ", job, " not registered"));
  }
  return RankOfRegistered(job, now_s);
}

std::vector<JobId> JobPriorityPolicy::Ranking(double now_s) const {
  std::vector<JobId> ranking(base_order_.size());
  if (options_.mode == JobPriorityMode::kFifo) {
    // Arrival order.
    std::vector<Entry> by_arrival = base_order_;
    std::sort(by_arrival.begin(), by_arrival.end(),
              [](const Entry& a, const Entry& b) { return a.arrival < b.arrival; });
    for (size_t i = 0; i < by_arrival.size(); ++i) ranking[i] = by_arrival[i].job;
    return ranking;
  }
  for (const Entry& e : base_order_) {
    ranking[RankOfRegistered(e.job, now_s)] = e.job;
  }
  return ranking;
}

double JobPriorityPolicy::NextChangeTime(double now_s) const {
  if (options_.mode != JobPriorityMode::kRr || base_order_.size() < 2) {
    return std::numeric_limits<double>::infinity();
  }
  if (now_s < options_.epoch_s) return options_.epoch_s + options_.rotation_period_s;
  return options_.epoch_s +
         static_cast<double>(RotationIndex(now_s) + 1) * options_.rotation_period_s;
}

}  // namespace mlfabric::daemon
