// Packet-level immediate aggregation (mercury.md §IV-A key idea 3 and
// §IV-C "Mercury PS"; docs/architecture.md §5 "Aggregation").
//
// Contributions to one aggregate (pushes of a synchronous round, or the
// updates an in-network AggregateTask combines) are summed into the
// aggregate the moment their bytes arrive. The aggregate is cut into a grid
// of packets of `packet_bytes`; when every expected contribution has
// covered all bytes of a grid packet, that packet is final and its index is
// reported, so it can be forwarded (or streamed back to the workers) at
// once -- the pull of packet k overlaps the push of packet k+1 instead of
// waiting for the whole update.
//
// What the daemon needs, and this pool provides:
//  - Contributions need not use the aggregate's grid: a contribution is any
//    byte range on element boundaries (senders packetise per tensor, with
//    their own packet size), and one range may span several grid packets.
//  - Contributors join one by one, at any time, while only the total number
//    of contributions is known up front; one contributor may stand for
//    several contributions (`count`: a partial aggregate of several pushes).
//  - The sum lives in a caller-owned buffer (e.g. the shared-memory buffer
//    the daemon sends from and hands to the server); nothing is copied out.
//  - float32/float64 (weighted, with the vectorised kernels of reduce.h, so
//    results are bit-identical with the scalar `dst += w * src`),
//    int8/uint8/int16/uint16/int32/int64 (unweighted, wrapping modulo 2^width,
//    as Open MPI's MPI_SUM does), and float16
//    (unweighted; each addition in float, rounded to half: common/half.h).
//
// Completeness is counted in bytes: grid packet p is complete when
//   sum over contributors c of (bytes of p that c covered) x count_c
//     == length(p) x expected_contributions.
// Since no contributor may cover any byte twice (overlaps are rejected
// exactly) and the counts never exceed expected_contributions, this holds
// only once every expected contribution covered every byte of p.
//
//   AggregationSpec spec{DType::kFloat32, /*bytes=*/4 << 20,
//                        /*packet_bytes=*/32 * 1024,
//                        /*expected_contributions=*/3};
//   std::vector<std::byte> sum_bytes(spec.bytes);  // aligned; any contents
//   PacketPool pool;
//   RETURN_IF_ERROR(pool.RegisterTransfer(7, spec, absl::MakeSpan(sum_bytes)));
//   RETURN_IF_ERROR(pool.AddContributor(7, /*id=*/101));        // one push
//   RETURN_IF_ERROR(pool.AddContributor(7, /*id=*/102, 1.0, 2)); // two, pre-summed
//   // For every arriving payload of contributor 101 at byte `offset`:
//   std::vector<uint32_t> ready;
//   absl::Status s = pool.Add(7, 101, offset, payload, &ready);
//   if (!s.ok()) { drop/count; s says why; the pool is unchanged }
//   for (uint32_t p : ready) Forward(*pool.Packet(7, p));  // once per p
//
// Errors leave the pool exactly as it was (no partial sums, no credit).
//
// Thread safety: not thread-safe; the owner serialises calls (the daemon
// calls it under its mutex). Distinct pools may be used from distinct
// threads. Spans returned stay valid until the transfer is unregistered
// (the ready list is reserved for every packet up front, so later Adds only
// lengthen it: a span taken earlier still shows the packets ready then).
#ifndef MLFABRIC_AGGREGATOR_PACKET_POOL_H_
#define MLFABRIC_AGGREGATOR_PACKET_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mlfabric::aggregator {

enum class DType { kFloat32, kFloat64, kInt32, kInt64, kFloat16, kInt8, kUint8, kInt16, kUint16 };
size_t DTypeBytes(DType dtype);
const char* DTypeName(DType dtype);
bool IsIntegerDType(DType dtype);

// The element-wise reductions of the host-local AllReduce (Horovod's Sum,
// Min, Max, Product). The packet pool only sums.
enum class ReduceOp { kSum, kMin, kMax, kProduct };
const char* ReduceOpName(ReduceOp op);

// dst[i] += weight * src[i] for `n` elements of `dtype`: floats through the
// reduce.h kernels; integers unweighted, wrapping; float16 unweighted, each
// addition rounded to half (common/half.h). The packet pool's sum, and the
// AllReduce's host-local one (api/local_reduce.h).
void SumInto(DType dtype, void* dst, const void* src, double weight, size_t n);
// dst[i] = op(dst[i], src[i]) for `n` elements of `dtype`, unweighted:
// kSum as SumInto with weight 1; integer products wrap modulo 2^width (as
// Open MPI's MPI_PROD); float16 compares, and multiplies in float rounded
// to half per operation.
void ReduceInto(ReduceOp op, DType dtype, void* dst, const void* src, size_t n);

using TransferId = uint64_t;
using ContributorId = uint64_t;  // contributors are transfer ids

struct AggregationSpec {
  DType dtype = DType::kFloat32;
  // Size of the aggregate: a positive multiple of the element size.
  uint64_t bytes = 0;
  // Grid of released packets (the Mercury payload size): a positive
  // multiple of the element size, so no element spans two packets
  // (mercury.md §IV-C). The last packet may be shorter.
  uint32_t packet_bytes = 32 * 1024;
  // Total number of contributions the sum is complete at (>= 1).
  uint32_t expected_contributions = 0;
};

// Number of grid packets of an aggregate: ceil(bytes / packet_bytes).
uint64_t PacketCount(const AggregationSpec& spec);

