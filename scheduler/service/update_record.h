// UpdateRecord: what the scheduler knows of one push from SubmitUpdate to
// its outcome (the outcome state machine is ClusterState's, cluster_state.h).
// In a header of its own so that owners keeping records beside
// ClusterState::pushes() (ReplicaLedger's pushes decided by their replica
// copy) need not include cluster_state.h.
//
//   UpdateRecord record;
//   record.transfer_id = state.NewTransferId();
//   record.state = UpdateState::kPending;  // until a batch plans it
//
// Thread safety: a plain value; its holders guard it.
#ifndef MLFABRIC_SCHEDULER_SERVICE_UPDATE_RECORD_H_
#define MLFABRIC_SCHEDULER_SERVICE_UPDATE_RECORD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "proto/scheduler.pb.h"
#include "scheduler/service/snapshot.h"

namespace mlfabric {

enum class UpdateState { kPending, kInFlight };

struct UpdateRecord {
  uint64_t transfer_id = 0;
  std::string job;
  std::string server;
  std::string src_host;
  std::string worker;
  uint64_t local_id = 0;
  int64_t bytes = 0;
  int64_t version = 0;
  double norm = 0;
  UpdateState state = UpdateState::kPending;
  uint64_t sequence = 0;  // set once planned
  v1::DType dtype = v1::DTYPE_FLOAT32;
  uint64_t aggregate_id = 0;     // set when routed through an aggregator
  bool round_member = false;     // accepted into a synchronous round
  bool replica_punted = false;   // its replica copy waits for a later batch (§5.3)
  // Its replica copy was applied before the server's outcome came: the
  // replica is, for now, ahead of the server by this update.
  bool replica_ahead = false;
  double submitted_s = 0;
  uint64_t push_uid = 0;  // the application's id of the push (0 = none)
  TransferView planned;  // set once planned (dst, segments, deadline)
  // Its transfer to the server failed while the replica holds (or is
  // receiving) its copy: the server may be dying, and if its replica takes
  // over, the push is in the model served. It fails with this reason at
  // `fail_at_s` unless a failover decides it first (failover.h).
  std::string failure_pending;
  double fail_at_s = 0;
  // It fails with this reason once its server's daemon confirms it skipped
  // the commit position (FailWhenCancelled); if the daemon had handed it
  // over already, it is applied instead.
  std::string cancel_pending;
  double cancel_deadline_s = 0;
  // The tensor shape the push named (SubmitUpdateRequest.shape), if any: a
  // synchronous round compares it (round_tracker.h).
  std::optional<std::vector<int64_t>> shape;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_UPDATE_RECORD_H_
