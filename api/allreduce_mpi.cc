// The `mpi` AllReduce backend: Open MPI's MPI_Allreduce on MPI_COMM_WORLD.
#include <dlfcn.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "api/allreduce.h"
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
    case DataType::kFloat16: return MPI_UINT16_T;  // summed by HalfSum below
  }
  return absl::InvalidArgumentError("unsupported dtype for the mpi AllReduce backend");
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

// One small MPI_Allreduce(MAX) of (len, -len, dtype, -dtype) tells every
// rank whether all agree, so a mismatch is an error instead of a hang.
absl::Status MpiCheckAgreement(int rank, size_t count, DataType dtype) {
  int64_t local[4] = {static_cast<int64_t>(count), -static_cast<int64_t>(count),
                      static_cast<int64_t>(dtype), -static_cast<int64_t>(dtype)};
  int64_t global[4];
  int code = MPI_Allreduce(local, global, 4, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (code != MPI_SUCCESS) return absl::InternalError("MPI_Allreduce: " + MpiError(code));
  if (global[0] != -global[1] || global[2] != -global[3]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllReduce inputs differ across ranks: lengths range from ", -global[1], " to ",
        global[0], ", dtypes ", DataTypeName(static_cast<DataType>(-global[3])), " to ",
        DataTypeName(static_cast<DataType>(global[2])), " (rank ", rank, " passed ", count,
        " x ", DataTypeName(dtype), ")"));
  }
  return absl::OkStatus();
}

class MpiAllReducer : public AllReducer {
 public:
  MpiAllReducer(int rank, int size) : AllReducer(rank, size) {
    MPI_Op_create(&HalfSum, /*commute=*/1, &half_sum_);
  }
  ~MpiAllReducer() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Op_free(&half_sum_);
  }
  const char* backend() const override { return "mpi"; }

  absl::Status AllReduce(void* data, size_t count, DataType dtype) override {
    auto type = MpiType(dtype);
    if (!type.ok()) return type.status();
    if (auto status = CheckAgreement(count, dtype); !status.ok()) return status;
    return SumAgreed(data, count, dtype);
  }

  // MPI_Allreduce once every rank is known to pass `count` x `dtype`.
  absl::Status SumAgreed(void* data, size_t count, DataType dtype) {
    auto type = MpiType(dtype);
    if (!type.ok()) return type.status();
    const MPI_Op op = dtype == DataType::kFloat16 ? half_sum_ : MPI_SUM;
    int code = MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), *type, op,
                             MPI_COMM_WORLD);
    if (code != MPI_SUCCESS) return absl::InternalError("MPI_Allreduce: " + MpiError(code));
    return absl::OkStatus();
  }

  absl::Status Broadcast(void* data, size_t count, DataType dtype, int root) override {
    auto type = MpiType(dtype);
    if (!type.ok()) return type.status();
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank"));
    }
    if (auto status = CheckAgreement(count, dtype); !status.ok()) return status;
    int code = MPI_Bcast(data, static_cast<int>(count), *type, root, MPI_COMM_WORLD);
    if (code != MPI_SUCCESS) return absl::InternalError("MPI_Bcast: " + MpiError(code));
    return absl::OkStatus();
  }

 private:
  MPI_Op half_sum_ = MPI_OP_NULL;

  absl::Status CheckAgreement(size_t count, DataType dtype) {
    return MpiCheckAgreement(rank(), count, dtype);
  }
};

// mlfabric backend under mpirun (AllReduceOptions::mpi_below_bytes): a
// call whose buffer is smaller than `below` goes through MPI_Allreduce,
// a larger one through `fabric` (the scheduler's rounds). Every call
// first agrees on length and dtype across ranks (one small collective),
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

  absl::Status AllReduce(void* data, size_t count, DataType dtype) override {
    if (DataTypeSize(dtype) == 0) {
      return absl::InvalidArgumentError("unsupported dtype for AllReduce");
    }
    if (auto agreed = MpiCheckAgreement(rank(), count, dtype); !agreed.ok()) return agreed;
    if (count * DataTypeSize(dtype) >= below_) return fabric_->AllReduce(data, count, dtype);
    return mpi_->SumAgreed(data, count, dtype);
  }

 private:
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
