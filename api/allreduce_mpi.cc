// The `mpi` AllReduce backend: Open MPI's MPI_Allreduce on MPI_COMM_WORLD.
#include <dlfcn.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "aggregator/packet_pool.h"
#include "api/allreduce.h"
#include "api/call_agreement.h"
#include "common/half.h"

namespace mlfabric {
namespace internal {
namespace {

std::once_flag g_init_once;
absl::Status g_init_status;

// Runs when the process exits (glibc's on_exit, which, unlike atexit, sees
// the exit status). A rank that ends cleanly finalizes MPI. A rank that ends
// with an error while others are still running must not: Open MPI's
// MPI_Finalize waits for every rank to reach it, and the others are waiting
// in their next collective for this one, so the job would hang. It aborts
// the job instead; mpirun then stops every rank and exits non-zero.
void FinalizeOrAbort(int status, void*) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  int size = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (status != 0 && size > 1) {
    std::fprintf(stderr,
                 "mlfabric: rank %d of %d exits with status %d while the other ranks may be "
                 "waiting for it; the job is stopped\n",
                 rank, size, status);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  MPI_Finalize();
}

// Initialises MPI once per process unless the program already did. Open MPI
// loads its components with dlopen and needs libmpi's symbols global, which
// they are not when libmpi arrives inside a Python extension: promote it.
absl::Status EnsureMpiInitialized() {
  std::call_once(g_init_once, [] {
    for (const char* lib : {"libmpi.so.40", "libmpi.so"}) {
      if (dlopen(lib, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) != nullptr ||
          dlopen(lib, RTLD_NOW | RTLD_GLOBAL) != nullptr) {
        break;
      }
    }
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      g_init_status = absl::UnavailableError(
          "MPI_Init_thread failed: launch the program with mlfabric-run or mpirun");
      return;
    }
    on_exit(FinalizeOrAbort, nullptr);
  });
  return g_init_status;
}

absl::StatusOr<MPI_Datatype> MpiType(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16: return MPI_UINT16_T;  // reduced by the Half* ops below
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kUint8: return MPI_UINT8_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kUint16: return MPI_UINT16_T;
    case DataType::kBool: return MPI_UINT8_T;  // Broadcast only: its bytes
  }
  return absl::InvalidArgumentError("unsupported dtype for the mpi AllReduce backend");
}

MPI_Op MpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
  }
  return MPI_SUM;
}

std::string MpiError(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, length);
}

// MPI has no half type: float16 travels as 16-bit words and is summed by
// this user-defined (commutative) operation, in float, rounded per addition.
void HalfSum(void* in, void* inout, int* len, MPI_Datatype*) {
  AddHalves(static_cast<uint16_t*>(inout), static_cast<const uint16_t*>(in),
            static_cast<size_t>(*len));
}
// 8- and 16-bit integer sums wrap modulo 2^width, as C's and the mlfabric
// backend's do. Open MPI 4.1's vectorised op component (op/avx) adds them
// with saturation instead once a buffer is long enough for its vector path
// (open-mpi/ompi#8045, closed as won't fix), so they are summed here.
void SmallIntSum(void* in, void* inout, int* len, MPI_Datatype* type) {
  const size_t n = static_cast<size_t>(*len);
  const bool bytes = *type == MPI_INT8_T || *type == MPI_UINT8_T;
  aggregator::SumInto(bytes ? aggregator::DType::kUint8 : aggregator::DType::kUint16, inout, in,
                      1.0, n);
}

template <aggregator::ReduceOp kOp>
void HalfCombine(void* in, void* inout, int* len, MPI_Datatype*) {
  aggregator::ReduceInto(kOp, aggregator::DType::kFloat16, inout, in, static_cast<size_t>(*len));
}

// One small MPI_Allgather of every rank's CallShape (api/call_agreement.h)
// before any data moves: every rank sees every rank's values, so all
// return the same FailedPrecondition (CompareCallShapes) instead of a hang.

