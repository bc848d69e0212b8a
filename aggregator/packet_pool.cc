#include "aggregator/packet_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "aggregator/reduce.h"
#include "common/half.h"

namespace mlfabric::aggregator {
namespace {

// Two's-complement wrap-around without signed overflow: the sum is kept as
// unsigned integers of the same width. Written for the auto-vectoriser
// (the library is built with the kernels' copts, see BUILD).
template <typename U>
void AddWrapping(U* __restrict dst, const U* __restrict src, size_t n) {
  static_assert(std::is_unsigned_v<U>);
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

// Element-wise min, max or (wrapping, for integers) product of `n` values.
// Integer products are taken in an unsigned type at least as wide as int,
// so that no signed overflow happens and the result wraps modulo 2^width.
template <typename T>
void CombineValues(ReduceOp op, T* __restrict dst, const T* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    switch (op) {
      case ReduceOp::kMin: dst[i] = src[i] < dst[i] ? src[i] : dst[i]; break;
      case ReduceOp::kMax: dst[i] = src[i] > dst[i] ? src[i] : dst[i]; break;
      case ReduceOp::kProduct:
        if constexpr (std::is_integral_v<T>) {
          using Wide = std::conditional_t<(sizeof(T) <= sizeof(unsigned)), unsigned, uint64_t>;
          dst[i] = static_cast<T>(static_cast<Wide>(dst[i]) * static_cast<Wide>(src[i]));
        } else {
          dst[i] = dst[i] * src[i];
        }
        break;
      case ReduceOp::kSum: dst[i] = dst[i] + src[i]; break;  // not reached: SumInto
    }
  }
}

// float16 (common/half.h): each operation in float, rounded back to half.
void CombineHalves(ReduceOp op, uint16_t* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float a = HalfToFloat(dst[i]), b = HalfToFloat(src[i]);
    switch (op) {
      case ReduceOp::kMin: dst[i] = b < a ? src[i] : dst[i]; break;
      case ReduceOp::kMax: dst[i] = b > a ? src[i] : dst[i]; break;
      case ReduceOp::kProduct: dst[i] = FloatToHalf(a * b); break;
      case ReduceOp::kSum: dst[i] = FloatToHalf(a + b); break;
    }
  }
}

}  // namespace

void SumInto(DType dtype, void* dst, const void* src, double weight, size_t n) {
  switch (dtype) {
    case DType::kFloat32:
      WeightedSum(static_cast<float*>(dst), static_cast<const float*>(src),
                  static_cast<float>(weight), n);
      return;
    case DType::kFloat64:
      WeightedSum(static_cast<double*>(dst), static_cast<const double*>(src), weight, n);
      return;
    case DType::kInt32:
      AddWrapping(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), n);
      return;
    case DType::kInt64:
      AddWrapping(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), n);
      return;
    case DType::kFloat16:
      AddHalves(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
      return;
    case DType::kInt8:
    case DType::kUint8:
      AddWrapping(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
      return;
    case DType::kInt16:
    case DType::kUint16:
      AddWrapping(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
      return;
  }
}

void ReduceInto(ReduceOp op, DType dtype, void* dst, const void* src, size_t n) {
  if (op == ReduceOp::kSum) return SumInto(dtype, dst, src, 1.0, n);
  switch (dtype) {
    case DType::kFloat32:
      return CombineValues(op, static_cast<float*>(dst), static_cast<const float*>(src), n);
    case DType::kFloat64:
      return CombineValues(op, static_cast<double*>(dst), static_cast<const double*>(src), n);
    case DType::kInt32:
      return CombineValues(op, static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n);
    case DType::kInt64:
      return CombineValues(op, static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n);
    case DType::kInt8:
      return CombineValues(op, static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n);
    case DType::kUint8:
      return CombineValues(op, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
    case DType::kInt16:
      return CombineValues(op, static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), n);
    case DType::kUint16:
      return CombineValues(op, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
    case DType::kFloat16:
      return CombineHalves(op, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
  }
}

namespace {

std::string RangeName(uint64_t offset, uint64_t size) {
  return absl::StrCat("[", offset, ", ", offset + size, ")");
}

// PacketPool::Add: the range [offset, offset + size) lies in the aggregate
// and on element boundaries.
absl::Status CheckRange(TransferId transfer, ContributorId contributor_id,
                        const AggregationSpec& spec, uint64_t offset, uint64_t size) {
  const size_t element = DTypeBytes(spec.dtype);
  if (offset > spec.bytes || size > spec.bytes - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", transfer, ": contributor ", contributor_id, " range ",
                     RangeName(offset, size), " is outside the ", spec.bytes,
                     "-byte aggregate"));
  }
  if (offset % element != 0 || size % element != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer ", transfer, ": contributor ", contributor_id, " range ",
        RangeName(offset, size), " does not start and end on ", DTypeName(spec.dtype),
        " element boundaries (", element, " bytes)"));
  }
  return absl::OkStatus();
}

