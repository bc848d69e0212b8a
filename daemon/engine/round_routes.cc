#include "daemon/engine/round_routes.h"

namespace mlfabric::daemon {

RoundRoutes::Route RoundRoutes::Join(const std::string& key, int64_t round,
                                     const std::string& host, const std::string& address) {
  MutexLock lock(&mu_);
  if (fanout_ <= 0 || host.empty() || address.empty()) return {};
  // Forget rounds of this key older than the newest rounds_kept.
  auto first = rounds_.lower_bound({key, INT64_MIN});
  while (first != rounds_.end() && first->first.first == key &&
         first->first.second <= round - rounds_kept_) {
    first = rounds_.erase(first);
  }
  Round& r = rounds_[{key, round}];
  if (!r.hosts.insert(host).second) return {};  // its host has (or gets) a copy already
  const size_t k = r.tree.size();
  r.tree.emplace_back(host, address);
  const size_t fanout = static_cast<size_t>(fanout_);
  if (k < fanout) return {};
  const auto& [via_host, via_address] = r.tree[(k - fanout) / fanout];
  return {via_host, via_address};
}

}  // namespace mlfabric::daemon