// Every rank's shape (the gathered records say how many dimensions each
// has), gathered once the hashes showed that some differ: every rank saw
// the same records, so every rank comes here. FailedPrecondition naming
// rank 0's shape and the first rank whose shape differs.
absl::Status ShapeMismatch(const char* what, const std::vector<CallShape>& all,
                           const std::vector<int64_t>& mine) {
  const int size = static_cast<int>(all.size());
  std::vector<int> counts(all.size()), offsets(all.size(), 0);
  for (int r = 0; r < size; ++r) {
    counts[r] = static_cast<int>(std::max<int64_t>(all[r].dims, 0));
    if (r > 0) offsets[r] = offsets[r - 1] + counts[r - 1];
  }
  std::vector<int64_t> dims(static_cast<size_t>(offsets.back() + counts.back()));
  int code = MPI_Allgatherv(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, dims.data(),
                            counts.data(), offsets.data(), MPI_INT64_T, MPI_COMM_WORLD);
  if (code != MPI_SUCCESS) return absl::InternalError("MPI_Allgatherv: " + MpiError(code));
  std::vector<std::vector<int64_t>> shapes(all.size());
  for (int r = 0; r < size; ++r) {
    shapes[r].assign(dims.begin() + offsets[r], dims.begin() + offsets[r] + counts[r]);
  }
  return ShapeMismatchError(what, all, shapes);
}

// `shape`: this rank's tensor shape when the caller named one (its number
// of dimensions and hash are in `mine`).
absl::Status MpiCheckAgreement(const char* what, const CallShape& mine,
                               const std::vector<int64_t>* shape = nullptr) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<CallShape> all(static_cast<size_t>(size));
  int code = MPI_Allgather(&mine, kCallShapeWords, MPI_INT64_T, all.data(), kCallShapeWords,
                           MPI_INT64_T, MPI_COMM_WORLD);
  if (code != MPI_SUCCESS) return absl::InternalError("MPI_Allgather: " + MpiError(code));
  bool shapes_differ = false;
  absl::Status agreed = CompareCallShapes(what, all, &shapes_differ);
  if (!agreed.ok() || !shapes_differ) return agreed;
  return ShapeMismatch(what, all, shape != nullptr ? *shape : std::vector<int64_t>());
}

// MPI counts and displacements are int: each rank's part, in elements.
absl::StatusOr<std::vector<int>> IntCounts(const std::vector<int64_t>& rows, int64_t row_elements,
                                           const char* what) {
  std::vector<int> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t elements = rows[i] * row_elements;
    if (elements > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", elements, " elements for one rank exceed MPI's int count"));
    }
    out[i] = static_cast<int>(elements);
  }
  return out;
}

std::vector<int> Displacements(const std::vector<int>& counts) {
  std::vector<int> out(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) out[i] = out[i - 1] + counts[i - 1];
  return out;
}

