// RoundRoutes: how the workers of a synchronous round receive its sum from
// the root's daemon (Mercury PS, §6 of mlfabric.md; docs/architecture.md §3 "The
// server's link is the scarce resource"): through a tree over the order in
// which their gets arrive, instead of one copy per worker from the root.
//
// With fanout F, the first F requesters of a round are answered by the
// root's daemon; requester k >= F is routed to requester (k - F) / F, which
// forwards each chunk of the sum the moment it arrives (cut-through,
// daemon/engine/relay_table.h). Every requester serves at most F others and
// the depth is about log_F of the round's size. The order is the order of
// arrival: a requester that asked earlier has its own copy under way
// (the get of a rank whose host is slow arrives late and is a leaf).
//
//   RoundRoutes routes(/*fanout=*/2, /*rounds_kept=*/4);
//   RoundRoutes::Route r = routes.Join(key, round, host, address);
//   r.via_host.empty() ? answer from here : tell the get to ask r.via_host
//
// A second get from a host already in the round (two workers on one host)
// is answered from the root; so are gets of a host that did not give its
// address. Rounds older than the newest `rounds_kept` are forgotten.
//
// Thread safety: every method may be called from any thread (own lock, a
// leaf).
#ifndef MLFABRIC_DAEMON_ENGINE_ROUND_ROUTES_H_
#define MLFABRIC_DAEMON_ENGINE_ROUND_ROUTES_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace mlfabric::daemon {

class RoundRoutes {
 public:
  struct Route {
    std::string via_host;  // empty: from the root's daemon
    std::string via_address;
  };

  // fanout 0 turns trees off (every get from the root).
  RoundRoutes(int fanout, int64_t rounds_kept) : fanout_(fanout), rounds_kept_(rounds_kept) {}

  Route Join(const std::string& key, int64_t round, const std::string& host,
             const std::string& address);

 private:
  struct Round {
    std::vector<std::pair<std::string, std::string>> tree;  // (host, address), arrival order
    std::set<std::string> hosts;
  };

  const int fanout_;
  const int64_t rounds_kept_;
  Mutex mu_;
  std::map<std::pair<std::string, int64_t>, Round> rounds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_ROUND_ROUTES_H_
