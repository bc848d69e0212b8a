#include "scheduler/core/types.h"

namespace mlfabric::core {

const char* TransferKindName(TransferKind kind) {
  switch (kind) {
    case TransferKind::kDirect: return "direct";
    case TransferKind::kToAggregator: return "to_aggregator";
    case TransferKind::kAggregate: return "aggregate";
    case TransferKind::kReplica: return "replica";
    case TransferKind::kReplicaAggregate: return "replica_aggregate";
  }
  return "unknown";
}

}  // namespace mlfabric::core
