// What every rank of a collective agrees on before any data moves, and the
// error every rank returns when they do not (Horovod's "Mismatched ..."
// FailedPrecondition). The records travel by whatever the backend has:
// one MPI_Allgather (allreduce_mpi.cc), or one small int64 sum of the
// scheduler's rounds in which each rank fills only its own row
// (allreduce.cc, the mlfabric backend's Alltoall and ReduceScatter).
// Internal to :allreduce.
//
//   std::vector<CallShape> all = ...;  // every rank's record, by rank
//   bool shapes_differ = false;
//   absl::Status agreed = CompareCallShapes("Alltoall", all, &shapes_differ);
//
// Pure. Thread safety: free functions, reentrant.
#ifndef MLFABRIC_API_CALL_AGREEMENT_H_
#define MLFABRIC_API_CALL_AGREEMENT_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "api/allreduce.h"
#include "api/push_exchange.h"

namespace mlfabric {
namespace internal {

// What every rank of a collective must agree on. `root` is -1 for an
// AllReduce, `op` -1 for a Broadcast.
// `row` is the elements per row of an Alltoall or ReduceScatter (-1 for
// the others). `dims` is the number of dimensions of the tensor shape the
// caller named (CallOptions::shape; -1 when it named none) and
// `shape_hash` a hash of that shape: one fixed-size record carries any
// shape, and the dimensions themselves cross only when they differ.
struct CallShape {
  int64_t count;
  int64_t dtype;
  int64_t op;
  int64_t root;
  int64_t row = -1;
  int64_t dims = -1;
  int64_t shape_hash = 0;
};
constexpr int kCallShapeWords = 7;
static_assert(sizeof(CallShape) == kCallShapeWords * sizeof(int64_t),
              "sent as kCallShapeWords int64 words");

// A rank whose own arguments are invalid takes part with this count
// (AllReducer::RefuseCollective), and every rank fails naming it.
constexpr int64_t kInvalidArguments = std::numeric_limits<int64_t>::min();

// FNV-1a over the dimensions (and their number, so [] and [1] differ).
int64_t ShapeHash(const std::vector<int64_t>& shape);
// "[17, 1311]"
std::string ShapeText(const int64_t* dims, int64_t n);

CallShape ReduceShape(size_t count, DataType dtype, ReduceOp op,
                      const std::vector<int64_t>* shape = nullptr);
// An Alltoall's or Allgather's record; `row_shape`, when named, is a row's
// dimensions (the tensor's after the first), which the ranks must agree on.
CallShape AlltoallShape(int64_t row_elements, DataType dtype,
                        const std::vector<int64_t>* row_shape = nullptr);
CallShape ReduceScatterShape(int64_t rows, int64_t row_elements, DataType dtype, ReduceOp op,
                             const std::vector<int64_t>* shape = nullptr);
inline CallShape InvalidCallShape() { return {kInvalidArguments, -1, -1, -1}; }

// Every rank's record compared, as every rank sees them: OK when they
// agree; FailedPrecondition naming a rank that passed invalid arguments,
// or the first field that differs with rank 0's value and the first rank
// whose value differs from it. When only the named shapes' hashes differ
// it returns OK with *shapes_differ set: the caller gathers the shapes
// themselves to name them.
absl::Status CompareCallShapes(const char* what, const std::vector<CallShape>& all,
                               bool* shapes_differ);

// Once CompareCallShapes said the named shapes differ and every rank's
// shape was gathered (`shapes[r]`, rank r's): FailedPrecondition naming
// rank 0's shape and the first rank whose shape differs from it ("Mismatched
// ReduceScatter tensor shapes: rank 0 passed shape [17, 1311] while rank 1
// passed shape [17, 23, 57] ...").
absl::Status ShapeMismatchError(const char* what, const std::vector<CallShape>& all,
                                const std::vector<std::vector<int64_t>>& shapes);

// The ReduceScatter of the mlfabric backend's sums (allreduce.cc) once the
// ranks are known to agree: `reducer`'s AllReduce of the whole buffer under
// `op`, then this rank's rows of it (ReduceScatterRows).
absl::Status ReduceScatterAgreedBySum(AllReducer& reducer, const void* data, int64_t rows,
                                      int64_t row_elements, DataType dtype, ReduceOp op,
                                      void* out);

// The record of a Broadcast: length, dtype and root (no op).
inline CallShape BroadcastShape(size_t count, DataType dtype, int root) {
  return {static_cast<int64_t>(count), static_cast<int64_t>(dtype), -1, root};
}

// The Broadcast of an mlfabric backend reducer `fabric` once the ranks are
// known to agree on length, dtype and root: the root's buffer pushed to
// every other rank's exchange server (api/push_exchange.h), the small sums
// by `sum`. An invalid root: InvalidArgument on every rank.
absl::Status BroadcastAgreedByPushes(AllReducer& fabric, const SumWords& sum, void* data,
                                     size_t count, DataType dtype, int root);

// The Allgather of an mlfabric backend reducer `fabric` once the ranks are
// known to agree on dtype and row length: this rank's rows pushed to every
// other rank's exchange server, the small sums by `sum`.
absl::Status AllgatherAgreedByPushes(AllReducer& fabric, const SumWords& sum, const void* send,
                                     int64_t rows, int64_t row_elements, DataType dtype,
                                     const AlltoallRecvBuffer& recv_buffer,
                                     std::vector<int64_t>* recv_rows);

// An AllReduce under min, max or product of an mlfabric backend reducer
// `fabric` once the ranks are known to agree on length, dtype and op: a
// reduce-scatter and an allgather of blocks by pushes
// (PushExchange::AllReduce), the small sums by `sum`.
absl::Status ReduceAgreedByPushes(AllReducer& fabric, const SumWords& sum, void* data,
                                  size_t count, DataType dtype, ReduceOp op);

// A ReduceScatter under min, max or product of an mlfabric backend reducer
// `fabric` once the ranks agree: each rank's rows for rank d pushed to d's
// exchange server, which reduces them (PushExchange::ReduceScatter).
absl::Status ReduceScatterAgreedByPushes(AllReducer& fabric, const SumWords& sum,
                                         const void* data, int64_t rows, int64_t row_elements,
                                         DataType dtype, ReduceOp op, void* out);

// The Alltoall of an mlfabric backend reducer `fabric` once the ranks are
// known to agree on dtype and row length: each block one push
// (api/push_exchange.h), the small sums by `sum` (MPI under mpirun).
absl::Status AlltoallAgreedByPushes(AllReducer& fabric, const SumWords& sum, const void* send,
                                    int64_t row_elements, const std::vector<int64_t>& send_rows,
                                    DataType dtype, const AlltoallRecvBuffer& recv_buffer,
                                    std::vector<int64_t>* recv_rows);

}  // namespace internal
}  // namespace mlfabric

#endif  // MLFABRIC_API_CALL_AGREEMENT_H_
