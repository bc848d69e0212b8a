// ReceiveLock: the one lock of the daemon's receive side (DESIGN.md §5).
//
// A data packet's arrival touches the transfers being received
// (IncomingTransfers), a synchronous round (RoundService), an in-network
// aggregate (NetworkAggregation) and the commit order of the server it is
// for (Deliveries) in one step: a transfer summed into a round must not be
// cancelled, recycled or delivered in between. So those parts keep their
// own tables but share this lock, which their entry points take and their
// `...Locked` methods require. The engine tables they use (RoundTable,
// AggregationTable, DeliverySequencer, ...) have leaf locks of their own,
// taken under this one, never the other way round. Nothing holds it across
// an RPC or a blocking socket write.
//
// `cv` is signalled whenever what a waiter under the lock may wait for
// changes: a server application connecting or leaving, a round beginning
// or failing, a data session or a get ending, the daemon stopping.
#ifndef MLFABRIC_DAEMON_RECEIVE_RECEIVE_LOCK_H_
#define MLFABRIC_DAEMON_RECEIVE_RECEIVE_LOCK_H_

#include <condition_variable>
#include <mutex>

namespace mlfabric::daemon {

struct ReceiveLock {
  std::mutex mu;
  std::condition_variable cv;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_RECEIVE_RECEIVE_LOCK_H_
