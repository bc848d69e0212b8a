// RoundService: Mercury-PS synchronous rounds on this host (mercury.md §IV
// Key idea 3, mlfabric.md §6). Every member push of a round for a server
// here is summed packet by packet as it arrives (RoundTable), the sum
// streams back chunk by chunk to the workers' gets as soon as each chunk
// is final (a later requester through an earlier one when RoundRoutes says
// so), and the complete sum is handed to the server application once, as
// one update that advances its model by one version.
//
//   RoundService rounds(options, &lock, &stopping, &incoming, &servers, &send, &reporter, &watchdog, &pool);
//   rounds.JoinLocked(expect);                       // a member announced
//   rounds.FoldPacketLocked(transfer, data, offset, length);
//   rounds.ServeGet(fd, request, body, round);       // a worker's get (blocks)
//   rounds.AwaitSum(job, server, round, &v, &sum);   // a get from this host
//
// A failure (a member cancelled, the server gone, a bad size) fails the
// whole round: each member is reported failed once, and the gets waiting
// for it are told why.
//
// Thread safety: the `...Locked` methods require the receive side's lock
// (receive_lock.h); ServeGet takes it (and waits on its condition
// variable) and writes to the socket without it.
#ifndef MLFABRIC_DAEMON_ENGINE_ROUND_SERVICE_H_
#define MLFABRIC_DAEMON_ENGINE_ROUND_SERVICE_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/control/completion_reporter.h"
#include "ipc/buffer_pool.h"
#include "daemon/engine/round_routes.h"
#include "daemon/engine/round_table.h"
#include "daemon/engine/send_scheduler.h"
#include "daemon/engine/incoming_transfers.h"
#include "daemon/engine/local_round_sums.h"
#include "daemon/engine/receive_lock.h"
#include "daemon/engine/server_endpoints.h"
#include "daemon/transport/packet.h"
#include "daemon/transport/send_watchdog.h"
#include "proto/local.pb.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

class RoundService : public LocalRoundSums {
 public:
  struct Options {
    std::string host;
    int64_t rounds_kept = 4;        // --rounds_kept
    double round_wait_s = 300;      // --round_wait_s
    int64_t get_tree_min_bytes = 1 << 20;  // --get_tree_min_bytes: smaller sums come from the root
    int round_tree_fanout = 2;      // --round_tree_fanout
    uint32_t payload_bytes = 32 * 1024;  // packets of the streamed sum
    uint64_t chunk_bytes = 32 * 1024;  // the grid a sum is released on
  };
  RoundService(Options options, ReceiveLock* lock, const std::atomic<bool>* stopping,
               IncomingTransfers* incoming, ServerEndpoints* servers, SendScheduler* send,
               CompletionReporter* reporter, transport::SendWatchdog* watchdog,
               BufferPool* pool);
  RoundService(const RoundService&) = delete;
  RoundService& operator=(const RoundService&) = delete;

  // Whether `transfer` is a member of a round here; the job of its round.
  bool IsMemberLocked(uint64_t transfer) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  std::optional<uint32_t> JobOfLocked(uint64_t transfer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // A member announced (kExpect with round_size): it joins its round, and
  // the packets that arrived before are summed now.
  void JoinLocked(const v1::ExpectDelivery& expect) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // A packet of member `transfer` arrived at `data`: summed.
  void FoldPacketLocked(uint64_t transfer, const uint8_t* data, uint64_t offset,
                        uint32_t length) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // Fails `key`'s rounds (its server left, the scheduler went away);
  // `spare_delivering` keeps a round whose sum was handed over already.
  void FailServerLocked(const std::string& key, const std::string& reason,
                        bool spare_delivering = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  void FailLocked(const std::string& key, int64_t round, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // Round `round` of `key` closes with `size` pushes (RoundTable::Shrink).
  void ShrinkLocked(const std::string& key, int64_t round, int32_t size, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // Fails the round `transfer` is a member of; false if it is none's.
  bool FailMemberLocked(uint64_t transfer, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // The server acknowledged `ack.transfer_id()`: if it was a round's sum,
  // the report of each member (nullopt if it was no round's).
  std::optional<std::vector<v1::CompletionReport>> AcknowledgedLocked(
      const v1::LocalUpdateAck& ack) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);

  // A worker's daemon asks for round `round`'s sum of `body.server()`
  // (data-plane get, offset = round + 1): waits up to round_wait_s for the
  // round to begin, then streams the sum as it becomes final, or routes the
  // requester through an earlier one, or tells why not.
  absl::Status ServeGet(int fd, const transport::PacketHeader& request,
                        const v1::DataGetRequest& body, int64_t round);

  // An application on this host asks for round `round`'s sum
  // (LocalRoundSums): waits up to round_wait_s for the round to begin and
  // then for its sum to be complete, and copies it into a buffer of the
  // caller's; no socket. Errors are ServeGet's.
  absl::Status AwaitSum(uint32_t job, const std::string& server, int64_t round,
                        int64_t* version, std::shared_ptr<SharedBuffer>* sum,
                        uint32_t* contributions) override;

  int64_t rounds_delivered() const { return rounds_delivered_.load(); }
  int64_t gets_routed() const { return gets_routed_.load(); }
  // Round sums handed to applications on this host without a socket.
  int64_t local_gets() const { return local_gets_.load(); }
  int64_t local_get_bytes() const { return local_get_bytes_.load(); }

 private:
  // Waits (on the receive lock's condition, the lock held) until round
  // `round` of `key` has begun; "" then, else why it cannot be had.
  std::string AwaitBegunLocked(const std::string& key, const std::string& server, int64_t round,
                               std::chrono::steady_clock::time_point deadline, int64_t* bytes)
                                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // ServeGet: watches round `round_number` of `key` for reply `stream`
  // and queues the chunks already final (the receive lock held); "" then, else
  // why the round failed meanwhile.
  std::string OpenSumStreamLocked(const std::string& key, int64_t round_number, uint64_t stream,
                                  int fd, const transport::PacketHeader& request)
                                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  void ApplyLocked(RoundTable::Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  void DeliverLocked(const std::string& key, int64_t round, RoundTable::Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);

  const Options options_;
  ReceiveLock* const lock_;
  const std::atomic<bool>* const stopping_;
  IncomingTransfers* const incoming_ ABSL_PT_GUARDED_BY(receive_side);
  ServerEndpoints* const servers_;
  SendScheduler* const send_;
  CompletionReporter* const reporter_;
  transport::SendWatchdog* const watchdog_;
  BufferPool* const pool_;  // may be null
  RoundTable table_;     // own lock, a leaf under the receive lock
  RoundRoutes routes_;   // which earlier requester forwards a sum to each later one
  std::atomic<int64_t> rounds_delivered_{0};
  std::atomic<int64_t> gets_routed_{0};
  std::atomic<int64_t> local_gets_{0};
  std::atomic<int64_t> local_get_bytes_{0};
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_ROUND_SERVICE_H_
