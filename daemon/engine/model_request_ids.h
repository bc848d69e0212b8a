// The ids of the model requests a daemon sends its server applications
// (LocalModelRequest.request_id). The application answers each with the
// same id, and AppRequests::HandleModelReply hands the answer to the part
// that asked; the top bits say which, so the spaces must not overlap:
//
//   below 2^60          GetBatcher's batches of gets (ModelServer)
//   kHistoryRequestBit  a server group shard's snapshot after each update
//   kSoloRequestBit     a group get's fresh read of one shard
//   kReplicaRequestBit  a snapshot for a new replica (ReplicaSnapshots)
//
// (Until 2026-11-26 the replica snapshots used the fresh reads' bit, so
// ReplicaSnapshots took their answers and a group get waited 30 s.)
#ifndef MLFABRIC_DAEMON_ENGINE_MODEL_REQUEST_IDS_H_
#define MLFABRIC_DAEMON_ENGINE_MODEL_REQUEST_IDS_H_

#include <cstdint>

namespace mlfabric::daemon {

inline constexpr uint64_t kReplicaRequestBit = uint64_t{1} << 60;
inline constexpr uint64_t kHistoryRequestBit = uint64_t{1} << 61;
inline constexpr uint64_t kSoloRequestBit = uint64_t{1} << 62;
static_assert((kReplicaRequestBit & kHistoryRequestBit) == 0 &&
              (kHistoryRequestBit & kSoloRequestBit) == 0 &&
              (kReplicaRequestBit & kSoloRequestBit) == 0,
              "each asker has its own bit");

}  // namespace mlfabric::daemon

#endif  // MLFABRIC_DAEMON_ENGINE_MODEL_REQUEST_IDS_H_
