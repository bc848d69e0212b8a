// The DaemonCommands the scheduler sends (proto/scheduler.proto), each built
// in one place: the plan dispatcher, the outcome state machine and the
// replica and round trackers all use these instead of filling protos by hand.
//
//   outbox.Push(host, commands::Send({id, job_id, dst, address, start_s, bytes}, segments));
//
// Pure functions of their arguments; thread-safe.
#ifndef MLFABRIC_SCHEDULER_SERVICE_COMMANDS_H_
#define MLFABRIC_SCHEDULER_SERVICE_COMMANDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "proto/scheduler.pb.h"
#include "scheduler/core/types.h"

namespace mlfabric::commands {

// What a server's (or replica's) daemon should expect at commit position
// `sequence`; round_size > 0 marks a synchronous round's member (or an
// aggregate of `contributions` members).
struct Expect {
  uint64_t transfer_id = 0;
  uint32_t job_id = 0;
  std::string server;  // "replica:<server>" at a replica's daemon
  uint64_t sequence = 0;
  int64_t bytes = 0;
  std::string src_host;
  std::string worker;
  int64_t version = 0;
  double norm = 0;
  std::vector<uint64_t> constituents;  // an aggregate's updates, in commit order
  int32_t round_size = 0;
  int32_t contributions = 0;
  v1::DType dtype = v1::DTYPE_FLOAT32;
  bool held = false;  // a replica copy held until released (ReleaseDelivery)
  uint64_t source = 0;  // a replica copy: its push
  uint64_t group_push = 0;  // a shard's held part of this group push
};
v1::DaemonCommand ExpectDelivery(const Expect& expect);
v1::DaemonCommand ReleaseDelivery(uint64_t transfer_id, uint64_t sequence,
                                  bool cancel_if_incomplete = false);

// A scheduled transfer from the receiving daemon's host.
struct Send {
  uint64_t transfer_id = 0;
  uint32_t job_id = 0;
  std::string dst_host;
  std::string dst_address;
  double start_s = 0;
  int64_t bytes = 0;
  uint64_t source_transfer_id = 0;  // a replica copy: the push whose bytes it sends
  uint64_t local_id = 0;            // a push's own transfer: its source's local id
  // A part of a group push (source_transfer_id): its bytes from this offset.
  bool part = false;
  int64_t part_offset = 0;
  // A round member's grant for its next round (round_grants.h), if any.
  std::optional<v1::RoundGrant> next_round;
};
v1::DaemonCommand SendTransfer(const Send& send, const std::vector<core::RateSegment>& segments);

// An aggregator's task (§5.2): sum `constituents` (weight 1 each, as
// asynchronous updates are summed as they are) and send the sum on.
struct Aggregate {
  uint64_t aggregate_id = 0;
  uint32_t job_id = 0;
  std::vector<uint64_t> constituents;
  std::string dst_host;
  std::string dst_address;
  double start_s = 0;
  int64_t bytes = 0;
  v1::DType dtype = v1::DTYPE_FLOAT32;
};
v1::DaemonCommand AggregateTask(const Aggregate& task,
                                const std::vector<core::RateSegment>& segments);

// Skip commit position `sequence` of `server` (the transfer will never come).
// `confirm`: the daemon answers whether it did (CancelDelivery.confirm).
v1::DaemonCommand CancelDelivery(uint64_t transfer_id, const std::string& server,
                                 uint64_t sequence, const std::string& reason,
                                 bool confirm = false);
// Erase the bytes sent on a grant (round_grants.h) for push `transfer_id`
// of `server`, which ended before it was announced; refuse any more.
v1::DaemonCommand DiscardGranted(uint64_t transfer_id, const std::string& server,
                                 const std::string& reason);
// Free the bytes a source holds for a replica copy that will not be sent.
v1::DaemonCommand ReleaseHold(uint64_t transfer_id, const std::string& reason);
// Fail synchronous round `round` of `server` at its daemon.
v1::DaemonCommand FailRound(const std::string& server, int64_t round, uint32_t job_id,
                            const std::string& reason);
// Synchronous round `round` of `server` closes with `size` pushes.
v1::DaemonCommand ShrinkRound(const std::string& server, int64_t round, uint32_t job_id,
                              int32_t size, const std::string& reason);
// A push's final outcome, for the source daemon (which tells the application).
v1::DaemonCommand PushOutcome(uint64_t transfer_id, uint64_t local_id, v1::Outcome outcome,
                              const std::string& reason);

// Make this host's replica of `server` the server (failover.h).
v1::DaemonCommand PromoteReplica(uint32_t job_id, const std::string& server,
                                 const std::string& old_host, const std::string& reason,
                                 int64_t model_version);

// The segments daemons carry out: empty ones (which move nothing) left out.
void AddSegments(const std::vector<core::RateSegment>& segments,
                 google::protobuf::RepeatedPtrField<v1::RateSegment>* out);

}  // namespace mlfabric::commands

#endif  // MLFABRIC_SCHEDULER_SERVICE_COMMANDS_H_