// PacketPool::Add: records [offset, end) in `covered`, merging it with the
// adjacent ranges `prev` and `next` (covered.end() when there is none). In-order
// senders only ever extend their one range in place.
void RecordCoverage(absl::btree_map<uint64_t, uint64_t>& covered,
                    absl::btree_map<uint64_t, uint64_t>::iterator prev,
                    absl::btree_map<uint64_t, uint64_t>::iterator next, uint64_t offset,
                    uint64_t end) {
  const bool joins_prev = prev != covered.end() && prev->second == offset;
  const bool joins_next = next != covered.end() && next->first == end;
  if (joins_prev) {
    prev->second = joins_next ? next->second : end;
    if (joins_next) covered.erase(next);
  } else if (joins_next) {
    const uint64_t next_end = next->second;
    covered.erase(next);
    covered.emplace(offset, next_end);
  } else {
    covered.emplace_hint(next, offset, end);
  }
}

}  // namespace

size_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return sizeof(float);
    case DType::kFloat64: return sizeof(double);
    case DType::kInt32: return sizeof(int32_t);
    case DType::kInt64: return sizeof(int64_t);
    case DType::kFloat16: return sizeof(uint16_t);
    case DType::kInt8: return sizeof(int8_t);
    case DType::kUint8: return sizeof(uint8_t);
    case DType::kInt16: return sizeof(int16_t);
    case DType::kUint16: return sizeof(uint16_t);
  }
  return 0;
}

bool IsIntegerDType(DType dtype) {
  return dtype != DType::kFloat32 && dtype != DType::kFloat64 && dtype != DType::kFloat16;
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
  }
  return "unknown";
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat16: return "float16";
    case DType::kInt8: return "int8";
    case DType::kUint8: return "uint8";
    case DType::kInt16: return "int16";
    case DType::kUint16: return "uint16";
  }
  return "unknown";
}

uint64_t PacketCount(const AggregationSpec& spec) {
  if (spec.packet_bytes == 0) return 0;
  return (spec.bytes + spec.packet_bytes - 1) / spec.packet_bytes;
}

absl::Status PacketPool::RegisterTransfer(TransferId transfer, const AggregationSpec& spec,
                                          absl::Span<std::byte> sum) {
  if (transfers_.contains(transfer)) {
    return absl::AlreadyExistsError(absl::StrCat("transfer ", transfer, " already registered"));
  }
  const size_t element = DTypeBytes(spec.dtype);
  if (element == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer ", transfer, ": dtype ", static_cast<int>(spec.dtype), " is not a DType"));
  }
  if (spec.bytes == 0 || spec.bytes % element != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", transfer, ": bytes ", spec.bytes,
                     " must be a positive multiple of the ", DTypeName(spec.dtype),
                     " element size ", element));
  }
  if (spec.packet_bytes == 0 || spec.packet_bytes % element != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", transfer, ": packet_bytes ", spec.packet_bytes,
                     " must be a positive multiple of the ", DTypeName(spec.dtype),
                     " element size ", element));
  }
  if (spec.expected_contributions == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer ", transfer, ": expected_contributions must be at least 1, not 0"));
  }
  const uint64_t packets = PacketCount(spec);
  if (packets > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", transfer, ": bytes ", spec.bytes, " in packet_bytes ",
                     spec.packet_bytes, " makes ", packets, " packets, more than 2^32 - 1"));
  }
  if (sum.size() != spec.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", transfer, ": sum buffer is ",
                                                   sum.size(), " bytes, spec.bytes is ",
                                                   spec.bytes));
  }
  if (reinterpret_cast<uintptr_t>(sum.data()) % element != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", transfer, ": sum buffer is not aligned to the ",
                     DTypeName(spec.dtype), " element size ", element));
  }
  auto state = std::make_unique<TransferState>();
  state->id = transfer;
  state->spec = spec;
  state->sum = sum.data();
  state->credit.assign(packets, 0);
  state->ready.reserve(packets);
  transfers_.emplace(transfer, std::move(state));
  return absl::OkStatus();
}

absl::Status PacketPool::UnregisterTransfer(TransferId transfer) {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("transfer ", transfer, " not registered"));
  }
  for (const auto& contributor : it->second->contributors) {
    contributors_.erase({transfer, contributor->id});
  }
  partial_packets_ -= it->second->partial;
  transfers_.erase(it);
  return absl::OkStatus();
}

