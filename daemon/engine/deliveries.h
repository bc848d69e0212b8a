// Deliveries: updates handed to this host's server and replica
// applications strictly in the commit order the scheduler planned
// (mlfabric.md §3.3, docs/architecture.md §3 step 5), once their bytes are in.
//
// The DeliverySequencer holds the order; this part carries it out: it
// hands complete transfers over (ServerEndpoints), skips and fails what
// was cancelled, reports the parts of group pushes whose bytes
// are all in, and carries the held replica copies and group parts across
// a lost schedule stream, for the next scheduler to decide.
//
//   Deliveries deliveries("h1", &incoming, &servers, &reporter);
//   deliveries.ExpectLocked(expect);       // a kExpect command
//   deliveries.ArrivedLocked(transfer);    // its last byte came
//   deliveries.ReleaseLocked(release);     // a held copy's push applied
//
// Thread safety: every method requires the receive side's lock
// (receive_lock.h).
#ifndef MLFABRIC_DAEMON_ENGINE_DELIVERIES_H_
#define MLFABRIC_DAEMON_ENGINE_DELIVERIES_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/control/completion_reporter.h"
#include "daemon/engine/delivery_sequencer.h"
#include "daemon/engine/incoming_transfers.h"
#include "daemon/engine/replica_snapshots.h"
#include "daemon/engine/server_endpoints.h"
#include "proto/scheduler.pb.h"

namespace mlfabric::daemon {

class Deliveries {
 public:
  // `snapshots` (may be null) is asked for the snapshots due at each
  // hand-over.
  Deliveries(std::string host, IncomingTransfers* incoming, ServerEndpoints* servers,
             CompletionReporter* reporter, ReplicaSnapshots* snapshots = nullptr);
  Deliveries(const Deliveries&) = delete;
  Deliveries& operator=(const Deliveries&) = delete;

  // The scheduler announces an update for a server (or replica) here: it
  // takes its place in the commit order, or fails at once if the server's
  // application is not connected.
  void ExpectLocked(const v1::ExpectDelivery& expect) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // `transfer` arrived whole: the endpoints expecting it deliver what they
  // can.
  void ArrivedLocked(uint64_t transfer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // A registration of endpoint name `server` here ended
  // (ServerEndpoints::EndRegistrationLocked, after PublishLocked if it
  // succeeded): the positions announced for it meanwhile are delivered
  // now, or fail as "not connected" if no application took the endpoint.
  void RegistrationEndedLocked(const std::string& server)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // Hands `server`'s next updates over while they are complete (and asks
  // for the replica snapshots due between them).
  void TryDeliverLocked(uint32_t job_id, const std::string& server)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // The job that expects `transfer` here, if one does.
  std::optional<uint32_t> JobExpectingLocked(uint64_t transfer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // kRelease: a held replica copy's push applied, or every shard has its
  // part of a group push (or, `cancel_if_incomplete`, its source left).
  void ReleaseLocked(const v1::ReleaseDelivery& release)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // kCancel of an expected update (or a held copy kept across a lost
  // stream). Not found: handed over already; the acknowledgement answers.
  void CancelLocked(const v1::CancelDelivery& cancel) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // kCancel of a held copy kept across a lost stream (its push did not
  // apply): forgotten with its bytes; false if it is not one.
  bool DropHeldCopyLocked(uint64_t transfer, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // Fails everything `key` expects with `why`; returns the transfers.
  std::vector<uint64_t> CancelAllLocked(const std::string& key, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // A promoted replica's commit positions carry on under the server's
  // key; returns the old server's deliveries dropped here.
  std::vector<uint64_t> RenameLocked(const std::string& from, const std::string& to,
                                     const std::string& server)
                                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);

  // At a lost schedule stream: keeps the held replica copies and group
  // parts whose bytes are in (their pushes' outcomes are not known here),
  // notes the copies still arriving as lost, then cancels every expected
  // update; returns how many were cancelled.
  size_t ScheduleLostLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // A restarted scheduler numbers commit positions from 1 again: forgets
  // every position and the transfers still expected; returns how many.
  size_t ResetLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // The held copies for the registration (RegisterHostRequest.held_copies);
  // `Told` forgets the lost ones once a registration carried them.
  void DescribeHeldCopiesLocked(v1::RegisterHostRequest* request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  void ToldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side) { lost_copies_.clear(); }

  // Updates handed over.
  int64_t delivered() const { return delivered_.load(); }

 private:
  // Reports the held parts of group pushes expected at `key`
  // whose bytes are all in: the scheduler releases them once every
  // shard's part is.
  void ReportReadyPartsLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // A cancelled position of the commit order, passed over.
  void SkipLocked(const DeliverySequencer::Step& step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // Hands the complete update `step` to `server`'s application and logs
  // what it carries; a failure to is reported as the transfer's.
  void HandOverLocked(const std::string& key, const std::string& server,
                      const DeliverySequencer::Step& step, const Incoming& incoming)
                          ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // Notes the pushes the update `transfer_id` just handed over carries:
  // applied by a server, or copied to a replica (ServerEndpoints' logs).
  void LogHandedLocked(uint64_t transfer_id, const v1::ExpectDelivery& info)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  void KeepHeldCopiesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_side);
  // "server 'ps' is not connected to h1's daemon"
  std::string NotConnected(const std::string& server) const;

  const std::string host_;
  IncomingTransfers* const incoming_ ABSL_PT_GUARDED_BY(receive_side);
  ServerEndpoints* const servers_;
  CompletionReporter* const reporter_;
  ReplicaSnapshots* const snapshots_;
  DeliverySequencer sequencer_ ABSL_GUARDED_BY(receive_side);  // commit order, by ServerKey
  // Held replica copies (and group parts) whose bytes were all in when the
  // schedule stream broke, by transfer id (their bytes stay in incoming_):
  // told to the scheduler at registration, which has them delivered again
  // or dropped.
  std::map<uint64_t, v1::HeldCopy> orphan_copies_ ABSL_GUARDED_BY(receive_side);
  // Held copies dropped incomplete at the lost stream: told once, at the
  // next registration.
  std::map<uint64_t, v1::HeldCopy> lost_copies_ ABSL_GUARDED_BY(receive_side);
  // Held parts of group pushes whose bytes are not all in yet,
  // by transfer id -> their endpoint's key; reported ready, then forgotten.
  std::map<uint64_t, std::string> unready_parts_ ABSL_GUARDED_BY(receive_side);
  // Endpoints (server name, job id) with positions announced while an
  // application of that name was registering here (ExpectLocked).
  std::set<std::pair<std::string, uint32_t>> awaiting_registration_
      ABSL_GUARDED_BY(receive_side);
  std::atomic<int64_t> delivered_{0};
};

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_DELIVERIES_H_