class PacketPool {
 public:
  PacketPool() = default;
  PacketPool(const PacketPool&) = delete;
  PacketPool& operator=(const PacketPool&) = delete;

  // `sum` is caller-owned, exactly spec.bytes long, aligned to the element
  // size, and must outlive the registration; the pool sums into it in
  // place. It need not be zero-filled: the first contribution to a grid
  // packet initialises that packet (so only a final packet's bytes mean
  // anything). InvalidArgument naming the field for an inconsistent spec
  // or a wrong-sized or misaligned span (and for more than 2^32 packets);
  // AlreadyExists if the transfer is registered.
  absl::Status RegisterTransfer(TransferId transfer, const AggregationSpec& spec,
                                absl::Span<std::byte> sum);
  // Forgets a transfer (its sum buffer is left as it is). NotFound if unknown.
  absl::Status UnregisterTransfer(TransferId transfer);
  bool HasTransfer(TransferId transfer) const { return transfers_.contains(transfer); }

  // A contributor standing for `count` contributions, summed with `weight`
  // (applied as float for kFloat32; finite; exactly 1 for integer types).
  // Contributors may join at any time until the count is reached, also
  // after other contributors' data arrived. FailedPrecondition (naming both
  // numbers) if the counts would exceed expected_contributions;
  // AlreadyExists for a duplicate id; InvalidArgument for count 0 or a bad
  // weight; NotFound for an unknown transfer.
  absl::Status AddContributor(TransferId transfer, ContributorId id, double weight = 1.0,
                              uint32_t count = 1);

  // Sums `payload` -- the bytes [offset, offset + payload.size()) of
  // `contributor`'s contribution: starts and ends on element boundaries,
  // may span several grid packets, need not be aligned in memory (a
  // misaligned payload is copied once to aligned scratch first) -- into
  // the sum, weighted, and appends to `ready` (if not null) the indices of
  // grid packets that became complete with it, in the order they completed
  // (ascending within one call). An empty payload is a no-op.
  // Errors (state unchanged): NotFound (unknown transfer or contributor),
  // InvalidArgument (range outside the aggregate or not on element
  // boundaries), AlreadyExists (the contributor already covered some of
  // these bytes: a duplicate or overlapping range).
  absl::Status Add(TransferId transfer, ContributorId contributor, uint64_t offset,
                   absl::Span<const std::byte> payload, std::vector<uint32_t>* ready);

  // The sum is complete at `expected` contributions from now on, fewer
  // than announced when the transfer was registered (a synchronous round
  // whose member left before it pushed: docs/architecture.md §7). Packets
  // every joined contributor has covered become ready now, appended to
  // `ready` (if not null) as Add does. FailedPrecondition (naming both
  // numbers) if `expected` is below the contributions joined so far or
  // above the registered count; InvalidArgument for 0; NotFound for an
  // unknown transfer. On error nothing changes.
  absl::Status LowerExpected(TransferId transfer, uint32_t expected, std::vector<uint32_t>* ready);

  // Grid packets complete so far, in completion order; whether all are.
  absl::StatusOr<absl::Span<const uint32_t>> ReadyPackets(TransferId transfer) const;
  absl::StatusOr<bool> Complete(TransferId transfer) const;
  // The bytes of grid packet `index` in the sum (final once reported
  // ready). NotFound for an unknown transfer, OutOfRange for a bad index.
  absl::StatusOr<absl::Span<const std::byte>> Packet(TransferId transfer,
                                                     uint32_t index) const;
  // Contributions announced so far (sum of the contributors' counts).
  absl::StatusOr<uint32_t> JoinedContributions(TransferId transfer) const;

  // Packets with some but not all contributions, over all transfers.
  size_t partial_packets() const { return partial_packets_; }

 private:
  struct TransferState;
  struct ContributorState {
    TransferState* transfer = nullptr;
    ContributorId id = 0;
    double weight = 1.0;
    uint32_t count = 1;
    // Byte ranges covered so far, begin -> end, disjoint and never
    // adjacent (adjacent ranges are merged, so in-order senders keep one).
    absl::btree_map<uint64_t, uint64_t> covered;
  };
  struct TransferState {
    TransferId id = 0;
    AggregationSpec spec;
    std::byte* sum = nullptr;
    uint32_t joined = 0;  // sum of the contributors' counts
    // Per grid packet: sum of (bytes covered x count) over contributors.
    std::vector<uint64_t> credit;
    std::vector<uint32_t> ready;  // in completion order
    size_t partial = 0;           // packets with 0 < credit < full
    std::vector<std::unique_ptr<ContributorState>> contributors;
  };
  absl::StatusOr<const TransferState*> Find(TransferId transfer) const;
  // Add: credits the grid packets [offset, end) touches with a contributor
  // of `count` contributions (docs/architecture.md §5: a packet is final when every
  // expected contribution covered all of its bytes), appending those that
  // became final to state.ready and `ready`.
  void CreditPackets(TransferState& state, uint32_t count, uint64_t offset, uint64_t end,
                     std::vector<uint32_t>* ready);

  absl::flat_hash_map<TransferId, std::unique_ptr<TransferState>> transfers_;
  // The one lookup of the hot path: (transfer, contributor) -> its state.
  absl::flat_hash_map<std::pair<TransferId, ContributorId>, ContributorState*>
      contributors_;
  size_t partial_packets_ = 0;
  std::vector<std::byte> scratch_;  // aligned copy of a misaligned payload
};

}  // namespace mlfabric::aggregator

#endif  // MLFABRIC_AGGREGATOR_PACKET_POOL_H_