absl::Status PacketPool::AddContributor(TransferId transfer, ContributorId id, double weight,
                                        uint32_t count) {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("contributor ", id, ": transfer ", transfer,
                                            " not registered"));
  }
  TransferState& state = *it->second;
  const AggregationSpec& spec = state.spec;
  if (contributors_.contains({transfer, id})) {
    return absl::AlreadyExistsError(absl::StrCat("transfer ", transfer, ": contributor ", id,
                                                 " already added"));
  }
  if (count == 0) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", transfer, ": contributor ", id,
                                                   " has count 0 (must stand for at least one "
                                                   "contribution)"));
  }
  const bool unweighted = spec.dtype != DType::kFloat32 && spec.dtype != DType::kFloat64;
  if (unweighted && weight != 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", transfer, ": contributor ", id, " has weight ", weight,
                     "; ", DTypeName(spec.dtype), " sums take weight 1 only"));
  }
  if (!std::isfinite(weight) ||
      (spec.dtype == DType::kFloat32 && !std::isfinite(static_cast<float>(weight)))) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", transfer, ": contributor ", id, " has weight ", weight,
                     ", not a finite ", DTypeName(spec.dtype)));
  }
  if (uint64_t{state.joined} + count > spec.expected_contributions) {
    return absl::FailedPreconditionError(absl::StrCat(
        "transfer ", transfer, ": contributor ", id, " brings the contributions to ",
        uint64_t{state.joined} + count, ", more than the ", spec.expected_contributions,
        " expected"));
  }
  auto contributor = std::make_unique<ContributorState>();
  contributor->transfer = &state;
  contributor->id = id;
  contributor->weight = weight;
  contributor->count = count;
  contributors_.emplace(std::make_pair(transfer, id), contributor.get());
  state.contributors.push_back(std::move(contributor));
  state.joined += count;
  return absl::OkStatus();
}

absl::Status PacketPool::Add(TransferId transfer, ContributorId contributor_id, uint64_t offset,
                             absl::Span<const std::byte> payload, std::vector<uint32_t>* ready) {
  auto found = contributors_.find({transfer, contributor_id});
  if (found == contributors_.end()) {
    if (!transfers_.contains(transfer)) {
      return absl::NotFoundError(
          absl::StrCat("contribution of ", contributor_id, ": unknown transfer ", transfer));
    }
    return absl::NotFoundError(absl::StrCat("transfer ", transfer, ": contributor ",
                                            contributor_id, " was not added"));
  }
  ContributorState& contributor = *found->second;
  TransferState& state = *contributor.transfer;
  const AggregationSpec& spec = state.spec;
  const size_t element = DTypeBytes(spec.dtype);
  const uint64_t size = payload.size();
  if (absl::Status in_range = CheckRange(transfer, contributor_id, spec, offset, size);
      !in_range.ok()) {
    return in_range;
  }
  if (size == 0) return absl::OkStatus();
  const uint64_t end = offset + size;

  // Exact overlap check against the ranges this contributor already covered.
  auto next = contributor.covered.upper_bound(offset);  // first range starting after offset
  if (next != contributor.covered.end() && next->first < end) {
    return absl::AlreadyExistsError(absl::StrCat(
        "transfer ", transfer, ": contributor ", contributor_id, " range ",
        RangeName(offset, size), " overlaps its earlier ", RangeName(next->first,
                                                                      next->second - next->first),
        " (duplicate or overlapping contribution)"));
  }
  auto prev = next == contributor.covered.begin() ? contributor.covered.end() : std::prev(next);
  if (prev != contributor.covered.end() && prev->second > offset) {
    return absl::AlreadyExistsError(absl::StrCat(
        "transfer ", transfer, ": contributor ", contributor_id, " range ",
        RangeName(offset, size), " overlaps its earlier ", RangeName(prev->first,
                                                                      prev->second - prev->first),
        " (duplicate or overlapping contribution)"));
  }

  // Sum. Every check is done: nothing below fails.
  const std::byte* src = payload.data();
  if (reinterpret_cast<uintptr_t>(src) % element != 0) {
    scratch_.assign(payload.begin(), payload.end());  // operator new: 16-byte aligned
    src = scratch_.data();
  }
  // Packet by packet: the first contribution to touch a grid packet
  // initialises it (a copy when it covers the whole packet with weight 1,
  // else zeros and then the sum), so the sum buffer need not be zeroed
  // first (a pass over a reused 4 MiB round buffer per round).
  const uint64_t packet_bytes = spec.packet_bytes;
  for (uint64_t p = offset / packet_bytes; p * packet_bytes < end; ++p) {
    const uint64_t p_begin = p * packet_bytes;
    const uint64_t p_end = std::min(p_begin + packet_bytes, spec.bytes);
    const uint64_t begin = std::max(offset, p_begin), stop = std::min(end, p_end);
    std::byte* dst = state.sum + begin;
    const std::byte* from = src + (begin - offset);
    if (state.credit[p] == 0) {
      if (begin == p_begin && stop == p_end && contributor.weight == 1.0) {
        std::memcpy(dst, from, stop - begin);
        continue;
      }
      std::memset(state.sum + p_begin, 0, p_end - p_begin);
    }
    SumInto(spec.dtype, dst, from, contributor.weight, (stop - begin) / element);
  }

  RecordCoverage(contributor.covered, prev, next, offset, end);
  CreditPackets(state, contributor.count, offset, end, ready);
  return absl::OkStatus();
}

