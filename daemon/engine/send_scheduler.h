// The daemon's send side (docs/architecture.md §5; mercury.md §IV; tensorlights.md
// §IV): scheduled transfers released at their start time and paced by
// their rate segments, in-network aggregates whose packets leave as their
// sums complete (§5.2), and get replies, all through one priority packet
// queue drained by one sender loop.
//
//   SendScheduler send(options, clock, writer, aggregations, on_failure);
//   send.Start();                                   // the sender loop
//   RETURN_IF_ERROR(send.Schedule(transfer, buffer, tensors, checksums));
//   uint64_t reply = send.ReserveReplyId();
//   send.OpenReply(reply, socket_fd, request, model, packets);
//   send.QueueReply(reply, 0, model->size());
//   absl::Status s = send.AwaitReply(reply, no_failure, deadline);
//   send.Stop();
//
// The loop, each pass (SendReady): tells peers of given-up transfers to
// drop them (kAbort), releases transfers whose start time has come into
// the queue (a push's tensors in their priority order; an aggregate's
// packets as the AggregationTable reports them complete), then writes the
// most urgent packet whose pacer (a scheduled transfer) or the unscheduled
// budget (a get reply) has the tokens and whose peer's connection has
// drained, else sleeps until one will. A transfer that may not go now
// holds back the less urgent packets for its peer (one connection keeps
// strict priority), not those for other peers: each transfer has its own
// reservation (the scheduler planned them side by side). Writes happen without the lock. A failed write to a peer fails
// every transfer queued for it (`on_failure`, once per transfer); a failed
// reply write ends that reply only.
//
// Reply streams: the caller writes a reply's header on the session's
// socket, opens the stream, and from then on only the sender loop writes
// to that socket until AwaitReply returns. Packets of a reply may be
// queued as they become available (a round's chunks, a relayed copy).
//
// Thread safety: every method from any thread. The lock is taken inside
// and is held by nothing else while this object calls out: `on_failure`,
// the AggregationTable (its lock is a leaf) and `failed` predicates are
// called with it held, so none of them may call back into this object;
// the PacketWriter is called without it.
#ifndef MLFABRIC_DAEMON_ENGINE_SEND_SCHEDULER_H_
#define MLFABRIC_DAEMON_ENGINE_SEND_SCHEDULER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "daemon/engine/aggregation_table.h"
#include "daemon/transport/packet_checksums.h"
#include "daemon/pacing/pacer.h"
#include "daemon/queue/priority_packet_queue.h"
#include "daemon/transport/packet_writer.h"
#include "ipc/local_ipc.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

class SendScheduler {
 public:
  struct Options {
    uint32_t payload_bytes = 32 << 10;
    // Get replies' own budget in bit/s (docs/architecture.md §5); 0 = unpaced.
    double unscheduled_bps = 0;
    JobPriorityPolicy job_priority;
    // A paced transfer's token bucket holds what its fastest segment sends
    // in this long (at least two packets, at most kMaxBurstPackets). The
    // loop sleeps between bursts, and a sleep costs a wake-up (50-150 us
    // on the test VM): with a two-packet bucket the sender reached
    // 64 KiB per wake-up, ~0.6 GB/s, whatever the planned rate, and a
    // 4 MiB hop planned at 10 Gbit/s took 6-10 ms instead of 3.4. The
    // bucket bounds only how far a sender may catch up; the loop still
    // picks packet by packet from the priority queue, so an urgent packet
    // waits no longer than before. 0: two packets.
    double pacing_quantum_s = 500e-6;
    // Consecutive packets for one peer (or one get reply) leave in one
    // gather write of at most this many bytes; what the kernel does not
    // take at once goes back to the queue in its place, so an urgent packet
    // released meanwhile waits only for what the kernel holds. A value at
    // or below payload_bytes writes one packet at a time (the default: on
    // the 2-core test machine runs of 256 KiB cost the sender ~0.1 CPU-s
    // per GB and 15-20 points of goodput against a raw socket, and did not
    // make an AllReduce faster; daemon/README.md "Coalesced writes").
    uint64_t coalesce_bytes = 0;
  };
  using FailureSink = std::function<void(uint64_t transfer_id, const std::string& reason)>;

  // `clock`, `writer` and `aggregations` must outlive this object.
  // `on_failure` is told of every scheduled transfer that cannot be sent.
  SendScheduler(Options options, const Clock* clock, transport::PacketWriter* writer,
                AggregationTable* aggregations, FailureSink on_failure);
  ~SendScheduler();

  // Validates the options (the unscheduled budget) and starts the loop.
  absl::Status Start();
  // Stops the loop; AwaitReply calls return Cancelled. Idempotent.
  void Stop();

