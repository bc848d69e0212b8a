#include "daemon/engine/applied_log.h"

#include <utility>

namespace mlfabric::daemon {

void AppliedLog::Handed(uint64_t transfer_id, std::vector<uint64_t> pushes) {
  if (pushes.empty()) pushes.push_back(transfer_id);
  handed_[transfer_id] = std::move(pushes);
}

std::vector<uint64_t> AppliedLog::Acked(uint64_t transfer_id, bool applied, int64_t version) {
  auto it = handed_.find(transfer_id);
  if (it == handed_.end()) return {};
  std::vector<uint64_t> pushes = std::move(it->second);
  handed_.erase(it);
  if (applied) {
    const int64_t n = static_cast<int64_t>(pushes.size());
    for (int64_t i = 0; i < n; ++i) Add(pushes[i], version - (n - 1 - i));
  }
  return pushes;
}

void AppliedLog::Applied(uint64_t push, int64_t version) { Add(push, version); }

void AppliedLog::Add(uint64_t push, int64_t version) {
  if (!applied_ids_.insert(push).second) return;
  applied_.push_back({push, version, true});
  while (applied_.size() > capacity_) {
    applied_ids_.erase(applied_.front().push);
    applied_.pop_front();
  }
}

std::vector<AppliedLog::Entry> AppliedLog::Report() const {
  std::vector<Entry> out(applied_.begin(), applied_.end());
  for (const auto& [transfer, pushes] : handed_) {
    for (uint64_t push : pushes) out.push_back({push, 0, false});
  }
  return out;
}

bool AppliedLog::Contains(uint64_t push) const { return applied_ids_.count(push) > 0; }

}  // namespace mlfabric::daemon
