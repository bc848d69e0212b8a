// Constants shared by the Daemon's member definitions (daemon.cc,
// daemon_control.cc). Private to //daemon:daemon_lib.
#ifndef MLFABRIC_DAEMON_DAEMON_INTERNAL_H_
#define MLFABRIC_DAEMON_DAEMON_INTERNAL_H_

#include <cstddef>
#include <cstdint>

namespace mlfabric::internal {

// The largest transfer a data session accepts.
inline constexpr int64_t kMaxTransferBytes = int64_t{64} << 30;
// How long a get waits for a server application that the scheduler knows
// but this daemon has not recorded yet (a registration in progress).
inline constexpr double kServerConnectWaitS = 2.0;
// How long each RegisterHost attempt first waits for a connection to the
// scheduler (SchedulerClient::WaitForConnection).
inline constexpr double kRegisterConnectWaitS = 2.0;
// Connections kept for later gets, per server daemon.
inline constexpr size_t kMaxIdleGetConnections = 4;
// The grid the packet pool releases sums on (aggregator/packet_pool.h):
// what a worker's get can receive, or an aggregate can forward, as soon as
// it is final. It is the receiver's own, so senders may use any packet size.
inline constexpr uint64_t kRoundChunkBytes = 32 * 1024;

}  // namespace mlfabric::internal

namespace mlfabric {

using internal::kMaxIdleGetConnections;
using internal::kMaxTransferBytes;

}  // namespace mlfabric

#endif  // MLFABRIC_DAEMON_DAEMON_INTERNAL_H_