  // Scheduler time - local time, for every pacer (present and future).
  void SetClockOffset(double offset_s);
  // The scheduler's priority class of `job` (0..7, 0 = most urgent; a
  // JobPriority command): under TLs-One/RR the job ranks by its class
  // first and its id second, from the next packet on, whether or not it
  // has sent anything yet. kFifo ranks no job above another. False if the
  // job had that class already.
  bool SetJobPriorityClass(uint32_t job, int32_t priority_class);
  // The jobs from most to least urgent at local time `now_s` (tests, logs).
  std::vector<uint32_t> JobRanking(double now_s) const;

  // ---- scheduled transfers
  // Queues `buffer` for `send`'s start time. `gated`: an aggregate, whose
  // packets leave as QueueAggregatePackets (or the AggregationTable, at
  // release) says they are summed. An error (bytes disagree, unusable
  // segments) names what was wrong; nothing is queued then.
  absl::Status Schedule(const v1::SendTransfer& send, std::shared_ptr<SharedBuffer> buffer,
                        std::vector<v1::TensorInfo> tensors,
                        std::shared_ptr<const transport::PacketChecksums> checksums = nullptr,
                        bool gated = false);
  // Packets `ready` of gated transfer `id` are summed: they leave once it
  // is released (each packet once, whoever reports it first).
  void QueueAggregatePackets(uint64_t id, const std::vector<uint32_t>& ready);
  // Forgets transfer `id`; a peer that has had part of it is told to drop
  // it (kAbort with `reason`). False if it was not queued.
  bool Cancel(uint64_t id, const std::string& reason);
  // Forgets every scheduled transfer silently (the scheduler is gone; its
  // pushes fail elsewhere).
  void DropAll();
  bool Has(uint64_t id) const;

  // ---- get replies
  // A fresh id for a reply stream (bit 62 set: never a transfer id).
  uint64_t ReserveReplyId();
  // Opens reply `id` on socket `fd` for request `request` (its job, get
  // priority and transfer field): `total_packets` packets of `buffer` (may
  // be set later by SetReplyBuffer; SIZE_MAX = until EndReply).
  void OpenReply(uint64_t id, int fd, const transport::PacketHeader& request,
                 std::shared_ptr<SharedBuffer> buffer, size_t total_packets);
  void SetReplyBuffer(uint64_t id, std::shared_ptr<SharedBuffer> buffer, size_t total_packets);
  // Queues the packets of [begin, end) of the reply's buffer; unknown ids
  // are ignored (the reply ended meanwhile). `contributions` > 0: the reply
  // is a synchronous round's sum of that many pushes, said in the `tensor`
  // field of its data packets from now on (packet.h).
  void QueueReply(uint64_t id, uint64_t begin, uint64_t end, uint32_t contributions = 0);
  // No more packets come: the reply is complete once those queued are out.
  void EndReply(uint64_t id);
  // Ends the reply with `why` (the first reason wins).
  void FailReply(uint64_t id, const std::string& why);
  // Wakes AwaitReply calls to look at their `failed` predicates again.
  void Wake();
  // Blocks until every packet of reply `id` is written, a write fails
  // (Unavailable), `failed()` returns a reason (Aborted), FailReply was
  // called (Aborted), `deadline` passes (DeadlineExceeded) or the loop
  // stops (Cancelled); then closes the reply: once this returns, no packet
  // of it is queued or being written, so the caller may use the socket.
  absl::Status AwaitReply(uint64_t id, const std::function<std::string()>& failed,
                          std::chrono::steady_clock::time_point deadline);
  // Closes a reply that will not be awaited.
  void CloseReply(uint64_t id);

  // One pass of the loop: writes every packet that may leave now; returns
  // the local time at which the next may (kNever: nothing is waiting).
  // Tests call this instead of Start().
  double SendReady();

  int64_t bytes_sent() const { return bytes_sent_.load(); }
  // Writes (system calls, give or take a finished partial packet) so far:
  // with coalescing, fewer than the packets sent.
  int64_t writes() const { return writes_.load(); }
  size_t queued_packets() const;

 private:
  struct Outgoing {
    v1::SendTransfer send;
    std::shared_ptr<SharedBuffer> buffer;
    std::vector<v1::TensorInfo> tensors;
    std::shared_ptr<const transport::PacketChecksums> checksums;  // may be null (aggregates)
    std::optional<TransferPacer> pacer;
    bool begun = false;  // kBegin written to the peer
    size_t packets_left = 0;
    bool gated = false;
    bool released = false;
    std::vector<bool> queued;  // gated: packets already in the queue
  };
  struct Reply {
    int fd = -1;
    uint32_t job_id = 0;
    uint64_t request = 0;  // the asking daemon's request id
    uint32_t priority = 0;
    uint32_t contributions = 0;  // a round's sum: the pushes it sums
    std::shared_ptr<SharedBuffer> buffer;
    size_t total_packets = 0;
    size_t queued = 0;
    size_t sent = 0;
    bool writing = false;  // the loop is writing one of its packets
    bool closing = false;  // AwaitReply or CloseReply waits for `writing` to end
    uint64_t coalesce_limit = 0;  // the next write's bytes (0: the cap)
    std::string error;     // a write failed
    std::string failed;    // FailReply
  };

