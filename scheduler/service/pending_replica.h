// PendingReplica: a push's replica copy as the scheduler keeps it until it
// is sent (mlfabric.md §5.3): what the copy's transfer needs of the push
// once the push itself may be gone from the scheduler's books. A server's
// replica track holds the copies punted to a later batch (cluster_state.h
// ReplicaTrack); a restarted scheduler keeps those of pushes in doubt and
// of pushes held at their sources (in_doubt.h).
//
//   PendingReplica copy{push_id, "w1", "rank1", bytes, version, norm, dtype};
//   server.replica.pending.push_back(copy);
//
// Thread safety: a plain value.
#ifndef MLFABRIC_SCHEDULER_SERVICE_PENDING_REPLICA_H_
#define MLFABRIC_SCHEDULER_SERVICE_PENDING_REPLICA_H_

#include <cstdint>
#include <string>

#include "proto/scheduler.pb.h"

namespace mlfabric {

// The fields are the push's, as submitted.
struct PendingReplica {
  uint64_t id = 0;  // the push, applied at the server, not yet copied
  std::string src_host;
  std::string worker;
  int64_t bytes = 0;
  int64_t version = 0;
  double norm = 0;
  v1::DType dtype = v1::DTYPE_FLOAT32;
};

}  // namespace mlfabric

#endif  // MLFABRIC_SCHEDULER_SERVICE_PENDING_REPLICA_H_
