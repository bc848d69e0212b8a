#include "aggregator/packet_pool.h"

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "aggregator/reduce.h"

namespace mlfabric::aggregator {
namespace {

std::string KeyName(const PacketKey& key) {
  return absl::StrCat("(transfer ", key.transfer_id, ", tensor ", key.tensor_id,
                      ", offset ", key.offset_bytes, ")");
}

template <typename T>
void Accumulate(std::vector<T>& sum, bool first, const std::byte* payload,
                double weight) {
  const T* src = reinterpret_cast<const T*>(payload);
  if (first) {
    Scale(sum.data(), src, static_cast<T>(weight), sum.size());
  } else {
    WeightedSum(sum.data(), src, static_cast<T>(weight), sum.size());
  }
}

}  // namespace

size_t DTypeBytes(DType dtype) {
  return dtype == DType::kFloat32 ? sizeof(float) : sizeof(double);
}

const char* DTypeName(DType dtype) {
  return dtype == DType::kFloat32 ? "float32" : "float64";
}

absl::Span<const std::byte> ReadyPacket::bytes() const {
  return std::visit(
      [](const auto& v) {
        return absl::Span<const std::byte>(
            reinterpret_cast<const std::byte*>(v.data()),
            v.size() * sizeof(v[0]));
      },
      sum_);
}

absl::Span<const float> ReadyPacket::f32() const {
  if (const auto* v = std::get_if<std::vector<float>>(&sum_)) return *v;
  return {};
}

absl::Span<const double> ReadyPacket::f64() const {
  if (const auto* v = std::get_if<std::vector<double>>(&sum_)) return *v;
  return {};
}

absl::Status PacketPool::RegisterTransfer(TransferId transfer,
                                          AggregationSpec spec) {
  if (transfers_.contains(transfer)) {
    return absl::AlreadyExistsError(
        absl::StrCat("transfer ", transfer, " already registered"));
  }
  const size_t element = DTypeBytes(spec.dtype);
  if (spec.packet_bytes == 0 || spec.packet_bytes % element != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer ", transfer, ": packet_bytes ", spec.packet_bytes,
        " must be a positive multiple of the ", DTypeName(spec.dtype),
        " element size ", element));
  }
  if (spec.contributors.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", transfer, ": no contributors"));
  }
  TransferState state;
  for (size_t i = 0; i < spec.contributors.size(); ++i) {
    if (!state.contributor_index.emplace(spec.contributors[i].id, i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("transfer ", transfer, ": contributor ",
                       spec.contributors[i].id, " listed twice"));
    }
  }
  uint64_t packets = 0;
  for (const AggregationSpec::Tensor& t : spec.tensors) {
    if (t.size_bytes % element != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transfer ", transfer, ": tensor ", t.tensor_id, " size ",
          t.size_bytes, " is not a multiple of the element size ", element));
    }
    if (!state.tensors.emplace(t.tensor_id, TensorState{t.size_bytes, packets})
             .second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transfer ", transfer, ": tensor ", t.tensor_id, " listed twice"));
    }
    packets += (t.size_bytes + spec.packet_bytes - 1) / spec.packet_bytes;
  }
  state.released.assign(packets, false);
  state.outstanding = packets;
  state.spec = std::move(spec);
  transfers_.emplace(transfer, std::move(state));
  return absl::OkStatus();
}

absl::Status PacketPool::UnregisterTransfer(TransferId transfer) {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("transfer ", transfer, " not registered"));
  }
  partial_packets_ -= it->second.slots.size();
  transfers_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PacketPool::OutstandingPackets(TransferId transfer) const {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("transfer ", transfer, " not registered"));
  }
  return it->second.outstanding;
}

absl::StatusOr<std::optional<ReadyPacket>> PacketPool::Add(
    const PacketKey& key, ContributorId contributor,
    absl::Span<const std::byte> payload) {
  auto transfer_it = transfers_.find(key.transfer_id);
  if (transfer_it == transfers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("packet ", KeyName(key), ": unknown transfer"));
  }
  TransferState& transfer = transfer_it->second;
  const AggregationSpec& spec = transfer.spec;
  auto tensor_it = transfer.tensors.find(key.tensor_id);
  if (tensor_it == transfer.tensors.end()) {
    return absl::NotFoundError(
        absl::StrCat("packet ", KeyName(key), ": unknown tensor"));
  }
  const TensorState& tensor = tensor_it->second;
  if (key.offset_bytes >= tensor.size_bytes ||
      key.offset_bytes % spec.packet_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "packet ", KeyName(key), ": offset is not a packet boundary inside the ",
        tensor.size_bytes, "-byte tensor (packet_bytes ", spec.packet_bytes, ")"));
  }
  const uint64_t expected_length =
      std::min<uint64_t>(spec.packet_bytes, tensor.size_bytes - key.offset_bytes);
  if (payload.size() != expected_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("packet ", KeyName(key), ": length ", payload.size(),
                     " bytes, expected ", expected_length));
  }
  auto contributor_it = transfer.contributor_index.find(contributor);
  if (contributor_it == transfer.contributor_index.end()) {
    return absl::NotFoundError(absl::StrCat(
        "packet ", KeyName(key), ": contributor ", contributor,
        " is not a contributor of this transfer"));
  }
  const size_t index = contributor_it->second;
  const uint64_t packet_index =
      tensor.first_packet + key.offset_bytes / spec.packet_bytes;
  if (transfer.released[packet_index]) {
    return absl::AlreadyExistsError(absl::StrCat(
        "packet ", KeyName(key), ": contributor ", contributor,
        " sent a packet that was already aggregated and released"));
  }

  auto [slot_it, inserted] = transfer.slots.try_emplace(key);
  Slot& slot = slot_it->second;
  if (inserted) {
    slot.arrived.assign(spec.contributors.size(), false);
    const size_t elements = expected_length / DTypeBytes(spec.dtype);
    if (spec.dtype == DType::kFloat32) {
      slot.sum.emplace<std::vector<float>>(elements);
    } else {
      slot.sum.emplace<std::vector<double>>(elements);
    }
    ++partial_packets_;
  } else if (slot.arrived[index]) {
    return absl::AlreadyExistsError(absl::StrCat(
        "packet ", KeyName(key), ": duplicate contribution from contributor ",
        contributor));
  }

  const std::byte* src = payload.data();
  if (reinterpret_cast<uintptr_t>(src) % DTypeBytes(spec.dtype) != 0) {
    scratch_.assign(payload.begin(), payload.end());
    src = scratch_.data();  // operator new memory: max-aligned
  }
  const double weight = spec.contributors[index].weight;
  std::visit([&](auto& sum) { Accumulate(sum, slot.count == 0, src, weight); },
             slot.sum);
  slot.arrived[index] = true;
  ++slot.count;
  if (slot.count < spec.contributors.size()) return std::optional<ReadyPacket>();

  ReadyPacket ready;
  ready.key_ = key;
  ready.dtype_ = spec.dtype;
  ready.sum_ = std::move(slot.sum);
  transfer.slots.erase(slot_it);
  --partial_packets_;
  transfer.released[packet_index] = true;
  ready.transfer_complete_ = --transfer.outstanding == 0;
  return std::optional<ReadyPacket>(std::move(ready));
}

}  // namespace mlfabric::aggregator