  // Token cap of a bucket whose fastest rate is `rate_bps`.
  double BurstBytes(double rate_bps) const;
  void Loop();
  double SendReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueAggregatePacketLocked(Outgoing& outgoing, uint32_t index)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailDestinationLocked(const std::string& dst_address, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnsureJobLocked(uint32_t job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job's rank key: its class, then its id (the same on every daemon).
  double JobRankKeyLocked(uint32_t job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The steps of SendTransferPacketLocked: take `first` and the packets
  // that may follow it to `peer` into taken_; turn them into frames_ (with
  // frame_packet_ and held_); then account for the `written` frames the
  // kernel took and put the rest back.
  void TakeTransferRunLocked(const PacketDescriptor& first, const std::string& peer, double now,
                             const absl::flat_hash_set<TransferId>& skip)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TransferFramesLocked(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SettleTransferWriteLocked(size_t written) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next coalesced write's size after one that offered `frames` and
  // had `written` of them taken.
  void AdaptLimitLocked(uint64_t* limit, const std::vector<transport::Frame>& frames,
                        size_t written) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A packet taken from the queue for a write, and its place there.
  struct Taken {
    PacketDescriptor packet;
    uint64_t sequence = 0;
  };
  // One packet of a reply and the ones that follow it in the queue for the
  // same reply (a coalesced write; `skip` as PeekSkipping), or false if the
  // budget says wait until *next_s.
  bool SendReplyPacketLocked(const PacketDescriptor& packet, Reply& reply, uint64_t id, double now,
                             double* next_s, const absl::flat_hash_set<TransferId>& skip)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One packet of a scheduled transfer and the ones that follow it in the
  // queue for the same peer (a coalesced write), or false if its pacer says
  // wait until *next_s, or its peer's connection has not drained
  // (*peer_busy).
  bool SendTransferPacketLocked(const PacketDescriptor& packet, Outgoing& outgoing, double now,
                                double* next_s, bool* peer_busy,
                                const absl::flat_hash_set<TransferId>& skip)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The last pass's peers whose connections had not drained (one transfer
  // to each), for the loop to wait on (PacketWriter::WaitPeerWritable).
  std::vector<v1::SendTransfer> busy_sends_;

  const Options options_;
  const Clock* const clock_;
  transport::PacketWriter* const writer_;
  AggregationTable* const aggregations_;
  const FailureSink on_failure_;

  mutable Mutex mu_;
  // The sender loop waits on cv_, the threads serving gets (AwaitReply,
  // CloseReply) on replies_cv_: a packet written or queued wakes only the
  // one that may go on (the loop), not every get in flight.
  CondVar cv_;
  CondVar replies_cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  double clock_offset_s_ ABSL_GUARDED_BY(mu_) = 0;
  PriorityPacketQueue queue_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, int32_t> job_classes_ ABSL_GUARDED_BY(mu_);  // by job id; absent = 0
  std::map<uint64_t, Outgoing> outgoing_ ABSL_GUARDED_BY(mu_);       // by transfer id
  std::multimap<double, uint64_t> release_at_ ABSL_GUARDED_BY(mu_);  // local start time -> transfer
  // Begun transfers given up: the loop tells the peer.
  std::vector<std::pair<v1::SendTransfer, std::string>> aborts_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Reply> replies_ ABSL_GUARDED_BY(mu_);  // by reply id
  // The loop's scratch for one coalesced write (kept to save allocations):
  // the loop thread's own, filled under mu_ and written out without it.
  std::vector<Taken> taken_;
  std::vector<transport::Frame> frames_;
  std::vector<int> frame_packet_;
  std::vector<std::shared_ptr<SharedBuffer>> held_;
  // Per peer: how many bytes the next coalesced write offers, following
  // what the kernel took of the last one (AdaptLimitLocked).
  std::map<std::string, uint64_t> coalesce_limit_ ABSL_GUARDED_BY(mu_);
  std::optional<TokenBucket> unscheduled_ ABSL_GUARDED_BY(mu_);
  uint64_t next_reply_ ABSL_GUARDED_BY(mu_) = 1;
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> writes_{0};
  std::thread thread_;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_SEND_SCHEDULER_H_
