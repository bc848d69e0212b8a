#include "scheduler/core/prepared_batch.h"

#include "absl/strings/str_cat.h"

namespace mlfabric::core {

absl::StatusOr<PreparedBatch> PrepareBatch(const Batch& batch, const Network& net) {
  PreparedBatch prepared;
  prepared.now_s = batch.now_s;
  prepared.server = net.HostIndex(batch.server);
  if (prepared.server < 0) {
    return absl::InvalidArgumentError(absl::StrCat("server: '", batch.server, "' is not in hosts"));
  }
  prepared.updates.reserve(batch.updates.size());
  for (size_t i = 0; i < batch.updates.size(); ++i) {
    const UpdateRequest& u = batch.updates[i];
    PreparedUpdate p;
    p.index = static_cast<int>(i);
    p.worker = net.HostIndex(u.worker);
    if (p.worker < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("updates[", i, "].worker: '", u.worker, "' is not in hosts"));
    }
    p.deadline = u.version + batch.tau_max - batch.v_init;
    p.norm = u.norm;
    p.parts.push_back({prepared.server, u.bytes, 8.0 * static_cast<double>(u.bytes)});
    for (size_t j = 0; j < u.shards.size(); ++j) {
      const ShardPart& shard = u.shards[j];
      const std::string field = absl::StrCat("updates[", i, "].shards[", j, "]");
      const int host = net.HostIndex(shard.server);
      if (host < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".server: '", shard.server, "' is not in hosts"));
      }
      if (shard.bytes <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".bytes: must be a positive integer, got ", shard.bytes));
      }
      p.parts.push_back({host, shard.bytes, 8.0 * static_cast<double>(shard.bytes)});
      prepared.multi_server = true;
    }
    prepared.updates.push_back(std::move(p));
  }
  return prepared;
}

}  // namespace mlfabric::core