void PacketPool::CreditPackets(TransferState& state, uint32_t count, uint64_t offset,
                               uint64_t end, std::vector<uint32_t>* ready) {
  const AggregationSpec& spec = state.spec;
  const uint64_t packet_bytes = spec.packet_bytes;
  const uint64_t expected = spec.expected_contributions;
  const uint64_t first = offset / packet_bytes;
  const uint64_t last = (end - 1) / packet_bytes;
  for (uint64_t p = first; p <= last; ++p) {
    const uint64_t p_begin = p * packet_bytes;
    const uint64_t p_end = std::min(p_begin + packet_bytes, spec.bytes);
    const uint64_t covered = std::min(end, p_end) - std::max(offset, p_begin);
    const uint64_t full = (p_end - p_begin) * expected;
    uint64_t& credit = state.credit[p];
    const bool was_partial = credit != 0;
    credit += covered * count;
    if (credit == full) {
      if (was_partial) {
        --state.partial;
        --partial_packets_;
      }
      state.ready.push_back(static_cast<uint32_t>(p));
      if (ready != nullptr) ready->push_back(static_cast<uint32_t>(p));
    } else if (!was_partial) {
      ++state.partial;
      ++partial_packets_;
    }
  }
}

absl::StatusOr<const PacketPool::TransferState*> PacketPool::Find(TransferId transfer) const {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("transfer ", transfer, " not registered"));
  }
  return it->second.get();
}

absl::StatusOr<absl::Span<const uint32_t>> PacketPool::ReadyPackets(TransferId transfer) const {
  absl::StatusOr<const TransferState*> state = Find(transfer);
  if (!state.ok()) return state.status();
  return absl::Span<const uint32_t>((*state)->ready);
}

absl::StatusOr<bool> PacketPool::Complete(TransferId transfer) const {
  absl::StatusOr<const TransferState*> state = Find(transfer);
  if (!state.ok()) return state.status();
  return (*state)->ready.size() == (*state)->credit.size();
}

absl::StatusOr<absl::Span<const std::byte>> PacketPool::Packet(TransferId transfer,
                                                               uint32_t index) const {
  absl::StatusOr<const TransferState*> state = Find(transfer);
  if (!state.ok()) return state.status();
  const AggregationSpec& spec = (*state)->spec;
  if (index >= (*state)->credit.size()) {
    return absl::OutOfRangeError(absl::StrCat("transfer ", transfer, ": packet ", index,
                                              " of ", (*state)->credit.size()));
  }
  const uint64_t begin = uint64_t{index} * spec.packet_bytes;
  const uint64_t end = std::min<uint64_t>(begin + spec.packet_bytes, spec.bytes);
  return absl::Span<const std::byte>((*state)->sum + begin, end - begin);
}

absl::Status PacketPool::LowerExpected(TransferId transfer, uint32_t expected,
                                       std::vector<uint32_t>* ready) {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("transfer ", transfer, " not registered"));
  }
  TransferState& state = *it->second;
  if (expected == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", transfer, ": expected contributions cannot be lowered to 0"));
  }
  if (expected < state.joined || expected > state.spec.expected_contributions) {
    return absl::FailedPreconditionError(absl::StrCat(
        "transfer ", transfer, ": cannot expect ", expected, " contributions with ",
        state.joined, " joined and ", state.spec.expected_contributions, " expected so far"));
  }
  if (expected == state.spec.expected_contributions) return absl::OkStatus();
  state.spec.expected_contributions = expected;
  // No packet was ready: its credit is at most (its bytes x joined), below
  // the old full credit. Those every joined contributor covered are now.
  const uint64_t packet_bytes = state.spec.packet_bytes;
  for (uint64_t p = 0; p < state.credit.size(); ++p) {
    const uint64_t p_begin = p * packet_bytes;
    const uint64_t p_end = std::min(p_begin + packet_bytes, state.spec.bytes);
    if (state.credit[p] != (p_end - p_begin) * expected) continue;
    --state.partial;  // full credit is never 0, so it was partial
    --partial_packets_;
    state.ready.push_back(static_cast<uint32_t>(p));
    if (ready != nullptr) ready->push_back(static_cast<uint32_t>(p));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> PacketPool::JoinedContributions(TransferId transfer) const {
  absl::StatusOr<const TransferState*> state = Find(transfer);
  if (!state.ok()) return state.status();
  return (*state)->joined;
}

}  // namespace mlfabric::aggregator