class MpiAllReducer : public AllReducer {
 public:
  MpiAllReducer(int rank, int size) : AllReducer(rank, size) {
    MPI_Op_create(&HalfSum, /*commute=*/1, &half_ops_[0]);
    MPI_Op_create(&HalfCombine<aggregator::ReduceOp::kMin>, 1, &half_ops_[1]);
    MPI_Op_create(&HalfCombine<aggregator::ReduceOp::kMax>, 1, &half_ops_[2]);
    MPI_Op_create(&HalfCombine<aggregator::ReduceOp::kProduct>, 1, &half_ops_[3]);
    MPI_Op_create(&SmallIntSum, 1, &small_int_sum_);
  }
  ~MpiAllReducer() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Op& op : half_ops_) MPI_Op_free(&op);
    MPI_Op_free(&small_int_sum_);
  }
  const char* backend() const override { return "mpi"; }

  // Takes part in the agreement marked invalid: the other ranks fail too.
  absl::Status RefuseCollective(const char* what, absl::Status invalid) override {
    (void)MpiCheckAgreement(what, InvalidCallShape());
    return invalid;
  }

  // MPI_Allreduce once every rank is known to pass `count` x `dtype` and `op`.
  absl::Status ReduceAgreed(void* data, size_t count, DataType dtype, ReduceOp op) {
    auto type = MpiType(dtype);
    if (!type.ok()) return type.status();
    // MPI has no half type: float16 travels as 16-bit words, reduced by
    // user-defined (commutative) ops in float, rounded per operation.
    int code = MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), *type,
                             OpFor(dtype, op), MPI_COMM_WORLD);
    if (code != MPI_SUCCESS) return absl::InternalError("MPI_Allreduce: " + MpiError(code));
    return absl::OkStatus();
  }

  // The Alltoall once every rank is known to pass `dtype` and
  // `row_elements`: the row counts first (MPI_Alltoall), then the rows
  // (MPI_Alltoallv) into the buffer `recv_buffer` gives for them.
  absl::Status AlltoallAgreed(const void* send, int64_t row_elements,
                              const std::vector<int64_t>& send_rows, DataType dtype,
                              const AlltoallRecvBuffer& recv_buffer,
                              std::vector<int64_t>* recv_rows) {
    auto type = MpiType(dtype);
    if (!type.ok()) return type.status();
    std::vector<int64_t> received(send_rows.size(), 0);
    int code = MPI_Alltoall(send_rows.data(), 1, MPI_INT64_T, received.data(), 1, MPI_INT64_T,
                            MPI_COMM_WORLD);
    if (code != MPI_SUCCESS) return absl::InternalError("MPI_Alltoall: " + MpiError(code));
    auto send_counts = IntCounts(send_rows, row_elements, "Alltoall");
    auto recv_counts = IntCounts(received, row_elements, "Alltoall");
    absl::StatusOr<void*> buffer = absl::InternalError("no receive buffer");
    absl::Status local = !send_counts.ok()   ? send_counts.status()
                         : !recv_counts.ok() ? recv_counts.status()
                                             : (buffer = recv_buffer(received)).status();
    // A rank that cannot take part (counts too large for MPI, no buffer)
    // must not leave the others in MPI_Alltoallv: every rank learns it.
    int failed = local.ok() ? size() : rank(), first_failed = 0;  // the lowest rank that failed
    code = MPI_Allreduce(&failed, &first_failed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (code != MPI_SUCCESS) return absl::InternalError("MPI_Allreduce: " + MpiError(code));
    if (!local.ok()) return local;
    if (first_failed < size()) {
      return absl::AbortedError(absl::StrCat("Alltoall: rank ", first_failed,
                                             " could not take part (see its error)"));
    }
    if (recv_rows != nullptr) *recv_rows = received;
    code = MPI_Alltoallv(send, send_counts->data(), Displacements(*send_counts).data(), *type,
                         *buffer, recv_counts->data(), Displacements(*recv_counts).data(), *type,
                         MPI_COMM_WORLD);
    if (code != MPI_SUCCESS) return absl::InternalError("MPI_Alltoallv: " + MpiError(code));
    return absl::OkStatus();
  }

  // The Allgather once every rank is known to pass `dtype` and
  // `row_elements`: the row counts first (MPI_Allgather), then the rows
  // (MPI_Allgatherv) into the buffer `recv_buffer` gives for them.
  absl::Status AllgatherAgreed(const void* send, int64_t rows, int64_t row_elements,
                               DataType dtype, const AlltoallRecvBuffer& recv_buffer,
                               std::vector<int64_t>* recv_rows) {
    auto type = MpiType(dtype);
    if (!type.ok()) return type.status();
    std::vector<int64_t> received(static_cast<size_t>(size()), 0);
    int code = MPI_Allgather(&rows, 1, MPI_INT64_T, received.data(), 1, MPI_INT64_T,
                             MPI_COMM_WORLD);
    if (code != MPI_SUCCESS) return absl::InternalError("MPI_Allgather: " + MpiError(code));
    auto send_count = IntCounts({rows}, row_elements, "Allgather");
    auto recv_counts = IntCounts(received, row_elements, "Allgather");
    absl::StatusOr<void*> buffer = absl::InternalError("no receive buffer");
    absl::Status local = !send_count.ok()    ? send_count.status()
                         : !recv_counts.ok() ? recv_counts.status()
                                             : (buffer = recv_buffer(received)).status();
    // A rank that cannot take part must not leave the others in
    // MPI_Allgatherv: every rank learns the lowest one that failed.
    int failed = local.ok() ? size() : rank(), first_failed = 0;
    code = MPI_Allreduce(&failed, &first_failed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (code != MPI_SUCCESS) return absl::InternalError("MPI_Allreduce: " + MpiError(code));
    if (!local.ok()) return local;
    if (first_failed < size()) {
      return absl::AbortedError(absl::StrCat("Allgather: rank ", first_failed,
                                             " could not take part (see its error)"));
    }
    if (recv_rows != nullptr) *recv_rows = received;
    code = MPI_Allgatherv(send, (*send_count)[0], *type, *buffer, recv_counts->data(),
                          Displacements(*recv_counts).data(), *type, MPI_COMM_WORLD);
    if (code != MPI_SUCCESS) return absl::InternalError("MPI_Allgatherv: " + MpiError(code));
    return absl::OkStatus();
  }

  // MPI_Reduce_scatter once every rank is known to pass the same shape,
  // dtype and op; rank r's part is ReduceScatterRows' r-th.
  absl::Status ReduceScatterAgreed(const void* data, int64_t rows, int64_t row_elements,
                                   DataType dtype, ReduceOp op, void* out) {
    auto type = MpiType(dtype);
    if (!type.ok()) return type.status();
    auto counts = IntCounts(ReduceScatterRows(rows, size()), row_elements, "ReduceScatter");
    if (!counts.ok()) return counts.status();
    int code = MPI_Reduce_scatter(data, out, counts->data(), *type, OpFor(dtype, op),
                                  MPI_COMM_WORLD);
    if (code != MPI_SUCCESS) return absl::InternalError("MPI_Reduce_scatter: " + MpiError(code));
    return absl::OkStatus();
  }

  absl::Status Broadcast(void* data, size_t count, DataType dtype, int root) override {
    auto type = MpiType(dtype);
    if (!type.ok()) return type.status();
    // The root is agreed on first, so a root invalid on one rank only is
    // a mismatch on every rank, not a rank left in MPI_Bcast.
    if (auto status = MpiCheckAgreement("Broadcast", BroadcastShape(count, dtype, root));
        !status.ok()) {
      return status;
    }
    return BroadcastAgreed(data, count, dtype, root);
  }

  // MPI_Bcast once every rank is known to pass `count` x `dtype` and `root`.
  absl::Status BroadcastAgreed(void* data, size_t count, DataType dtype, int root) {
    auto type = MpiType(dtype);
    if (!type.ok()) return type.status();
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank"));
    }
    int code = MPI_Bcast(data, static_cast<int>(count), *type, root, MPI_COMM_WORLD);
    if (code != MPI_SUCCESS) return absl::InternalError("MPI_Bcast: " + MpiError(code));
    return absl::OkStatus();
  }

 protected:
  absl::Status Reduce(void* data, size_t count, DataType dtype, ReduceOp op) override {
    auto type = MpiType(dtype);
    if (!type.ok()) return type.status();
    if (auto status = MpiCheckAgreement("AllReduce", ReduceShape(count, dtype, op));
        !status.ok()) {
      return status;
    }
    return ReduceAgreed(data, count, dtype, op);
  }

  // The shape joins the one agreement collective (CallShape::shape_hash).
  absl::Status ReduceShaped(void* data, size_t count, DataType dtype, ReduceOp op,
                            const std::vector<int64_t>& shape) override {
    auto type = MpiType(dtype);
    if (!type.ok()) return type.status();
    if (auto status = MpiCheckAgreement("AllReduce", ReduceShape(count, dtype, op, &shape), &shape);
        !status.ok()) {
      return status;
    }
    return ReduceAgreed(data, count, dtype, op);
  }

  absl::Status DoAlltoall(const void* send, int64_t row_elements,
                          const std::vector<int64_t>& send_rows, DataType dtype,
                          const AlltoallRecvBuffer& recv_buffer,
                          std::vector<int64_t>* recv_rows) override {
    if (auto status = MpiCheckAgreement("Alltoall", AlltoallShape(row_elements, dtype));
        !status.ok()) {
      return status;
    }
    return AlltoallAgreed(send, row_elements, send_rows, dtype, recv_buffer, recv_rows);
  }

  absl::Status DoAllgather(const void* send, int64_t rows, int64_t row_elements, DataType dtype,
                           const AlltoallRecvBuffer& recv_buffer, std::vector<int64_t>* recv_rows,
                           const std::vector<int64_t>* row_shape) override {
    if (auto status = MpiCheckAgreement("Allgather",
                                        AlltoallShape(row_elements, dtype, row_shape), row_shape);
        !status.ok()) {
      return status;
    }
    return AllgatherAgreed(send, rows, row_elements, dtype, recv_buffer, recv_rows);
  }

  absl::Status DoReduceScatter(const void* data, int64_t rows, int64_t row_elements,
                               DataType dtype, ReduceOp op, void* out,
                               const std::vector<int64_t>* shape) override {
    if (auto status = MpiCheckAgreement(
            "ReduceScatter", ReduceScatterShape(rows, row_elements, dtype, op, shape), shape);
        !status.ok()) {
      return status;
    }
    return ReduceScatterAgreed(data, rows, row_elements, dtype, op, out);
  }

 private:
  // MPI has no half type: float16 travels as 16-bit words, reduced by
  // user-defined (commutative) ops in float, rounded per operation; 8- and
  // 16-bit sums wrap (SmallIntSum).
  MPI_Op OpFor(DataType dtype, ReduceOp op) const {
    const bool small_int = dtype == DataType::kInt8 || dtype == DataType::kUint8 ||
                           dtype == DataType::kInt16 || dtype == DataType::kUint16;
    return dtype == DataType::kFloat16        ? half_ops_[static_cast<int>(op)]
           : small_int && op == ReduceOp::kSum ? small_int_sum_
                                               : MpiOp(op);
  }

  MPI_Op half_ops_[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // by ReduceOp
  MPI_Op small_int_sum_ = MPI_OP_NULL;
};

// mlfabric backend under mpirun (AllReduceOptions::mpi_below_bytes): a
// call whose buffer is smaller than `below` goes through MPI_Allreduce,
// a larger one through `fabric` (the scheduler's rounds); so does every
// call with a reduce op other than sum, which the daemons' rounds cannot
// carry. Every call first agrees on length, dtype and op across ranks
// (one small collective),
// so every rank takes the same path, and differing inputs are an error on
// every rank, never a rank in MPI waiting for one in a scheduler round.
class SmallViaMpiAllReducer : public AllReducer {
 public:
  SmallViaMpiAllReducer(std::unique_ptr<AllReducer> fabric, std::unique_ptr<MpiAllReducer> mpi,
                        size_t below)
      : AllReducer(fabric->rank(), fabric->size()),
        fabric_(std::move(fabric)),
        mpi_(std::move(mpi)),
        below_(below) {}

  const char* backend() const override { return fabric_->backend(); }
  int summed() const override { return fabric_->summed(); }
  int64_t left_out() const override { return fabric_->left_out(); }
  int local_size() const override { return fabric_->local_size(); }

 protected:
  absl::Status Reduce(void* data, size_t count, DataType dtype, ReduceOp op) override {
    return ReduceAfter(MpiCheckAgreement("AllReduce", ReduceShape(count, dtype, op)), data, count,
                       dtype, op);
  }
  absl::Status ReduceShaped(void* data, size_t count, DataType dtype, ReduceOp op,
                            const std::vector<int64_t>& shape) override {
    return ReduceAfter(
        MpiCheckAgreement("AllReduce", ReduceShape(count, dtype, op, &shape), &shape), data,
        count, dtype, op);
  }

  absl::Status RefuseCollective(const char* what, absl::Status invalid) override {
    return mpi_->RefuseCollective(what, std::move(invalid));
  }

  // With every rank on this host, or when every rank sends fewer than
  // `below` bytes, MPI_Alltoallv; otherwise each block is a push to its
  // destination's exchange server, planned by the scheduler
  // (api/push_exchange.h), its two small sums through MPI. The ranks
  // agree first and learn the largest send buffer in one more small MPI
  // collective, so every rank takes the same path.
  absl::Status DoAlltoall(const void* send, int64_t row_elements,
                          const std::vector<int64_t>& send_rows, DataType dtype,
                          const AlltoallRecvBuffer& recv_buffer,
                          std::vector<int64_t>* recv_rows) override {
    if (OneHost()) {
      return mpi_->Alltoall(send, SumOf(send_rows), row_elements, send_rows, dtype, recv_buffer,
                            recv_rows);
    }
    if (auto agreed = MpiCheckAgreement("Alltoall", AlltoallShape(row_elements, dtype));
        !agreed.ok()) {
      return agreed;
    }
    int64_t largest = SumOf(send_rows) * row_elements * static_cast<int64_t>(DataTypeSize(dtype));
    if (auto status = mpi_->ReduceAgreed(&largest, 1, DataType::kInt64, ReduceOp::kMax);
        !status.ok()) {
      return status;
    }
    if (largest < static_cast<int64_t>(below_)) {
      return mpi_->AlltoallAgreed(send, row_elements, send_rows, dtype, recv_buffer, recv_rows);
    }
    return AlltoallAgreedByPushes(
        *fabric_,
        MpiSums(),
        send, row_elements, send_rows, dtype, recv_buffer, recv_rows);
  }
  // As DoAlltoall: between hosts, when the largest rank's rows are at least
  // `below` bytes, this rank's rows pushed to every other rank's exchange
  // server; otherwise MPI_Allgatherv.
  absl::Status DoAllgather(const void* send, int64_t rows, int64_t row_elements, DataType dtype,
                           const AlltoallRecvBuffer& recv_buffer, std::vector<int64_t>* recv_rows,
                           const std::vector<int64_t>* row_shape) override {
    if (OneHost()) {
      CallOptions call;
      if (row_shape != nullptr) {
        call.shape = std::vector<int64_t>{rows};
        call.shape->insert(call.shape->end(), row_shape->begin(), row_shape->end());
      }
      return mpi_->Allgather(send, rows, row_elements, dtype, recv_buffer, recv_rows, call);
    }
    if (auto agreed = MpiCheckAgreement("Allgather",
                                        AlltoallShape(row_elements, dtype, row_shape), row_shape);
        !agreed.ok()) {
      return agreed;
    }
    int64_t largest = rows * row_elements * static_cast<int64_t>(DataTypeSize(dtype));
    if (auto status = mpi_->ReduceAgreed(&largest, 1, DataType::kInt64, ReduceOp::kMax);
        !status.ok()) {
      return status;
    }
    if (largest < static_cast<int64_t>(below_)) {
      return mpi_->AllgatherAgreed(send, rows, row_elements, dtype, recv_buffer, recv_rows);
    }
    return AllgatherAgreedByPushes(
        *fabric_,
        MpiSums(),
        send, rows, row_elements, dtype, recv_buffer, recv_rows);
  }
  // A large ReduceScatter between hosts goes through the scheduler: a sum
  // through its rounds (the AllReduce of the whole buffer, then this rank's
  // rows), min, max and product as each rank's rows pushed to the rank that
  // reduces them (api/push_exchange.h); the rest through MPI. Both paths
  // start with the same agreement collective, so every rank takes the same
  // one. With every rank on this host there is no network to plan, and
  // MPI_Reduce_scatter moves each rank's rows where the sum moves the whole
  // buffer (1.2-1.6x MPI's time at 1-16 MiB).
  absl::Status DoReduceScatter(const void* data, int64_t rows, int64_t row_elements,
                               DataType dtype, ReduceOp op, void* out,
                               const std::vector<int64_t>* shape) override {
    const size_t bytes = static_cast<size_t>(rows * row_elements) * DataTypeSize(dtype);
    if (bytes < below_ || OneHost()) {
      CallOptions call;
      if (shape != nullptr) call.shape = *shape;
      return mpi_->ReduceScatter(data, rows, row_elements, dtype, op, out, call);
    }
    if (auto agreed = MpiCheckAgreement(
            "ReduceScatter", ReduceScatterShape(rows, row_elements, dtype, op, shape), shape);
        !agreed.ok()) {
      return agreed;
    }
    if (op == ReduceOp::kSum) {
      return ReduceScatterAgreedBySum(*fabric_, data, rows, row_elements, dtype, op, out);
    }
    return ReduceScatterAgreedByPushes(*fabric_, MpiSums(), data, rows, row_elements, dtype, op,
                                       out);
  }

 public:
  // With every rank on this host, or below `below` bytes, MPI_Bcast;
  // between hosts the root's buffer pushed to every other rank's exchange
  // server, planned by the scheduler (api/push_exchange.h), the small sums
  // through MPI. One agreement first, so every rank takes the same path.
  absl::Status Broadcast(void* data, size_t count, DataType dtype, int root) override {
    if (OneHost() || DataTypeSize(dtype) == 0) return mpi_->Broadcast(data, count, dtype, root);
    if (auto agreed = MpiCheckAgreement("Broadcast", BroadcastShape(count, dtype, root));
        !agreed.ok()) {
      return agreed;
    }
    if (count * DataTypeSize(dtype) < below_) {
      return mpi_->BroadcastAgreed(data, count, dtype, root);
    }
    return BroadcastAgreedByPushes(
        *fabric_,
        MpiSums(),
        data, count, dtype, root);
  }

 private:
  // Every rank shares this host (and its memory): the same on every rank.
  bool OneHost() const { return fabric_->local_size() == size(); }

  // Once `agreed` says the ranks agree: below `below` bytes, or with every
  // rank on this host, MPI; a larger sum through the scheduler's rounds,
  // min, max and product as exchanges of blocks by pushes (a reduce-scatter
  // and an allgather, api/push_exchange.h) with their small sums by MPI.
  absl::Status ReduceAfter(absl::Status agreed, void* data, size_t count, DataType dtype,
                           ReduceOp op) {
    if (!agreed.ok()) return agreed;
    if (count * DataTypeSize(dtype) < below_) return mpi_->ReduceAgreed(data, count, dtype, op);
    if (op == ReduceOp::kSum) return fabric_->AllReduce(data, count, dtype);
    if (OneHost()) return mpi_->ReduceAgreed(data, count, dtype, op);
    return ReduceAgreedByPushes(*fabric_, MpiSums(), data, count, dtype, op);
  }

  // The exchanges' small int64 sums, through MPI.
  SumWords MpiSums() {
    return [this](std::vector<int64_t>& words) {
      return mpi_->ReduceAgreed(words.data(), words.size(), DataType::kInt64, ReduceOp::kSum);
    };
  }

  static int64_t SumOf(const std::vector<int64_t>& values) {
    int64_t total = 0;
    for (int64_t v : values) total += v;
    return total;
  }

  std::unique_ptr<AllReducer> fabric_;
  std::unique_ptr<MpiAllReducer> mpi_;
  const size_t below_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<AllReducer>> MakeMpiAllReducer(const AllReduceOptions& options) {
  if (auto status = EnsureMpiInitialized(); !status.ok()) return status;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if ((options.rank >= 0 && options.rank != rank) || (options.size >= 0 && options.size != size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllReduceOptions rank/size ", options.rank, "/", options.size,
        " disagree with MPI_COMM_WORLD's ", rank, "/", size));
  }
  return std::unique_ptr<AllReducer>(new MpiAllReducer(rank, size));
}

absl::StatusOr<std::unique_ptr<AllReducer>> WrapSmallViaMpi(std::unique_ptr<AllReducer> fabric,
                                                            size_t below_bytes) {
  if (auto status = EnsureMpiInitialized(); !status.ok()) return status;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank != fabric->rank() || size != fabric->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank/size ", fabric->rank(), "/", fabric->size(), " disagree with MPI_COMM_WORLD's ",
        rank, "/", size, " (set MLFABRIC_ALLREDUCE_MPI_BELOW=0 to keep every call off MPI)"));
  }
  return std::unique_ptr<AllReducer>(new SmallViaMpiAllReducer(
      std::move(fabric), std::make_unique<MpiAllReducer>(rank, size), below_bytes));
}

}  // namespace internal
}  // namespace mlfabric
