#include "daemon/engine/get_batcher.h"

#include <algorithm>
#include <utility>

namespace mlfabric::daemon {

GetBatcher::Ticket GetBatcher::Join(const std::string& key, const std::string& requester,
                                    const std::string& address) {
  MutexLock lock(&mu_);
  ++stats_.gets;
  Key& state = keys_[key];
  Ticket ticket;
  // A get that comes while the previous batch's copies are still leaving,
  // with no batch open yet, joins that batch's tree as a leaf when a member
  // of it can take one more (it has, or is receiving, that copy).
  if (state.open == 0 && state.leaving != 0 && !requester.empty()) {
    auto leaving = batches_.find(state.leaving);
    if (leaving != batches_.end() && leaving->second.late_joins_per_member > 0 &&
        leaving->second.answered && leaving->second.snapshot.error.empty()) {
      Batch& b = leaving->second;
      const int parent = LateParent(b, requester);
      if (parent >= 0) {
        const size_t p = static_cast<size_t>(parent);
        ++b.late_children[p];
        ticket.batch = state.leaving;
        ticket.member = static_cast<int>(b.members);
        ticket.late = true;
        ++b.members;
        b.requesters.push_back(requester);
        b.addresses.push_back("");  // a late leaf forwards to nobody
        b.late_children.push_back(b.late_joins_per_member);
        b.routes.resize(b.requesters.size() - 1);
        b.routes.push_back({b.requesters[p], b.addresses[p]});
        ++stats_.late_joins;
        return ticket;
      }
    }
  }
  if (state.open != 0) {
    ticket.batch = state.open;
  } else {
    ticket.batch = next_id_++;
    ticket.ask = true;
    state.open = ticket.batch;
    batches_[ticket.batch].key = key;
  }
  Batch& batch = batches_[ticket.batch];
  ticket.member = static_cast<int>(batch.members);
  ++batch.members;
  batch.requesters.push_back(requester);
  batch.addresses.push_back(address);
  batch.late_children.push_back(0);
  return ticket;
}

int GetBatcher::LateParent(const Batch& b, const std::string& requester) {
  // With the scheduler's rates (cut-through plans): the fastest place.
  bool rated = false;
  for (const Route& route : b.routes) rated = rated || route.uplink_bps > 0;
  int parent = -1;
  double best_bps = 0;
  for (size_t i = 0; i < b.requesters.size(); ++i) {
    if (b.requesters[i] == requester) return -1;  // its host has (or gets) this copy
    if (b.requesters[i].empty() || b.late_children[i] >= b.late_joins_per_member ||
        b.addresses[i].empty()) {
      continue;
    }
    if (!rated) {
      if (parent < 0 || b.late_children[i] < b.late_children[static_cast<size_t>(parent)]) {
        parent = static_cast<int>(i);
      }
      continue;
    }
    if (i >= b.routes.size() || b.routes[i].uplink_bps <= 0) continue;
    const Route& route = b.routes[i];
    const double shared = route.uplink_bps / (route.children + b.late_children[i] + 1);
    const double bps = route.rate_bps > 0 ? std::min(route.rate_bps, shared) : shared;
    if (bps >= b.min_late_bps && bps > best_bps) {
      parent = static_cast<int>(i);
      best_bps = bps;
    }
  }
  return parent;
}

bool GetBatcher::MayAsk(uint64_t batch) const {
  MutexLock lock(&mu_);
  auto it = batches_.find(batch);
  if (it == batches_.end()) return true;
  auto key = keys_.find(it->second.key);
  return key == keys_.end() || key->second.leaving == 0 || key->second.leaving == batch;
}

void GetBatcher::Answer(uint64_t batch, Snapshot snapshot) {
  MutexLock lock(&mu_);
  auto it = batches_.find(batch);
  if (it == batches_.end() || it->second.answered) return;
  it->second.answered = true;
  it->second.snapshot = std::move(snapshot);
  if (it->second.snapshot.error.empty()) ++stats_.snapshots;
  Key& state = keys_[it->second.key];
  if (state.open == batch) state.open = 0;
  // It leaves now; gets that come meanwhile gather in the next batch. (A
  // batch asked past its bound replaces the one still leaving as the one
  // waited for.)
  state.leaving = batch;
  EraseIfLeftLocked(batch);
}

void GetBatcher::FailKey(const std::string& key, const std::string& error) {
  MutexLock lock(&mu_);
  auto state = keys_.find(key);
  if (state == keys_.end() || state->second.open == 0) return;
  const uint64_t id = state->second.open;
  state->second.open = 0;
  auto it = batches_.find(id);
  if (it == batches_.end()) return;
  it->second.answered = true;
  it->second.snapshot = Snapshot{0, nullptr, error};
  EraseIfLeftLocked(id);
}

std::optional<GetBatcher::Snapshot> GetBatcher::Result(uint64_t batch) const {
  MutexLock lock(&mu_);
  auto it = batches_.find(batch);
  if (it == batches_.end() || !it->second.answered) return std::nullopt;
  return it->second.snapshot;
}

std::vector<std::string> GetBatcher::Requesters(uint64_t batch) const {
  MutexLock lock(&mu_);
  auto it = batches_.find(batch);
  if (it == batches_.end()) return {};
  return it->second.requesters;
}

void GetBatcher::SetRoutes(uint64_t batch, std::vector<Route> routes,
                           int late_joins_per_member, double min_late_bps) {
  MutexLock lock(&mu_);
  auto it = batches_.find(batch);
  if (it == batches_.end()) return;
  Batch& b = it->second;
  b.routed = true;
  b.routes = std::move(routes);
  b.late_joins_per_member = late_joins_per_member;
  b.min_late_bps = min_late_bps;
}

std::optional<GetBatcher::Route> GetBatcher::RouteOf(uint64_t batch, int member) const {
  MutexLock lock(&mu_);
  auto it = batches_.find(batch);
  if (it == batches_.end()) return Route{};
  const Batch& b = it->second;
  if (b.answered && !b.snapshot.error.empty()) return Route{};
  if (!b.routed) return std::nullopt;
  if (member < 0 || static_cast<size_t>(member) >= b.routes.size()) return Route{};
  return b.routes[static_cast<size_t>(member)];
}

int GetBatcher::DirectCopies(uint64_t batch) const {
  MutexLock lock(&mu_);
  auto it = batches_.find(batch);
  if (it == batches_.end()) return 0;
  const Batch& b = it->second;
  int direct = 0;
  for (size_t i = 0; i < static_cast<size_t>(b.members); ++i) {
    if (i >= b.routes.size() || b.routes[i].via_host.empty()) ++direct;
  }
  return direct;
}

void GetBatcher::Leave(uint64_t batch) {
  MutexLock lock(&mu_);
  auto it = batches_.find(batch);
  if (it == batches_.end()) return;
  ++it->second.left;
  EraseIfLeftLocked(batch);
}

void GetBatcher::EraseIfLeftLocked(uint64_t id) {
  auto it = batches_.find(id);
  if (it == batches_.end() || !it->second.answered || it->second.left < it->second.members) {
    return;
  }
  auto state = keys_.find(it->second.key);
  if (state != keys_.end()) {
    if (state->second.leaving == id) state->second.leaving = 0;
    if (state->second.open == 0 && state->second.leaving == 0) keys_.erase(state);
  }
  batches_.erase(it);
}

GetBatcher::Stats GetBatcher::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

size_t GetBatcher::batches() const {
  MutexLock lock(&mu_);
  return batches_.size();
}

}  // namespace mlfabric::daemon
