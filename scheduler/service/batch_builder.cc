#include "scheduler/service/batch_builder.h"

#include <set>

namespace mlfabric {

int64_t InitialVersion(core::Mode mode, int64_t model_version, int64_t unapplied) {
  return model_version + (mode == core::Mode::kAsync ? unapplied : 0);
}

namespace {

bool CanShareAggregates(const BatchInputs& in) {
  if (in.aggregator_candidates.empty() || in.updates.empty()) return false;
  const PendingUpdate& first = in.updates.front();
  for (const PendingUpdate& update : in.updates) {
    if (update.element_type == 0 || update.element_type != first.element_type ||
        update.request.bytes != first.request.bytes) {
      return false;
    }
    if (in.synchronous_round && update.request.version != first.request.version) return false;
  }
  return true;
}

}  // namespace

core::Batch BuildBatch(const BatchInputs& in) {
  core::Batch batch;
  batch.now_s = in.now_s;
  batch.mode = in.mode;
  batch.tau_max = in.tau_max;
  batch.v_init = InitialVersion(in.mode, in.model_version, in.unapplied);
  batch.server = in.server_host;
  batch.seed = in.seed;
  batch.streaming_aggregation = in.streaming_aggregation;
  std::set<std::string> involved = {in.server_host};
  std::set<std::string> receivers = {in.server_host};  // of a part: never an aggregator
  for (const PendingUpdate& update : in.updates) {
    batch.updates.push_back(update.request);
    involved.insert(update.request.worker);
    // §10.2: the hosts of the model's further shards receive parts too.
    for (const core::ShardPart& part : update.request.shards) {
      involved.insert(part.server);
      receivers.insert(part.server);
    }
  }
  if (CanShareAggregates(in)) {
    for (const std::string& host : in.aggregator_candidates) {
      if (receivers.count(host)) continue;
      batch.aggregators.push_back(host);
      involved.insert(host);
    }
  }
  if (in.replica.has_value()) {
    involved.insert(in.replica->host);
    for (const core::UpdateRequest& punted : in.replica->pending) involved.insert(punted.worker);
    for (const std::string& host : in.replica->aggregators) involved.insert(host);
    batch.replica = in.replica;
  }
  for (const std::string& host : involved) batch.hosts.push_back(in.host_link(host));
  return batch;
}

}  // namespace mlfabric
