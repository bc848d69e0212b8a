#include "daemon/engine/aggregation_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/engine/element_types.h"

namespace mlfabric::daemon {

absl::StatusOr<std::shared_ptr<SharedBuffer>> AggregationTable::Start(
    const v1::AggregateTask& task) {
  const uint64_t id = task.aggregate_id();
  if (task.dtype() != v1::DTYPE_FLOAT32 && task.dtype() != v1::DTYPE_FLOAT64) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot aggregate updates of type ", v1::DType_Name(task.dtype()),
                     " (weighted sums need float32 or float64)"));
  }
  const size_t element = ElementBytes(task.dtype());
  if (task.bytes() <= 0 || task.bytes() % element != 0) {
    return absl::InvalidArgumentError(absl::StrCat("aggregate ", id, " has ", task.bytes(),
                                                   " bytes: not a positive multiple of ",
                                                   element));
  }
  if (task.constituents_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("aggregate ", id, " has no constituents"));
  }
  auto created = SharedBuffer::Create(static_cast<size_t>(task.bytes()));  // zero-filled
  if (!created.ok()) return created.status();
  auto sum = std::make_shared<SharedBuffer>(std::move(*created));

  MutexLock lock(&mu_);
  if (aggregations_.count(id)) {
    return absl::AlreadyExistsError(absl::StrCat("aggregate ", id, " is already in progress"));
  }
  for (int i = 0; i < task.constituents_size(); ++i) {
    if (aggregate_of_.count(task.constituents(i))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "constituent ", task.constituents(i), " of aggregate ", id,
          " is already summed into aggregate ", aggregate_of_[task.constituents(i)]));
    }
  }
  aggregator::AggregationSpec spec;
  spec.dtype = *PoolType(task.dtype());
  spec.bytes = static_cast<uint64_t>(task.bytes());
  spec.packet_bytes = packet_bytes_;
  spec.expected_contributions = static_cast<uint32_t>(task.constituents_size());
  absl::Status registered = pool_.RegisterTransfer(
      id, spec, absl::Span<std::byte>(reinterpret_cast<std::byte*>(sum->data()), sum->size()));
  for (int i = 0; registered.ok() && i < task.constituents_size(); ++i) {
    const double weight = i < task.weights_size() ? task.weights(i) : 1.0;
    registered = pool_.AddContributor(id, task.constituents(i), weight);
  }
  if (!registered.ok()) {
    (void)pool_.UnregisterTransfer(id);
    return absl::InvalidArgumentError(absl::StrCat("aggregation task: ", registered.message()));
  }
  Aggregation& aggregation = aggregations_[id];
  aggregation.task = task;
  aggregation.sum = sum;
  for (int i = 0; i < task.constituents_size(); ++i) {
    const double weight = i < task.weights_size() ? task.weights(i) : 1.0;
    aggregation.waiting[task.constituents(i)] = weight;
    aggregate_of_[task.constituents(i)] = id;
  }
  return sum;
}

bool AggregationTable::Active(uint64_t aggregate) const {
  MutexLock lock(&mu_);
  return aggregations_.count(aggregate) != 0;
}

std::optional<uint64_t> AggregationTable::AggregateOf(uint64_t constituent) const {
  MutexLock lock(&mu_);
  auto it = aggregate_of_.find(constituent);
  if (it == aggregate_of_.end()) return std::nullopt;
  return it->second;
}

std::optional<int64_t> AggregationTable::Bytes(uint64_t aggregate) const {
  MutexLock lock(&mu_);
  auto it = aggregations_.find(aggregate);
  if (it == aggregations_.end()) return std::nullopt;
  return it->second.task.bytes();
}

std::optional<uint32_t> AggregationTable::JobOf(uint64_t aggregate) const {
  MutexLock lock(&mu_);
  auto it = aggregations_.find(aggregate);
  if (it == aggregations_.end()) return std::nullopt;
  return it->second.task.job_id();
}

std::string AggregationTable::Destination(uint64_t aggregate) const {
  MutexLock lock(&mu_);
  auto it = aggregations_.find(aggregate);
  return it == aggregations_.end() ? std::string() : it->second.task.dst_host();
}

absl::Status AggregationTable::Fold(uint64_t aggregate, uint64_t constituent,
                                    const uint8_t* data, uint64_t offset, uint32_t length,
                                    std::vector<uint32_t>* ready) {
  MutexLock lock(&mu_);
  if (!aggregations_.count(aggregate)) {
    return absl::NotFoundError(absl::StrCat("aggregate ", aggregate, " is not in progress"));
  }
  absl::Status added = pool_.Add(
      aggregate, constituent, offset,
      absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(data), length), ready);
  if (!added.ok()) {
    return absl::Status(added.code(), absl::StrCat("packet [", offset, ", +", length,
                                                   ") of constituent ", constituent, ": ",
                                                   added.message()));
  }
  return absl::OkStatus();
}

AggregationTable::Finish AggregationTable::FinishConstituent(uint64_t constituent) {
  MutexLock lock(&mu_);
  Finish finish;
  auto member = aggregate_of_.find(constituent);
  if (member == aggregate_of_.end()) return finish;
  finish.aggregate = member->second;
  aggregate_of_.erase(member);
  auto it = aggregations_.find(finish.aggregate);
  if (it == aggregations_.end()) return finish;  // cannot happen: removed together
  Aggregation& aggregation = it->second;
  aggregation.waiting.erase(constituent);
  ++aggregation.folded;
  finish.kind = Finish::kWaiting;
  if (!aggregation.waiting.empty()) return finish;
  finish.kind = Finish::kComplete;
  finish.folded = aggregation.folded;
  finish.dst_host = aggregation.task.dst_host();
  (void)pool_.UnregisterTransfer(finish.aggregate);  // final; the sum buffer lives on
  aggregations_.erase(it);
  return finish;
}

std::optional<std::vector<uint64_t>> AggregationTable::Remove(uint64_t aggregate) {
  MutexLock lock(&mu_);
  auto it = aggregations_.find(aggregate);
  if (it == aggregations_.end()) return std::nullopt;
  std::vector<uint64_t> waited;
  for (const auto& [constituent, weight] : it->second.waiting) {
    aggregate_of_.erase(constituent);
    waited.push_back(constituent);
  }
  aggregations_.erase(it);
  (void)pool_.UnregisterTransfer(aggregate);
  return waited;
}

std::vector<uint32_t> AggregationTable::ReadyPackets(uint64_t aggregate) const {
  MutexLock lock(&mu_);
  auto ready = pool_.ReadyPackets(aggregate);
  if (!ready.ok()) return {};
  return std::vector<uint32_t>(ready->begin(), ready->end());
}

size_t AggregationTable::active() const {
  MutexLock lock(&mu_);
  return aggregations_.size();
}

}  // namespace mlfabric::daemon
