#include "daemon/engine/relay_table.h"

namespace mlfabric::daemon {

bool RelayTable::Begin(const std::string& key, uint64_t batch, int64_t version,
                       std::shared_ptr<SharedBuffer> model, Effects* effects) {
  MutexLock lock(&mu_);
  auto [it, added] = copies_.try_emplace({key, batch});
  if (!added && it->second.state != State::kFailed) return false;
  Copy& copy = it->second;  // a failed copy has no watchers left
  copy = Copy{};
  copy.version = version;
  copy.model = std::move(model);
  copy.order = next_order_++;
  ++stats_.copies;
  EvictLocked(key, copy.order, effects);
  return true;
}

void RelayTable::EvictLocked(const std::string& key, uint64_t newest, Effects* effects) {
  for (auto it = copies_.lower_bound({key, 0}); it != copies_.end() && it->first.first == key;) {
    Copy& copy = it->second;
    if (copy.state == State::kReceiving || copy.order >= newest) {
      ++it;
      continue;
    }
    // Finished: its watchers were told at Finish, and a forward in progress
    // holds the buffer itself (Watch::model).
    if (copy.model != nullptr) effects->dropped.push_back(std::move(copy.model));
    it = copies_.erase(it);
  }
}

RelayTable::Effects RelayTable::Arrived(const std::string& key, uint64_t batch, uint64_t begin,
                                        uint64_t end, uint32_t contributions) {
  MutexLock lock(&mu_);
  Effects effects;
  auto it = copies_.find({key, batch});
  if (it == copies_.end() || it->second.state != State::kReceiving || end <= begin) {
    return effects;
  }
  Copy& copy = it->second;
  if (contributions > 0) copy.contributions = contributions;
  effects.contributions = copy.contributions;
  // Consecutive packets extend the last range, so a finished copy is one.
  if (!copy.arrived.empty() && copy.arrived.back().second == begin) {
    copy.arrived.back().second = end;
  } else {
    copy.arrived.emplace_back(begin, end);
  }
  for (uint64_t stream : copy.watchers) effects.forward.push_back({stream, {begin, end}});
  return effects;
}

RelayTable::Effects RelayTable::Finish(const std::string& key, uint64_t batch,
                                       const std::string& error) {
  MutexLock lock(&mu_);
  Effects effects;
  auto it = copies_.find({key, batch});
  if (it == copies_.end() || it->second.state != State::kReceiving) return effects;
  Copy& copy = it->second;
  if (error.empty()) {
    copy.state = State::kDone;
    effects.complete.assign(copy.watchers.begin(), copy.watchers.end());
  } else {
    copy.state = State::kFailed;
    copy.error = error;
    copy.model.reset();
    for (uint64_t stream : copy.watchers) effects.fail.emplace_back(stream, error);
  }
  copy.watchers.clear();
  return effects;
}

RelayTable::Watch RelayTable::AddWatcher(const std::string& key, uint64_t batch,
                                         uint64_t stream) {
  MutexLock lock(&mu_);
  Watch watch;
  auto it = copies_.find({key, batch});
  if (it == copies_.end()) {
    auto later = copies_.upper_bound({key, batch});
    if (later != copies_.end() && later->first.first == key) watch.state = State::kGone;
    return watch;
  }
  Copy& copy = it->second;
  watch.state = copy.state;
  watch.error = copy.error;
  if (copy.state == State::kFailed) return watch;
  watch.version = copy.version;
  watch.model = copy.model;
  watch.ready = copy.arrived;
  watch.contributions = copy.contributions;
  if (stream == 0) return watch;  // a look only
  ++stats_.forwards;
  if (copy.state == State::kReceiving) copy.watchers.insert(stream);
  return watch;
}

RelayTable::State RelayTable::StateOf(const std::string& key, uint64_t batch,
                                      std::string* error) const {
  MutexLock lock(&mu_);
  auto it = copies_.find({key, batch});
  if (it == copies_.end()) {
    auto later = copies_.upper_bound({key, batch});
    return later != copies_.end() && later->first.first == key ? State::kGone : State::kUnknown;
  }
  if (error != nullptr) *error = it->second.error;
  return it->second.state;
}

void RelayTable::RemoveWatcher(const std::string& key, uint64_t batch, uint64_t stream) {
  MutexLock lock(&mu_);
  auto it = copies_.find({key, batch});
  if (it != copies_.end()) it->second.watchers.erase(stream);
}

RelayTable::Stats RelayTable::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

size_t RelayTable::copies() const {
  MutexLock lock(&mu_);
  return copies_.size();
}

}  // namespace mlfabric::daemon
