// DeliverySequencer: the daemon's in-order delivery to server (and replica)
// applications (docs/architecture.md §3 step 6). The scheduler announces which update
// takes each commit position of an endpoint ("<job id>/<server>"); updates
// are handed over strictly in that order, a position the scheduler (or the
// daemon) cancelled is skipped, and nothing passes a position that is not
// announced yet or whose bytes have not all arrived.
//
//   sequencer.Expect(key, expect);                       // ExpectDelivery command
//   for (auto step = sequencer.Next(key, complete); step.kind != Step::kNothing;
//        step = sequencer.Next(key, complete)) {
//     if (step.kind == Step::kDeliver) { hand step.info over; sequencer.Advance(key); }
//   }
//
// Pure bookkeeping: no sockets, clock or threads (the daemon owns the
// buffers and the application channels).
// Thread safety: none; the daemon calls it under its lock.
#ifndef MLFABRIC_DAEMON_ENGINE_DELIVERY_SEQUENCER_H_
#define MLFABRIC_DAEMON_ENGINE_DELIVERY_SEQUENCER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

class DeliverySequencer {
 public:
  struct Step {
    enum Kind { kNothing, kSkip, kDeliver };
    Kind kind = kNothing;
    uint64_t sequence = 0;
    v1::ExpectDelivery info;
    std::string reason;  // kSkip: why the position is skipped
  };

  // Position info.sequence() of `key` carries `info`; cancelled at once
  // with `cancel_reason` when that is not empty. Announcing a position again
  // replaces its info; a cancellation already made stands.
  void Expect(const std::string& key, const v1::ExpectDelivery& info,
              const std::string& cancel_reason = "");
  // Cancels position `sequence` of `key` (whatever it carries). False if
  // it is not announced.
  bool Cancel(const std::string& key, uint64_t sequence, const std::string& reason);
  // Cancels the position `sequence` that carries `transfer_id`, in
  // whichever endpoint announced it; returns that announcement.
  std::optional<v1::ExpectDelivery> CancelTransfer(uint64_t sequence, uint64_t transfer_id,
                                                   const std::string& reason);
  // Lets the held position `sequence` carrying `transfer_id` (a replica
  // copy announced with info.held()) be delivered, in whichever endpoint
  // announced it; returns that announcement, or nullopt if there is none.
  std::optional<v1::ExpectDelivery> Release(uint64_t sequence, uint64_t transfer_id);
  // The held (not released, not cancelled) positions of `key`, in order.
  std::vector<v1::ExpectDelivery> Held(const std::string& key) const;
  // The announced positions of `key` not delivered, skipped or cancelled,
  // held or released, in order.
  std::vector<v1::ExpectDelivery> Undelivered(const std::string& key) const;
  // Cancels every announced, not yet cancelled position of `key`; returns
  // their transfers.
  std::vector<uint64_t> CancelAll(const std::string& key, const std::string& reason);

  // What to do next at `key`: kSkip consumes a cancelled position;
  // kDeliver names the next position when `complete(transfer)` says its
  // bytes are in (call Advance once it was handed over); kNothing when the
  // next position is not announced, not complete or held (not released).
  Step Next(const std::string& key, const std::function<bool(uint64_t transfer)>& complete);
  // Moves `key` past the position Next returned as kDeliver.
  void Advance(const std::string& key);

  // Forgets every endpoint's positions (the scheduler that announced them
  // restarted: the new one numbers from 1 again); returns the transfers of
  // the positions that were still pending.
  std::vector<uint64_t> Reset();

  // Moves endpoint `from` (its next position and what it announced) to
  // `to`, whose positions it replaces; announcements now name `server`.
  // A replica promoted to server (scheduler/service/failover.h) keeps its
  // commit order this way. Returns the transfers `to` had pending (dropped).
  std::vector<uint64_t> Rename(const std::string& from, const std::string& to,
                               const std::string& server);

  // (job id, server) of every announced position that carries `transfer_id`.
  std::vector<std::pair<uint32_t, std::string>> EndpointsExpecting(uint64_t transfer_id) const;
  // Announced positions of `key` not yet delivered or skipped.
  size_t Pending(const std::string& key) const;
  // The position of `key` to deliver or skip next (1 before any).
  uint64_t NextPosition(const std::string& key) const;

 private:
  struct Delivery {
    v1::ExpectDelivery info;
    bool held = false;  // info.held() until Release
    bool cancelled = false;
    std::string cancel_reason;
  };
  struct Endpoint {
    uint64_t next_sequence = 1;
    std::map<uint64_t, Delivery> expected;  // by sequence
  };
  std::map<std::string, Endpoint> endpoints_;
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_DELIVERY_SEQUENCER_H_
