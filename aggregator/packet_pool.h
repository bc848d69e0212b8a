// Packet-level immediate aggregation (mercury.md §IV-A key idea 3 and
// §IV-C "Mercury PS"; DESIGN.md §5 "Aggregation").
//
// Contributions (Mercury packets from several workers, or from several
// updates an aggregator combines) are summed the moment each packet
// arrives, keyed by (transfer, tensor, offset). When the last expected
// contributor's packet for a key is in, the summed packet is returned
// ready to forward -- so the pull of packet k overlaps the push of packet
// k+1 instead of waiting for whole tensors.
//
// A transfer is registered first with its layout (tensors, element type,
// Mercury payload size) and its contributors with their weights; the
// aggregate of a packet is sum_c weight_c * payload_c. A packet key is
// valid iff its transfer and tensor are registered, its offset is a
// multiple of packet_bytes inside the tensor, and its length is exactly
// min(packet_bytes, tensor_size - offset). Everything else -- unknown keys,
// unknown or duplicate contributors, wrong lengths, packets of a packet
// already released -- is rejected with a Status that names the problem;
// the pool's state is unchanged by a rejected packet.
//
//   PacketPool pool;
//   pool.RegisterTransfer(7, {DType::kFloat32, 32 * 1024,
//                             /*tensors=*/{{0, 4 << 20}},
//                             /*contributors=*/{{1, 1.0}, {2, 1.0}}});
//   // For every arriving packet:
//   absl::StatusOr<std::optional<ReadyPacket>> r =
//       pool.Add({7, 0, offset}, /*contributor=*/1, payload);
//   if (!r.ok()) { close/count, r.status() says why }
//   else if (*r) Forward(**r);  // exactly once per key
//
// Thread safety: not thread-safe; one thread (the daemon's receive loop)
// owns a pool. Distinct pools may be used from distinct threads.
#ifndef MLFABRIC_AGGREGATOR_PACKET_POOL_H_
#define MLFABRIC_AGGREGATOR_PACKET_POOL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mlfabric::aggregator {

using TransferId = uint64_t;
using TensorId = uint32_t;
using ContributorId = uint32_t;

enum class DType { kFloat32, kFloat64 };
size_t DTypeBytes(DType dtype);
const char* DTypeName(DType dtype);

struct PacketKey {
  TransferId transfer_id = 0;
  TensorId tensor_id = 0;
  uint64_t offset_bytes = 0;

  friend bool operator==(const PacketKey& a, const PacketKey& b) {
    return a.transfer_id == b.transfer_id && a.tensor_id == b.tensor_id &&
           a.offset_bytes == b.offset_bytes;
  }
  template <typename H>
  friend H AbslHashValue(H h, const PacketKey& k) {
    return H::combine(std::move(h), k.transfer_id, k.tensor_id, k.offset_bytes);
  }
};

struct AggregationSpec {
  struct Tensor {
    TensorId tensor_id = 0;
    uint64_t size_bytes = 0;  // multiple of the element size
  };
  struct Contributor {
    ContributorId id = 0;
    double weight = 1.0;  // applied as float for kFloat32
  };
  DType dtype = DType::kFloat32;
  // Mercury payload size: packets start at multiples of it. Multiple of
  // the element size (no element spans two packets, mercury.md §IV-C).
  uint32_t packet_bytes = 32 * 1024;
  std::vector<Tensor> tensors;
  std::vector<Contributor> contributors;  // at least one, unique ids
};

// A completed aggregate. Owns its bytes.
class ReadyPacket {
 public:
  const PacketKey& key() const { return key_; }
  DType dtype() const { return dtype_; }
  // True when this was the last outstanding packet of its transfer.
  bool transfer_complete() const { return transfer_complete_; }
  // The summed payload as bytes (what goes on the wire).
  absl::Span<const std::byte> bytes() const;
  // Typed views; empty if the dtype does not match.
  absl::Span<const float> f32() const;
  absl::Span<const double> f64() const;

 private:
  friend class PacketPool;
  PacketKey key_;
  DType dtype_ = DType::kFloat32;
  bool transfer_complete_ = false;
  std::variant<std::vector<float>, std::vector<double>> sum_;
};

class PacketPool {
 public:
  PacketPool() = default;

  // InvalidArgument for an inconsistent spec (naming the field),
  // AlreadyExists if the transfer is registered.
  absl::Status RegisterTransfer(TransferId transfer, AggregationSpec spec);
  // Forgets a transfer and drops its partial sums (e.g. the update was
  // dropped). NotFound if unknown.
  absl::Status UnregisterTransfer(TransferId transfer);
  bool HasTransfer(TransferId transfer) const { return transfers_.contains(transfer); }

  // Adds one contribution. Returns the ready aggregate when this was the
  // last expected contribution for the key, nullopt while more are due,
  // or an error (NotFound: unknown transfer/tensor/contributor;
  // InvalidArgument: bad offset or length; AlreadyExists: duplicate
  // contribution or packet already released). `payload` need not be
  // aligned (a misaligned payload is copied once before summing).
  absl::StatusOr<std::optional<ReadyPacket>> Add(
      const PacketKey& key, ContributorId contributor,
      absl::Span<const std::byte> payload);

  // Packets with some but not all contributions, over all transfers.
  size_t partial_packets() const { return partial_packets_; }
  // Packets of `transfer` not yet released (NotFound if unknown).
  absl::StatusOr<uint64_t> OutstandingPackets(TransferId transfer) const;

 private:
  struct Slot {
    std::vector<bool> arrived;  // per contributor index
    size_t count = 0;
    std::variant<std::vector<float>, std::vector<double>> sum;
  };
  struct TensorState {
    uint64_t size_bytes = 0;
    uint64_t first_packet = 0;  // index of its first packet in `released`
  };
  struct TransferState {
    AggregationSpec spec;
    absl::flat_hash_map<TensorId, TensorState> tensors;
    absl::flat_hash_map<ContributorId, size_t> contributor_index;
    std::vector<bool> released;  // per packet of the transfer
    uint64_t outstanding = 0;
    absl::flat_hash_map<PacketKey, Slot> slots;
  };

  absl::flat_hash_map<TransferId, TransferState> transfers_;
  size_t partial_packets_ = 0;
  std::vector<std::byte> scratch_;  // aligned copy of a misaligned payload
};

}  // namespace mlfabric::aggregator

#endif  // MLFABRIC_AGGREGATOR_PACKET_POOL_H_
