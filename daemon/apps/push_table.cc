#include "daemon/apps/push_table.h"

namespace mlfabric::daemon {

uint64_t PushTable::Record(Push push) {
  MutexLock lock(&mu_);
  const uint64_t local = next_local_++;
  push.local_id = local;
  submitting_.emplace(local, std::move(push));
  return local;
}

void PushTable::Submitted(uint64_t local_id, uint64_t transfer_id) {
  MutexLock lock(&mu_);
  auto it = submitting_.find(local_id);
  if (it == submitting_.end()) return;  // adopted already
  pushes_[transfer_id] = std::move(it->second);
  submitting_.erase(it);
}

void PushTable::SubmitFailed(uint64_t local_id) {
  MutexLock lock(&mu_);
  submitting_.erase(local_id);
}

bool PushTable::Submitting(uint64_t local_id) const {
  MutexLock lock(&mu_);
  return submitting_.count(local_id) > 0;
}

void PushTable::Adopt(uint64_t transfer_id, uint64_t local_id) {
  MutexLock lock(&mu_);
  if (local_id == 0 || pushes_.count(transfer_id)) return;
  auto it = submitting_.find(local_id);
  if (it == submitting_.end()) return;
  pushes_[transfer_id] = std::move(it->second);
  submitting_.erase(it);
}

std::optional<PushTable::Push> PushTable::Find(uint64_t transfer_id) const {
  MutexLock lock(&mu_);
  auto it = pushes_.find(transfer_id);
  if (it == pushes_.end()) return std::nullopt;
  return it->second;
}

std::optional<PushTable::Push> PushTable::TakeForOutcome(uint64_t transfer_id,
                                                         bool hold_for_replica) {
  MutexLock lock(&mu_);
  auto it = pushes_.find(transfer_id);
  if (it == pushes_.end()) return std::nullopt;
  Push push = std::move(it->second);
  pushes_.erase(it);
  if (hold_for_replica) held_[transfer_id] = push;
  return push;
}

std::optional<PushTable::Push> PushTable::TakeHeld(uint64_t transfer_id) {
  MutexLock lock(&mu_);
  auto it = held_.find(transfer_id);
  if (it == held_.end()) return std::nullopt;
  Push push = std::move(it->second);
  held_.erase(it);
  return push;
}

std::vector<PushTable::Push> PushTable::TakeAllSubmitted() {
  MutexLock lock(&mu_);
  std::vector<Push> all;
  all.reserve(pushes_.size());
  for (auto& [id, push] : pushes_) all.push_back(std::move(push));
  pushes_.clear();
  return all;
}

std::vector<std::pair<uint64_t, PushTable::Push>> PushTable::Unresolved() const {
  MutexLock lock(&mu_);
  return {pushes_.begin(), pushes_.end()};
}

std::vector<std::pair<uint64_t, PushTable::Push>> PushTable::Held() const {
  MutexLock lock(&mu_);
  return {held_.begin(), held_.end()};
}

size_t PushTable::submitted() const {
  MutexLock lock(&mu_);
  return pushes_.size();
}

size_t PushTable::held() const {
  MutexLock lock(&mu_);
  return held_.size();
}

}  // namespace mlfabric::daemon
