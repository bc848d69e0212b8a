#include "scheduler/service/job_membership.h"

#include "absl/strings/str_cat.h"

namespace mlfabric {

bool JobMembership::Join(const std::string& worker, double now_s, const std::string& reason) {
  if (!members_.insert(worker).second) return false;
  left_.erase(worker);
  Record(worker, true, now_s, reason);
  joined_at_[worker] = generation_;
  return true;
}

bool JobMembership::Leave(const std::string& worker, double now_s, const std::string& reason) {
  if (members_.erase(worker) == 0) return false;
  joined_at_.erase(worker);
  Record(worker, false, now_s, reason);
  left_[worker] = history_.back();
  return true;
}

uint64_t JobMembership::JoinedAt(const std::string& worker) const {
  auto it = joined_at_.find(worker);
  return it == joined_at_.end() ? 0 : it->second;
}

size_t JobMembership::MembersSince(uint64_t generation) const {
  size_t n = 0;
  for (const auto& [worker, joined] : joined_at_) n += joined <= generation ? 1 : 0;
  return n;
}

std::string JobMembership::WhyLeft(const std::string& worker) const {
  auto it = left_.find(worker);
  if (it == left_.end()) return "";
  return absl::StrCat(it->second.reason, " (generation ", it->second.generation, ")");
}

void JobMembership::Record(const std::string& worker, bool joined, double now_s,
                           const std::string& reason) {
  ++generation_;
  history_.push_back({now_s, worker, joined, reason, generation_});
  while (history_.size() > kHistoryKept) history_.pop_front();
}

}  // namespace mlfabric
