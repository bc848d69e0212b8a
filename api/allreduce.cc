// The AllReduce factory and the `mlfabric` backend (sync mode over push/get).
#include "api/allreduce.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "aggregator/packet_pool.h"
#include "api/call_agreement.h"
#include "api/local_reduce.h"
#include "api/push_exchange.h"

namespace mlfabric {

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kInt8: return "int8";
    case DataType::kUint8: return "uint8";
    case DataType::kInt16: return "int16";
    case DataType::kUint16: return "uint16";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kInt8: return 1;
    case DataType::kUint8: return 1;
    case DataType::kInt16: return 2;
    case DataType::kUint16: return 2;
    case DataType::kBool: return 1;
  }
  return 0;
}

absl::StatusOr<DataType> ParseDataType(const std::string& name) {
  for (int code = 1; code <= static_cast<int>(DataType::kBool); ++code) {
    if (name == DataTypeName(static_cast<DataType>(code))) return static_cast<DataType>(code);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported dtype '", name,
      "': AllReduce supports float16, float32, float64, int8, uint8, int16, uint16, int32 and "
      "int64 (and Broadcast bool)"));
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

absl::StatusOr<ReduceOp> ParseReduceOp(const std::string& name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    if (name == ReduceOpName(op)) return op;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown reduce op '", name, "': use sum, min, max or product"));
}

namespace {

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  return std::atoi(value);
}

}  // namespace

int EnvRank() { return EnvInt("MLFABRIC_RANK", EnvInt("OMPI_COMM_WORLD_RANK", 0)); }
int EnvSize() { return EnvInt("MLFABRIC_SIZE", EnvInt("OMPI_COMM_WORLD_SIZE", 1)); }

namespace internal {
bool LaunchedByMpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }
}  // namespace internal

absl::Status AllReducer::AllReduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  if (DataTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported dtype code ", static_cast<int>(dtype),
        " for AllReduce: use float16, float32, float64, int8, uint8, int16, uint16, int32 or "
        "int64"));
  }
  if (dtype == DataType::kBool) {
    return absl::InvalidArgumentError(
        "AllReduce does not reduce bool (as Horovod, bool is for broadcast and allgather only)");
  }
  if (std::string(ReduceOpName(op)) == "unknown") {
    return absl::InvalidArgumentError(absl::StrCat("unknown reduce op code ", static_cast<int>(op),
                                                   ": use sum, min, max or product"));
  }
  return Reduce(data, count, dtype, op);
}

absl::Status AllReducer::AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                                   const CallOptions& call) {
  if (!call.shape.has_value()) return AllReduce(data, count, dtype, op);
  if (call.shape->size() > static_cast<size_t>(CallOptions::kMaxDims)) {
    return RefuseCollective(
        "AllReduce", absl::InvalidArgumentError(absl::StrCat(
                         "AllReduce: shape has ", call.shape->size(),
                         " dimensions, more than the ", CallOptions::kMaxDims, " allowed")));
  }
  int64_t product = 1;
  for (int64_t dim : *call.shape) {
    if (dim < 0) {
      return RefuseCollective("AllReduce", absl::InvalidArgumentError(absl::StrCat(
                                               "AllReduce: shape [", absl::StrJoin(*call.shape, ", "),
                                               "] has a negative dimension")));
    }
    product *= dim;
  }
  if (product != static_cast<int64_t>(count)) {
    return RefuseCollective(
        "AllReduce", absl::InvalidArgumentError(absl::StrCat(
                         "AllReduce: shape [", absl::StrJoin(*call.shape, ", "), "] holds ",
                         product, " elements but the call passes ", count)));
  }
  // The dtype and op checks of the plain call, then the shaped reduce.
  if (DataTypeSize(dtype) == 0 || dtype == DataType::kBool ||
      std::string(ReduceOpName(op)) == "unknown") {
    return AllReduce(data, count, dtype, op);
  }
  return ReduceShaped(data, count, dtype, op, *call.shape);
}

absl::Status AllReducer::Broadcast(void* data, size_t count, DataType dtype, int root) {
  if (DataTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported dtype code ", static_cast<int>(dtype), " for Broadcast"));
  }
  // The ranks agree on the root first (one small sum, each rank's root at
  // its own place), so a differing root fails every rank instead of
  // summing two ranks' buffers; an invalid root is reported after it, so
  // that no rank leaves the others waiting.
  std::vector<int64_t> roots(static_cast<size_t>(size_), 0);
  roots[static_cast<size_t>(rank_)] = root;
  if (auto status = Reduce(roots.data(), roots.size(), DataType::kInt64, ReduceOp::kSum);
      !status.ok()) {
    return status;
  }
  for (int r = 1; r < size_; ++r) {
    if (roots[static_cast<size_t>(r)] != roots[0]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Mismatched Broadcast root rank: rank 0 passed root ", roots[0], " while rank ", r,
          " passed root ", roots[static_cast<size_t>(r)]));
    }
  }
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is not a rank (size ", size_, ")"));
  }
  // A sum where every rank but the root contributes zeros is exact (bool
  // as its bytes).
  if (rank_ != root) std::memset(data, 0, count * DataTypeSize(dtype));
  return Reduce(data, count, dtype == DataType::kBool ? DataType::kUint8 : dtype, ReduceOp::kSum);
}

std::vector<int64_t> ReduceScatterRows(int64_t rows, int size) {
  std::vector<int64_t> out(static_cast<size_t>(std::max(size, 0)), 0);
  if (size <= 0 || rows <= 0) return out;
  for (int r = 0; r < size; ++r) out[static_cast<size_t>(r)] = rows / size + (r < rows % size);
  return out;
}

namespace {

// The first reason an Alltoall's arguments are invalid on this rank; OK if none.
absl::Status CheckAlltoallArguments(int64_t rows, int64_t row_elements,
                                    const std::vector<int64_t>& send_rows, DataType dtype,
                                    int size) {
  if (DataTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported dtype code ", static_cast<int>(dtype), " for Alltoall"));
  }
  if (send_rows.size() != static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(absl::StrCat("Alltoall: ", send_rows.size(),
                                                   " send counts for ", size,
                                                   " ranks (one per rank)"));
  }
  int64_t total = 0;
  for (size_t d = 0; d < send_rows.size(); ++d) {
    if (send_rows[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Alltoall: send count ", send_rows[d], " for rank ", d, " is negative"));
    }
    total += send_rows[d];
  }
  if (total != rows || row_elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Alltoall: the send counts add up to ", total, " rows but the tensor has ", rows,
        " rows (of ", row_elements, " elements)"));
  }
  return absl::OkStatus();
}

// The same for a ReduceScatter.
absl::Status CheckReduceScatterArguments(int64_t rows, int64_t row_elements, DataType dtype,
                                         ReduceOp op) {
  if (DataTypeSize(dtype) == 0 || dtype == DataType::kBool) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported dtype ", DataTypeName(dtype), " (code ", static_cast<int>(dtype),
        ") for ReduceScatter: use float16, float32, float64, int8, uint8, int16, uint16, int32 "
        "or int64"));
  }
  if (std::string(ReduceOpName(op)) == "unknown") {
    return absl::InvalidArgumentError(absl::StrCat("unknown reduce op code ", static_cast<int>(op),
                                                   ": use sum, min, max or product"));
  }
  if (rows < 0 || row_elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ReduceScatter: negative shape ", rows, " x ",
                                                   row_elements));
  }
  return absl::OkStatus();
}

// A ReduceScatter's or Allgather's named shape: rows first, then the
// dimensions of a row.
absl::Status CheckRowsShape(const char* what, const std::vector<int64_t>& shape, int64_t rows,
                            int64_t row_elements) {
  const std::string text = absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
  if (shape.empty() || shape.size() > static_cast<size_t>(CallOptions::kMaxDims)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": shape ", text, " needs 1 to ", CallOptions::kMaxDims, " dimensions"));
  }
  int64_t product = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": shape ", text, " has a negative dimension"));
    }
    product *= dim;
  }
  if (shape[0] != rows || product != rows * row_elements) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shape ", text, " is not ", rows,
                                                   " rows of ", row_elements, " elements"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AllReducer::Alltoall(const void* send, int64_t rows, int64_t row_elements,
                                  const std::vector<int64_t>& send_rows, DataType dtype,
                                  const AlltoallRecvBuffer& recv_buffer,
                                  std::vector<int64_t>* recv_rows) {
  if (absl::Status invalid = CheckAlltoallArguments(rows, row_elements, send_rows, dtype, size_);
      !invalid.ok()) {
    return RefuseCollective("Alltoall", std::move(invalid));
  }
  return DoAlltoall(send, row_elements, send_rows, dtype, recv_buffer, recv_rows);
}

absl::Status AllReducer::Allgather(const void* send, int64_t rows, int64_t row_elements,
                                   DataType dtype, const AlltoallRecvBuffer& recv_buffer,
                                   std::vector<int64_t>* recv_rows) {
  return Allgather(send, rows, row_elements, dtype, recv_buffer, recv_rows, CallOptions{});
}

absl::Status AllReducer::Allgather(const void* send, int64_t rows, int64_t row_elements,
                                   DataType dtype, const AlltoallRecvBuffer& recv_buffer,
                                   std::vector<int64_t>* recv_rows, const CallOptions& call) {
  absl::Status invalid;
  if (DataTypeSize(dtype) == 0) {
    invalid = absl::InvalidArgumentError(
        absl::StrCat("unsupported dtype code ", static_cast<int>(dtype), " for Allgather"));
  } else if (rows < 0 || row_elements < 0) {
    invalid = absl::InvalidArgumentError(
        absl::StrCat("Allgather: negative shape ", rows, " x ", row_elements));
  } else if (call.shape.has_value()) {
    invalid = CheckRowsShape("Allgather", *call.shape, rows, row_elements);
  }
  if (!invalid.ok()) return RefuseCollective("Allgather", std::move(invalid));
  std::vector<int64_t> row_shape;
  if (call.shape.has_value()) row_shape.assign(call.shape->begin() + 1, call.shape->end());
  return DoAllgather(send, rows, row_elements, dtype, recv_buffer, recv_rows,
                     call.shape.has_value() ? &row_shape : nullptr);
}

absl::Status AllReducer::ReduceScatter(const void* data, int64_t rows, int64_t row_elements,
                                       DataType dtype, ReduceOp op, void* out) {
  return ReduceScatter(data, rows, row_elements, dtype, op, out, CallOptions{});
}

absl::Status AllReducer::ReduceScatter(const void* data, int64_t rows, int64_t row_elements,
                                       DataType dtype, ReduceOp op, void* out,
                                       const CallOptions& call) {
  absl::Status invalid = CheckReduceScatterArguments(rows, row_elements, dtype, op);
  if (invalid.ok() && call.shape.has_value()) {
    invalid = CheckRowsShape("ReduceScatter", *call.shape, rows, row_elements);
  }
  if (!invalid.ok()) return RefuseCollective("ReduceScatter", std::move(invalid));
  return DoReduceScatter(data, rows, row_elements, dtype, op, out,
                         call.shape.has_value() ? &*call.shape : nullptr);
}

absl::Status AllReducer::DoAlltoall(const void*, int64_t, const std::vector<int64_t>&, DataType,
                                    const AlltoallRecvBuffer&, std::vector<int64_t>*) {
  return absl::UnimplementedError(absl::StrCat(
      "Alltoall is not implemented by the ", backend(),
      " AllReduce backend here (it runs through MPI: use backend \"mpi\", or \"mlfabric\" "
      "launched by mlfabric-run)"));
}

absl::Status AllReducer::DoAllgather(const void*, int64_t, int64_t, DataType,
                                     const AlltoallRecvBuffer&, std::vector<int64_t>*,
                                     const std::vector<int64_t>*) {
  return absl::UnimplementedError(absl::StrCat(
      "Allgather is not implemented by the ", backend(),
      " AllReduce backend here (use backend \"mpi\" or \"mlfabric\")"));
}

absl::Status AllReducer::DoReduceScatter(const void*, int64_t, int64_t, DataType, ReduceOp,
                                         void*, const std::vector<int64_t>*) {
  return absl::UnimplementedError(absl::StrCat(
      "ReduceScatter is not implemented by the ", backend(),
      " AllReduce backend here (it runs through MPI: use backend \"mpi\", or \"mlfabric\" "
      "launched by mlfabric-run)"));
}

std::vector<std::string> AvailableAllReduceBackends() {
  std::vector<std::string> names = {"mlfabric", "mpi"};
  std::string why_not;
  if (internal::NcclUsable(&why_not)) names.push_back("nccl");
  return names;
}

absl::StatusOr<std::unique_ptr<AllReducer>> MakeAllReducer(const AllReduceOptions& options) {
  const int rank = options.rank >= 0 ? options.rank : EnvRank();
  const int size = options.size >= 0 ? options.size : EnvSize();
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " / size ", size,
                     " is not valid: set AllReduceOptions::rank/size or launch with mlfabric-run"));
  }
  std::string backend = options.backend.empty() ? "auto" : options.backend;
  if (backend == "auto") {
    std::string why_not;
    backend = internal::NcclUsable(&why_not) ? "nccl"
              : internal::LaunchedByMpirun() ? "mpi"
                                             : "mlfabric";
  }
  if (options.backup_workers < 0 || options.backup_workers >= size) {
    return absl::InvalidArgumentError(absl::StrCat("backup_workers ", options.backup_workers,
                                                   " must be in [0, size ", size, ")"));
  }
  if (options.backup_workers > 0 && backend != "mlfabric") {
    return absl::InvalidArgumentError(absl::StrCat(
        "backup_workers needs the mlfabric backend (the ", backend,
        " backend always sums every rank)"));
  }
  if (backend == "mlfabric") {
    size_t below = options.mpi_below_bytes;
    if (const char* env = std::getenv("MLFABRIC_ALLREDUCE_MPI_BELOW"); env != nullptr && *env) {
      char* end = nullptr;
      const long long value = std::strtoll(env, &end, 10);
      if (*end != '\0' || value < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "MLFABRIC_ALLREDUCE_MPI_BELOW='", env, "' is not a byte count >= 0"));
      }
      below = static_cast<size_t>(value);
    }
    auto fabric = internal::MakeMlfabricAllReducer(options, rank, size);
    // Under mpirun every call agrees through MPI first, and calls below
    // `below` bytes go through MPI (below == 0: every call between hosts
    // through the scheduler).
    if (!fabric.ok() || size == 1 || options.backup_workers > 0 ||
        !internal::LaunchedByMpirun()) {
      return fabric;
    }
    return internal::WrapSmallViaMpi(std::move(*fabric), below);
  }
  if (backend == "mpi") return internal::MakeMpiAllReducer(options);
  if (backend == "nccl") return internal::MakeNcclAllReducer(options);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown AllReduce backend '", backend, "': use mlfabric, mpi, nccl or auto"));
}

// ------------------------------------------------------- mlfabric backend
//
// mlfabric.md §6: AllReduce is push(root, update) then get(root) in
// synchronous mode. The root is a synchronous-round server (rank
// `root_rank` runs it in-process) registered with round_size = world size:
// the scheduler plans every round's pushes over an aggregation tree it
// builds from the job's workers (Alg. 3), the root's daemon sums the
// arriving packets and streams each finished packet of the sum back to
// every rank's get (Mercury PS, mercury.md §IV Key idea 3). Round v is the
// pushes made at model version v; it yields version v + 1.

namespace internal {
namespace {

ElementType ToElementType(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return ElementType::kFloat32;
    case DataType::kFloat64: return ElementType::kFloat64;
    case DataType::kInt32: return ElementType::kInt32;
    case DataType::kInt64: return ElementType::kInt64;
    case DataType::kFloat16: return ElementType::kFloat16;
    case DataType::kInt8: return ElementType::kInt8;
    case DataType::kUint8: return ElementType::kUint8;
    case DataType::kInt16: return ElementType::kInt16;
    case DataType::kUint16: return ElementType::kUint16;
    case DataType::kBool: return ElementType::kUint8;  // Broadcast's bytes
  }
  return ElementType::kOpaque;
}

// A reduce op the daemons' rounds cannot carry (they sum, packet by
// packet), with backup workers: min, max and product go through exchanges
// of blocks (PushExchange::AllReduce), which need every rank's part.
absl::Status RoundsOnlySum(ReduceOp op, int backups) {
  return absl::UnimplementedError(absl::StrCat(
      "reduce op ", ReduceOpName(op), " is not implemented by the mlfabric AllReduce backend with ",
      backups, " backup worker(s): its daemons' rounds only sum, and its exchanges of blocks need "
      "every rank's part (use sum, no backup workers, or backend \"mpi\")"));
}

// ------------------------------- Alltoall and ReduceScatter on the rounds
// The daemons' rounds only sum whole buffers (MLfabric §6: push, then get
// the sum). The mlfabric backend builds on them:
//  - Agreement first: one int64 sum of [size x kCallShapeWords] words,
//    rank r's CallShape in row r, compared as MPI's agreement compares them
//    (api/call_agreement.h), so a mismatch fails every rank, never a hang.
//  - ReduceScatter: the AllReduce of the whole buffer under `op`, then this
//    rank's rows of it (ReduceScatterRows). Each rank receives the whole
//    result where a ring's reduce-scatter would send it 1/size of it.
//  - Alltoall: not a sum. Each block is one push from its source rank to
//    an exchange server its destination rank runs (api/push_exchange.h),
//    so each crosses the network once, as MPI_Alltoallv's do; two small
//    sums carry the row counts and the outcome.
// With backup workers a sum may leave a rank out, so neither is offered.

// `shape`: this rank's named tensor shape (its number of dimensions and
// hash are in `mine`), or nullptr. When the hashes differ, a second sum
// carries every rank's dimensions so that each names them.
absl::Status AgreeBySum(AllReducer& reducer, const char* what, const CallShape& mine,
                        const std::vector<int64_t>* shape = nullptr) {
  const size_t size = static_cast<size_t>(reducer.size());
  const size_t me = static_cast<size_t>(reducer.rank());
  std::vector<int64_t> words(size * kCallShapeWords, 0);
  std::memcpy(&words[me * kCallShapeWords], &mine, sizeof(mine));
  if (auto status = reducer.AllReduce(words.data(), words.size(), DataType::kInt64); !status.ok()) {
    return status;
  }
  std::vector<CallShape> all(size);
  for (size_t r = 0; r < size; ++r) {
    std::memcpy(static_cast<void*>(&all[r]), &words[r * kCallShapeWords], sizeof(CallShape));
  }
  // A rank whose record is all zeros (no dtype is 0) is not in the sum: it
  // left a job whose rounds shrink to the members left, and takes no part;
  // it agrees with this rank.
  for (size_t r = 0; r < size; ++r) {
    const auto first = words.begin() + static_cast<ptrdiff_t>(r * kCallShapeWords);
    if (std::all_of(first, first + kCallShapeWords, [](int64_t w) { return w == 0; })) {
      all[r] = mine;
    }
  }
  bool shapes_differ = false;
  absl::Status agreed = CompareCallShapes(what, all, &shapes_differ);
  if (!agreed.ok() || !shapes_differ) return agreed;
  constexpr size_t kDims = CallOptions::kMaxDims;
  std::vector<int64_t> dims(size * kDims, 0);
  if (shape != nullptr) std::copy(shape->begin(), shape->end(), dims.begin() + me * kDims);
  if (auto status = reducer.AllReduce(dims.data(), dims.size(), DataType::kInt64); !status.ok()) {
    return status;
  }
  std::vector<std::vector<int64_t>> shapes(size);
  for (size_t r = 0; r < size; ++r) {
    const auto from = dims.begin() + static_cast<ptrdiff_t>(r * kDims);
    shapes[r].assign(from, from + std::clamp<int64_t>(all[r].dims, 0, kDims));
  }
  return ShapeMismatchError(what, all, shapes);
}

absl::Status NoBackupWorkers(const char* what, int backups) {
  if (backups == 0) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      what, " needs every rank's part; the mlfabric backend's sums with ", backups,
      " backup worker(s) may leave ranks out (use AllReduce, or no backup workers)"));
}

// `agree`: false when the ranks have agreed already (through MPI).
absl::Status ReduceScatterBySums(AllReducer& reducer, const void* data, int64_t rows,
                                 int64_t row_elements, DataType dtype, ReduceOp op, void* out,
                                 const std::vector<int64_t>* shape, bool agree = true) {
  if (agree) {
    if (auto agreed = AgreeBySum(reducer, "ReduceScatter",
                                 ReduceScatterShape(rows, row_elements, dtype, op, shape), shape);
        !agreed.ok()) {
      return agreed;
    }
  }
  const size_t row_bytes = static_cast<size_t>(row_elements) * DataTypeSize(dtype);
  const auto* in = static_cast<const uint8_t*>(data);
  std::vector<uint8_t> whole(in, in + static_cast<size_t>(rows) * row_bytes);
  if (auto status = reducer.AllReduce(whole.data(), static_cast<size_t>(rows * row_elements),
                                      dtype, op);
      !status.ok()) {
    return status;
  }
  const std::vector<int64_t> split = ReduceScatterRows(rows, reducer.size());
  int64_t before = 0;
  for (int r = 0; r < reducer.rank(); ++r) before += split[static_cast<size_t>(r)];
  std::memcpy(out, whole.data() + static_cast<size_t>(before) * row_bytes,
              static_cast<size_t>(split[static_cast<size_t>(reducer.rank())]) * row_bytes);
  return absl::OkStatus();
}

// An Allgather in the rounds' own path (launched without mpirun, where
// elastic jobs run), once the ranks agree: one sum of the row counts, then
// one byte sum of every rank's rows at their place, zero elsewhere, plus a
// flag byte per rank without a receive buffer. A round that shrank to the
// members left gathers theirs. Under mpirun, between hosts, each rank's rows
// are pushed once to every rank instead (AllgatherByPushes).
absl::Status AllgatherBySums(AllReducer& reducer, const void* send, int64_t rows,
                             int64_t row_elements, DataType dtype,
                             const AlltoallRecvBuffer& recv_buffer,
                             std::vector<int64_t>* recv_rows) {
  const size_t size = static_cast<size_t>(reducer.size());
  const size_t me = static_cast<size_t>(reducer.rank());
  std::vector<int64_t> counts(size, 0);
  counts[me] = rows;
  if (auto status = reducer.AllReduce(counts.data(), counts.size(), DataType::kInt64);
      !status.ok()) {
    return status;
  }
  const size_t row_bytes = static_cast<size_t>(row_elements) * DataTypeSize(dtype);
  size_t total = 0, at = 0;
  for (size_t r = 0; r < size; ++r) {
    if (r == me) at = total;
    total += static_cast<size_t>(counts[r]) * row_bytes;
  }
  const absl::StatusOr<void*> buffer = recv_buffer(counts);
  std::vector<uint8_t> all(total + size, 0);
  const size_t mine = static_cast<size_t>(rows) * row_bytes;
  if (mine > 0) std::memcpy(&all[at], send, mine);
  all[total + me] = buffer.ok() ? 0 : 1;
  if (auto status = reducer.AllReduce(all.data(), all.size(), DataType::kUint8); !status.ok()) {
    return status;
  }
  if (!buffer.ok()) return buffer.status();
  for (size_t r = 0; r < size; ++r) {
    if (all[total + r] != 0) {
      return absl::AbortedError(
          absl::StrCat("Allgather: rank ", r, " had no receive buffer (see its error)"));
    }
  }
  if (total > 0) std::memcpy(*buffer, all.data(), total);
  if (recv_rows != nullptr) *recv_rows = counts;
  return absl::OkStatus();
}

class MlfabricAllReducer;

// The mlfabric backend's reducers: their ReduceScatter is built from their
// own sums, their Alltoall from pushes (after an agreement by sum), and a
// rank whose arguments are invalid takes part in the agreement, marked
// invalid.
class SumsAllReducer : public AllReducer {
 public:
  using AllReducer::AllReducer;

 protected:
  // Backup workers the sums allow (a sum may then leave ranks out).
  virtual int backups() const = 0;

  absl::Status DoAlltoall(const void* send, int64_t row_elements,
                          const std::vector<int64_t>& send_rows, DataType dtype,
                          const AlltoallRecvBuffer& recv_buffer,
                          std::vector<int64_t>* recv_rows) override {
    if (auto refused = NoBackupWorkers("Alltoall", backups()); !refused.ok()) return refused;
    if (auto agreed = AgreeBySum(*this, "Alltoall", AlltoallShape(row_elements, dtype));
        !agreed.ok()) {
      return agreed;
    }
    return AlltoallByPushes(OwnSums(), send, row_elements, send_rows, dtype, recv_buffer,
                            recv_rows);
  }
  absl::Status DoAllgather(const void* send, int64_t rows, int64_t row_elements, DataType dtype,
                           const AlltoallRecvBuffer& recv_buffer, std::vector<int64_t>* recv_rows,
                           const std::vector<int64_t>* row_shape) override {
    if (auto refused = NoBackupWorkers("Allgather", backups()); !refused.ok()) return refused;
    if (auto agreed =
            AgreeBySum(*this, "Allgather", AlltoallShape(row_elements, dtype, row_shape), row_shape);
        !agreed.ok()) {
      return agreed;
    }
    return AllgatherBySums(*this, send, rows, row_elements, dtype, recv_buffer, recv_rows);
  }
  absl::Status DoReduceScatter(const void* data, int64_t rows, int64_t row_elements,
                               DataType dtype, ReduceOp op, void* out,
                               const std::vector<int64_t>* shape) override {
    if (auto refused = NoBackupWorkers("ReduceScatter", backups()); !refused.ok()) return refused;
    if (op == ReduceOp::kSum) {
      return ReduceScatterBySums(*this, data, rows, row_elements, dtype, op, out, shape);
    }
    if (auto agreed = AgreeBySum(*this, "ReduceScatter",
                                 ReduceScatterShape(rows, row_elements, dtype, op, shape), shape);
        !agreed.ok()) {
      return agreed;
    }
    return ReduceScatterByPushes(OwnSums(), data, rows, row_elements, dtype, op, out);
  }
  // Min, max and product, which the daemons' rounds do not carry (they
  // sum): once the ranks agree on length, dtype, op and the shape a call
  // names (one sum), a reduce-scatter and an allgather of blocks by pushes
  // (ReduceByPushes), the exchanges' small sums this reducer's own.
  absl::Status ReduceByExchange(void* data, size_t count, DataType dtype, ReduceOp op,
                                const std::vector<int64_t>* shape) {
    if (auto agreed =
            AgreeBySum(*this, "AllReduce", ReduceShape(count, dtype, op, shape), shape);
        !agreed.ok()) {
      return agreed;
    }
    return ReduceByPushes(OwnSums(), data, count, dtype, op);
  }
  // This reducer's own int64 sums, for an exchange's small sums.
  SumWords OwnSums() {
    return [this](std::vector<int64_t>& words) {
      return AllReduce(words.data(), words.size(), DataType::kInt64);
    };
  }
  absl::Status RefuseCollective(const char* what, absl::Status invalid) override {
    if (backups() == 0) (void)AgreeBySum(*this, what, InvalidCallShape());
    return invalid;
  }
  // The flat reducer whose worker pushes this rank's Alltoall blocks and
  // which runs its exchange server.
  virtual MlfabricAllReducer& pusher() = 0;

 public:
  // An Alltoall whose ranks agree on dtype and row length: its blocks as
  // pushes (api/push_exchange.h), its two small sums by `sum` (this
  // reducer's rounds, or MPI under mpirun).
  absl::Status AlltoallByPushes(const SumWords& sum, const void* send, int64_t row_elements,
                                const std::vector<int64_t>& send_rows, DataType dtype,
                                const AlltoallRecvBuffer& recv_buffer,
                                std::vector<int64_t>* recv_rows);

  // A broadcast in the rounds' own path (launched without mpirun, where
  // elastic jobs run) is a sum where only the root contributes: a round
  // that shrank to the members left still sums the root's buffer, so it
  // survives a rank leaving. Under mpirun, between hosts, the root's
  // buffer is pushed to every rank instead (BroadcastByPushes). Not with
  // backup workers: a round that closes without the root's push would
  // hand every rank zeros.
  absl::Status Broadcast(void* data, size_t count, DataType dtype, int root) override {
    if (auto refused = NoBackupWorkers("Broadcast", backups()); !refused.ok()) return refused;
    return AllReducer::Broadcast(data, count, dtype, root);
  }
  // A Broadcast whose ranks agree on length, dtype and root: the root's
  // buffer pushed to every other rank's exchange server, the two small
  // sums by `sum`.
  absl::Status BroadcastByPushes(const SumWords& sum, void* data, size_t count, DataType dtype,
                                 int root);
  // An AllReduce under min, max or product whose ranks agree on length,
  // dtype and op (PushExchange::AllReduce): every rank's exchange server
  // takes its slice of every rank's buffer and reduces it; then each rank's
  // reduced slice is pushed to every other rank. Hosts shared by several
  // ranks take part rank by rank (each rank's blocks are its own pushes).
  absl::Status ReduceByPushes(const SumWords& sum, void* data, size_t count, DataType dtype,
                              ReduceOp op);
  // A ReduceScatter under min, max or product whose ranks agree: rank s's
  // rows for rank d pushed to d's exchange server, which reduces them
  // (PushExchange::ReduceScatter).
  absl::Status ReduceScatterByPushes(const SumWords& sum, const void* data, int64_t rows,
                                     int64_t row_elements, DataType dtype, ReduceOp op,
                                     void* out);
  // An Allgather whose ranks agree on dtype and row length: this rank's
  // rows pushed to every other rank's exchange server.
  absl::Status AllgatherByPushes(const SumWords& sum, const void* send, int64_t rows,
                                 int64_t row_elements, DataType dtype,
                                 const AlltoallRecvBuffer& recv_buffer,
                                 std::vector<int64_t>* recv_rows);
};

// The root's server application: its daemon does the summing; it only
// acknowledges each complete round and tells late joiners the version.
class RootServer {
 public:
  // `size`: the contributions each round sums (at most).
  RootServer(std::unique_ptr<Server> server, int size) : server_(std::move(server)), size_(size) {
    version_ = server_->initial_version();
    first_version_ = version_;
    server_->RegisterUpdateCallback([this](const Server::Update& u) { return OnUpdate(u); });
    server_->RegisterRequestCallback([this]() { return OnRequest(); });
    thread_ = std::thread([this] { serve_status_ = server_->Serve(); });
  }

  ~RootServer() {
    server_->Stop();
    if (thread_.joinable()) thread_.join();
  }

  // Waits until the round that produces `version` reached this server (so
  // leaving now does not fail it for the other ranks).
  void AwaitVersion(int64_t version, double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                 [&] { return version_ >= version; });
  }

 private:
  absl::StatusOr<int64_t> OnUpdate(const Server::Update& u) {
    std::lock_guard<std::mutex> lock(mu_);
    // Fewer when ranks left a job whose config writes "member_loss":
    // "shrink": the scheduler then sizes the rounds by the ranks left.
    if (u.count < 1 || u.count > size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AllReduce root expects rounds of at most ", size_, " pushes, got ", u.count,
          ": push to the AllReduce root only through AllReduce"));
    }
    version_ = std::max(version_, u.version + 1);
    cv_.notify_all();
    return version_;
  }

  absl::StatusOr<Server::Snapshot> OnRequest() {
    std::lock_guard<std::mutex> lock(mu_);
    Server::Snapshot snapshot;
    snapshot.version = version_;
    // The bytes: the root's first round, where every rank starts (with
    // backup workers, rounds may complete before a slow rank has joined;
    // it must still apply each round's sum from the first, in order).
    snapshot.bytes.resize(8);
    for (int i = 0; i < 8; ++i) {
      snapshot.bytes[i] = static_cast<uint8_t>(static_cast<uint64_t>(first_version_) >> (8 * i));
    }
    return snapshot;
  }

  std::unique_ptr<Server> server_;
  const int size_;
  std::thread thread_;
  absl::Status serve_status_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t version_ = 0;
  int64_t first_version_ = 0;
};

class MlfabricAllReducer : public SumsAllReducer {
 public:
  MlfabricAllReducer(int rank, int size, int backup_workers, std::string root, double timeout_s,
                     double linger_s, std::unique_ptr<Worker> worker,
                     std::unique_ptr<RootServer> root_server)
      : SumsAllReducer(rank, size),
        backup_workers_(backup_workers),
        linger_s_(linger_s),
        root_(std::move(root)),
        timeout_s_(timeout_s),
        worker_(std::move(worker)),
        root_server_(std::move(root_server)) {}

  ~MlfabricAllReducer() override {
    // Every rank's blocks reached this rank's exchange server within its
    // last Alltoall (the call's outcome sum says so): nothing is on its way.
    exchange_.reset();
    if (unconfirmed_.valid()) {
      // No later call collects the last push's outcome: say it if it did not
      // end applied (its sum was returned, complete, already).
      const absl::Status last =
          ConfirmPrevious(Clock::now() + std::chrono::duration<double>(std::min(timeout_s_, 30.0)));
      if (!last.ok()) {
        std::fprintf(stderr, "mlfabric AllReduce: %s\n", std::string(last.message()).c_str());
      }
    }
    // The root's last round must reach its server application before it
    // disconnects, or the round would fail for ranks still streaming it.
    if (root_server_ != nullptr) root_server_->AwaitVersion(version_, std::min(timeout_s_, 30.0));
    // Other ranks may still be collecting the last round's sum: their get
    // can reach the root's daemon after the root returned from its last
    // call (a loaded host's daemon forwards it late), and with backup
    // workers ranks may be a round behind: they push their last round
    // (late, left out) and get its sum after the root finished. Its server
    // stays up a while for them (bounded).
    if (root_server_ != nullptr && size() > 1) {
      const double floor_s = backup_workers_ > 0 ? 1.0 : 0.5;
      const double linger_s =
          linger_s_ >= 0 ? linger_s_
                         : std::min(timeout_s_, std::max(floor_s, 3.0 * longest_round_s_));
      std::this_thread::sleep_for(std::chrono::duration<double>(linger_s));
    }
    worker_.reset();
    root_server_.reset();
  }

  const char* backend() const override { return "mlfabric"; }
  // How this rank reaches its daemon and its worker's name, for the
  // Alltoall exchange server it starts at its first Alltoall.
  void set_exchange_client(const ClientOptions& client, const std::string& worker_name) {
    exchange_client_ = client;
    worker_name_ = worker_name;
  }
  // The Alltoall exchange (api/push_exchange.h): its servers are named
  // after this reducer's root.
  PushExchange& exchange() {
    if (exchange_ == nullptr) {
      exchange_ = std::make_unique<PushExchange>(exchange_client_, root_, rank(), size(),
                                                 timeout_s_);
    }
    return *exchange_;
  }
  Worker& worker() { return *worker_; }
  const std::string& worker_name() const { return worker_name_; }
  // The last sum's count (Model::count: fewer than the ranks when a rank
  // left and the job's rounds shrank), else the ranks less the backups.
  int summed() const override { return last_count_ > 0 ? last_count_ : size() - backup_workers_; }
  // Takes part in this round without a contribution to sum: a push of one
  // opaque byte, which fails the round for every rank ("is opaque bytes",
  // reported as inputs that differ). Used by a host whose own ranks passed
  // differing shapes (HierarchicalAllReducer).
  void SpoilRound() {
    const int64_t round = version_;
    version_ = round + 1;
    const uint8_t byte = 0;
    worker_->PushAsync(root_, &byte, 1, round, 0.0, [](PushResult) {}, {TensorSpec{0, 1, 0}},
                       ElementType::kOpaque);
  }

  // The host name of this rank's daemon ("" from a daemon too old to say).
  const std::string& daemon_host() const { return worker_->daemon_host(); }
  int64_t left_out() const override { return left_out_; }
  int backup_workers() const { return backup_workers_; }

  // Waits until the root answers a get (it registered), up to `timeout_s`.
  absl::Status AwaitRoot(double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    absl::Status last;
    while (Clock::now() < deadline) {
      auto model = worker_->Get(root_);
      if (model.ok()) {
        version_ = model->version;
        if (model->size() == 8) {  // the root's first round (RootServer::OnRequest)
          uint64_t first = 0;
          for (int i = 0; i < 8; ++i) {
            first |= static_cast<uint64_t>(static_cast<const uint8_t*>(model->data())[i]) << (8 * i);
          }
          version_ = static_cast<int64_t>(first);
        }
        return absl::OkStatus();
      }
      last = model.status();
      if (absl::IsUnavailable(last) && last.message().find("lost the connection") !=
                                           absl::string_view::npos) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return absl::UnavailableError(absl::StrCat(
        "AllReduce root server '", root_, "' is not registered (rank ", rank(),
        " waited ", timeout_s, " s; rank 0 runs it): ", last.message()));
  }

  // One round: pushes `count` elements to the root, naming `shape` (the
  // whole tensor's, for a piece or a host's sum; the root's scheduler fails
  // the round for every rank when two pushes name different shapes) and
  // gets the sum. `dtype` and `op` are valid (AllReduce checked them).
  absl::Status SumRound(void* data, size_t count, DataType dtype, ReduceOp op,
                        const std::optional<std::vector<int64_t>>& shape) {
    const size_t bytes = count * DataTypeSize(dtype);
    if (bytes == 0) return absl::OkStatus();  // nothing to sum, no round used
    if (op != ReduceOp::kSum) {
      // The round fails for ranks that passed sum (no one waits for it).
      SpoilRound();
      return RoundsOnlySum(op, backup_workers_);
    }
    const int64_t round = version_;
    // A failed round still uses its number (the scheduler moves on too).
    version_ = round + 1;
    const RoundTimer timer(this);
    auto pushed = worker_->Push(root_, data, bytes, round, 0.0, {TensorSpec{0, bytes, 0}},
                                ToElementType(dtype), shape);
    // The get streams the sum back as its packets complete at the root.
    absl::StatusOr<Model> sum = worker_->Get(root_);
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    // The previous round's push outcome, which this call overlapped.
    absl::Status previous = ConfirmPrevious(deadline);
    // Without backup workers, a sum of the right size means the root summed
    // every rank's contribution of this round, this one's included: the
    // push's outcome (applied once the root's server application has
    // acknowledged the round) follows later, and the next call (or the
    // destructor) collects it while its own round is under way, instead of
    // this call waiting for another round trip through the scheduler.
    if (sum.ok() && sum->count > 0) last_count_ = sum->count;
    if (backup_workers_ == 0 && sum.ok() && sum->size() == bytes) {
      std::memcpy(data, sum->data(), bytes);
      unconfirmed_ = std::move(pushed);
      unconfirmed_round_ = round;
      return previous;
    }
    if (pushed.wait_until(deadline) != std::future_status::ready) {
      return absl::DeadlineExceededError(absl::StrCat("AllReduce round ", round, ": rank ", rank(),
                                                      "'s push did not complete in ", timeout_s_,
                                                      " s"));
    }
    const PushResult result = pushed.get();
    // A backup worker's late contribution (or one from a rank rounds
    // behind) is left out; the rank goes on with the round's sum.
    const bool late = backup_workers_ > 0 && result.outcome == PushOutcome::kDropped &&
                      (absl::StartsWith(result.reason, "late_for_round") ||
                       absl::StartsWith(result.reason, "stale: round"));
    if (late) ++left_out_;
    if (result.outcome != PushOutcome::kApplied && !late) {
      return RoundError(round, absl::StrCat("rank ", rank(), "'s push ",
                                            PushOutcomeName(result.outcome), ": ", result.reason));
    }
    if (!sum.ok()) return RoundError(round, std::string(sum.status().message()));
    if (sum->size() != bytes) {
      return absl::InternalError(absl::StrCat("AllReduce round ", round, ": the sum has ",
                                              sum->size(), " bytes, expected ", bytes));
    }
    if (!previous.ok()) return previous;
    std::memcpy(data, sum->data(), bytes);
    return absl::OkStatus();
  }

 protected:
  int backups() const override { return backup_workers_; }
  MlfabricAllReducer& pusher() override { return *this; }
  absl::Status Reduce(void* data, size_t count, DataType dtype, ReduceOp op) override {
    if (op != ReduceOp::kSum && backup_workers_ == 0) {
      return ReduceByExchange(data, count, dtype, op, nullptr);
    }
    return SumRound(data, count, dtype, op, std::nullopt);
  }
  absl::Status ReduceShaped(void* data, size_t count, DataType dtype, ReduceOp op,
                            const std::vector<int64_t>& shape) override {
    if (op != ReduceOp::kSum && backup_workers_ == 0) {
      return ReduceByExchange(data, count, dtype, op, &shape);
    }
    return SumRound(data, count, dtype, op, shape);
  }

 private:
  using Clock = std::chrono::steady_clock;

  // Keeps the longest of the recent rounds' durations (it decays, so one
  // slow round long ago does not stretch the root's linger forever).
  class RoundTimer {
   public:
    explicit RoundTimer(MlfabricAllReducer* reducer) : reducer_(reducer), start_(Clock::now()) {}
    ~RoundTimer() {
      const double s = std::chrono::duration<double>(Clock::now() - start_).count();
      reducer_->longest_round_s_ = std::max(s, 0.9 * reducer_->longest_round_s_);
    }

   private:
    MlfabricAllReducer* reducer_;
    Clock::time_point start_;
  };

  // Collects the outcome of the push whose round's sum an earlier call
  // returned: an error only if it did not end applied (the root's server
  // application never acknowledged that round).
  template <typename TimePoint>
  absl::Status ConfirmPrevious(TimePoint deadline) {
    if (!unconfirmed_.valid()) return absl::OkStatus();
    std::future<PushResult> pushed = std::move(unconfirmed_);
    const int64_t round = unconfirmed_round_;
    if (pushed.wait_until(deadline) != std::future_status::ready) {
      return absl::DeadlineExceededError(absl::StrCat("AllReduce round ", round, ": rank ", rank(),
                                                      "'s push did not complete in ", timeout_s_,
                                                      " s"));
    }
    const PushResult result = pushed.get();
    if (result.outcome == PushOutcome::kApplied) return absl::OkStatus();
    return RoundError(round, absl::StrCat("rank ", rank(), "'s push ",
                                          PushOutcomeName(result.outcome),
                                          " after its sum arrived: ", result.reason));
  }

  static absl::Status RoundError(int64_t round, const std::string& what) {
    // A round spoiled by a host whose ranks disagree (SpoilRound) fails
    // with "... is opaque bytes".
    if (what.find("is opaque bytes") != std::string::npos) {
      return absl::FailedPreconditionError(absl::StrCat(
          "AllReduce inputs differ across ranks (round ", round,
          "): another rank left the round, for a reduce op other than sum or because the ranks "
          "on its host passed differing shapes (",
          what, ")"));
    }
    if (what.find("mismatch:") != std::string::npos) {
      return absl::FailedPreconditionError(
          absl::StrCat("AllReduce inputs differ across ranks (round ", round, "): ", what));
    }
    return absl::UnavailableError(absl::StrCat("AllReduce round ", round, ": ", what));
  }

  const int backup_workers_;
  const double linger_s_;  // AllReduceOptions::root_linger_s
  double longest_round_s_ = 0;  // of the last rounds (root with backup workers)
  int64_t left_out_ = 0;
  int last_count_ = 0;  // the last sum's Model::count
  const std::string root_;
  const double timeout_s_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<RootServer> root_server_;
  int64_t version_ = 0;
  // The push of round unconfirmed_round_, whose sum was returned before
  // its outcome came (ConfirmPrevious).
  std::future<PushResult> unconfirmed_;
  int64_t unconfirmed_round_ = -1;
  ClientOptions exchange_client_;
  std::string worker_name_;
  std::unique_ptr<PushExchange> exchange_;  // from the first Alltoall
};

absl::Status SumsAllReducer::BroadcastByPushes(const SumWords& sum, void* data, size_t count,
                                               DataType dtype, int root) {
  if (root < 0 || root >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is not a rank (size ", size(), ")"));
  }
  const int64_t bytes = static_cast<int64_t>(count * DataTypeSize(dtype));
  auto* buffer = static_cast<uint8_t*>(data);
  std::vector<const uint8_t*> send(static_cast<size_t>(size()), buffer);
  std::vector<int64_t> send_bytes(static_cast<size_t>(size()), 0);
  if (rank() == root) {
    for (int d = 0; d < size(); ++d) send_bytes[static_cast<size_t>(d)] = d == root ? 0 : bytes;
  }
  MlfabricAllReducer& flat = pusher();
  std::vector<int64_t> received;
  absl::Status status = flat.exchange().Exchange(
      "Broadcast", flat.worker(), flat.worker_name(), sum, send, send_bytes,
      [buffer](const std::vector<int64_t>&) -> absl::StatusOr<uint8_t*> { return buffer; },
      &received);
  if (status.ok() && rank() != root && bytes > 0 && received[static_cast<size_t>(root)] != bytes) {
    // The root's words were not in the sum: it left a job whose rounds shrink.
    return flat.exchange().MembersLeft("Broadcast", flat.worker(), {root});
  }
  return status;
}

absl::Status SumsAllReducer::ReduceByPushes(const SumWords& sum, void* data, size_t count,
                                            DataType dtype, ReduceOp op) {
  if (count == 0) return absl::OkStatus();  // as a sum: no exchange used
  MlfabricAllReducer& flat = pusher();
  return flat.exchange().AllReduce(flat.worker(), flat.worker_name(), sum, data, count, dtype, op);
}

absl::Status SumsAllReducer::ReduceScatterByPushes(const SumWords& sum, const void* data,
                                                   int64_t rows, int64_t row_elements,
                                                   DataType dtype, ReduceOp op, void* out) {
  std::vector<int64_t> split = ReduceScatterRows(rows, size());
  for (int64_t& elements : split) elements *= row_elements;
  MlfabricAllReducer& flat = pusher();
  return flat.exchange().ReduceScatter("ReduceScatter", flat.worker(), flat.worker_name(), sum,
                                       data, split, dtype, op, out);
}

absl::Status SumsAllReducer::AllgatherByPushes(const SumWords& sum, const void* send,
                                               int64_t rows, int64_t row_elements,
                                               DataType dtype,
                                               const AlltoallRecvBuffer& recv_buffer,
                                               std::vector<int64_t>* recv_rows) {
  MlfabricAllReducer& flat = pusher();
  return flat.exchange().Allgather(flat.worker(), flat.worker_name(), sum, send, rows,
                                   row_elements, dtype, recv_buffer, recv_rows);
}

absl::Status SumsAllReducer::AlltoallByPushes(const SumWords& sum, const void* send,
                                              int64_t row_elements,
                                              const std::vector<int64_t>& send_rows,
                                              DataType dtype,
                                              const AlltoallRecvBuffer& recv_buffer,
                                              std::vector<int64_t>* recv_rows) {
  MlfabricAllReducer& flat = pusher();
  return flat.exchange().Alltoall(flat.worker(), flat.worker_name(), sum, send, row_elements,
                                  send_rows, dtype, recv_buffer, recv_rows);
}

// ------------------------------------------------- hierarchical AllReduce
//
// Ranks whose daemon is the same (one machine) sum in shared memory
// (LocalReduceGroup); only each host's leader takes part in the
// scheduler-planned rounds, of one contribution per host, through a second
// root server ("<root>-hosts", run by the root rank, which leads its
// host). Who shares a host is learned once, at construction, by one flat
// round in which each rank contributes its daemon's host name (hashed) and
// a random nonce: every rank then knows every group, and the leaders'
// nonces name the groups' shared memory.
class HierarchicalAllReducer : public SumsAllReducer {
 public:
  HierarchicalAllReducer(int rank, int size, double timeout_s, int hosts,
                         std::unique_ptr<LocalReduceGroup> group,
                         std::unique_ptr<MlfabricAllReducer> across_hosts,
                         std::unique_ptr<AllReducer> flat)
      : SumsAllReducer(rank, size),
        timeout_s_(timeout_s),
        hosts_(hosts),
        group_(std::move(group)),
        across_hosts_(std::move(across_hosts)),
        flat_(std::move(flat)) {}

  ~HierarchicalAllReducer() override {
    // The host-level root (on the root rank) waits in its destructor for
    // its last round to reach it; the group and the flat reducer go after.
    across_hosts_.reset();
    group_.reset();
    flat_.reset();
  }

  const char* backend() const override { return "mlfabric"; }
  int local_size() const override { return group_->members(); }

 protected:
  int backups() const override { return 0; }  // made only without backup workers
  // Every rank's own flat reducer (the one that learned the hosts).
  MlfabricAllReducer& pusher() override { return *static_cast<MlfabricAllReducer*>(flat_.get()); }
  // Any op on one host (in shared memory). Across hosts a sum is the
  // host's part, then the leaders' rounds; min, max and product go through
  // every rank's exchange of blocks (ReduceByExchange), its small sums
  // this reducer's own.
  absl::Status Reduce(void* data, size_t count, DataType dtype, ReduceOp op) override {
    if (op != ReduceOp::kSum && hosts_ > 1) return ReduceByExchange(data, count, dtype, op, nullptr);
    return HostThenHosts(data, count, dtype, op, nullptr);
  }
  absl::Status ReduceShaped(void* data, size_t count, DataType dtype, ReduceOp op,
                            const std::vector<int64_t>& shape) override {
    if (op != ReduceOp::kSum && hosts_ > 1) return ReduceByExchange(data, count, dtype, op, &shape);
    return HostThenHosts(data, count, dtype, op, &shape);
  }

 private:
  // The host's members agree (shapes too, when named) and reduce in shared
  // memory; the leader's round across hosts carries the shape they agreed.
  absl::Status HostThenHosts(void* data, size_t count, DataType dtype, ReduceOp op,
                             const std::vector<int64_t>* shape) {
    if (count == 0) return absl::OkStatus();  // as the flat path: no round used
    if (hosts_ == 1) {
      return group_->AllReduce(data, count, ToElementType(dtype), nullptr, timeout_s_, PoolOp(op),
                               shape);
    }
    LocalReduceGroup::CrossHost cross;
    cross.reduce = [this, dtype, op](void* sum, size_t n, ElementType,
                                     const std::vector<int64_t>* agreed) -> absl::Status {
      if (across_hosts_ == nullptr) return absl::InternalError("not this host's leader");
      std::optional<std::vector<int64_t>> host_shape;
      if (agreed != nullptr) host_shape = *agreed;
      return across_hosts_->SumRound(sum, n, dtype, op, host_shape);
    };
    cross.spoil = [this] {
      if (across_hosts_ != nullptr) across_hosts_->SpoilRound();
    };
    return group_->AllReduce(data, count, ToElementType(dtype), &cross, timeout_s_, PoolOp(op),
                             shape);
  }

  const double timeout_s_;
  const int hosts_;
  std::unique_ptr<LocalReduceGroup> group_;
  std::unique_ptr<MlfabricAllReducer> across_hosts_;  // this host's leader only
  std::unique_ptr<AllReducer> flat_;          // kept for its root server (rank root_rank)
};

// ------------------------------------------------------ pieces of a sum
//
// AllReduceOptions::pieces: the buffer is cut into P contiguous pieces,
// each summed by its own flat reducer whose root server rank
// (root_rank + k) mod size runs, all P rounds at once. Every rank pushes
// piece k to its root and gets piece k's sum from it, so no one host
// carries all contributions in and all copies out.
//
// Every rank makes all P rounds in every call, so that inputs that differ
// across ranks fail every rank's call instead of leaving a rank waiting
// for a round others skipped: a piece with no elements (count < P) is
// pushed as one zero element of another type than the data's, and any
// difference in count then shows as a piece whose size or type differs
// at its root ("mismatch:", FailedPrecondition).
class PiecesAllReducer : public SumsAllReducer {
 public:
  PiecesAllReducer(int rank, int size, std::vector<std::unique_ptr<MlfabricAllReducer>> pieces)
      : SumsAllReducer(rank, size), pieces_(std::move(pieces)) {}

  ~PiecesAllReducer() override {
    // Each root waits for its last round to reach it (and lingers, with
    // backup workers): at once, not one after the other.
    std::vector<std::thread> threads;
    for (auto& piece : pieces_) threads.emplace_back([&piece] { piece.reset(); });
    for (std::thread& t : threads) t.join();
  }

  const char* backend() const override { return "mlfabric"; }
  int summed() const override { return pieces_[0]->summed(); }
  // Calls in which at least one of this rank's pieces was left out.
  int64_t left_out() const override { return left_out_; }

 protected:
  int backups() const override { return pieces_[0]->backup_workers(); }
  MlfabricAllReducer& pusher() override { return *pieces_[0]; }
  absl::Status Reduce(void* data, size_t count, DataType dtype, ReduceOp op) override {
    if (op != ReduceOp::kSum && backups() == 0) {
      return ReduceByExchange(data, count, dtype, op, nullptr);
    }
    return SumPieces(data, count, dtype, op, std::nullopt);
  }
  absl::Status ReduceShaped(void* data, size_t count, DataType dtype, ReduceOp op,
                            const std::vector<int64_t>& shape) override {
    if (op != ReduceOp::kSum && backups() == 0) {
      return ReduceByExchange(data, count, dtype, op, &shape);
    }
    return SumPieces(data, count, dtype, op, shape);
  }

 private:
  // Every piece's round names the whole tensor's shape.
  absl::Status SumPieces(void* data, size_t count, DataType dtype, ReduceOp op,
                         const std::optional<std::vector<int64_t>>& shape) {
    const size_t element = DataTypeSize(dtype);
    if (count == 0) return absl::OkStatus();  // as the flat path: no round used
    if (op != ReduceOp::kSum) {
      for (auto& piece : pieces_) piece->SpoilRound();  // each fails for ranks that sum
      return RoundsOnlySum(op, backups());
    }
    const size_t n = pieces_.size();
    std::vector<absl::Status> status(n);
    std::vector<int64_t> left_before(n);
    const DataType pad_type = dtype == DataType::kInt64 ? DataType::kInt32 : DataType::kInt64;
    auto reduce = [&](size_t k) {
      left_before[k] = pieces_[k]->left_out();
      const size_t begin = count * k / n, end = count * (k + 1) / n;
      if (begin == end) {
        int64_t pad = 0;
        status[k] = pieces_[k]->SumRound(&pad, 1, pad_type, ReduceOp::kSum, shape);
        return;
      }
      status[k] = pieces_[k]->SumRound(static_cast<uint8_t*>(data) + begin * element,
                                       end - begin, dtype, ReduceOp::kSum, shape);
    };
    std::vector<std::thread> threads;
    threads.reserve(n - 1);
    for (size_t k = 1; k < n; ++k) threads.emplace_back(reduce, k);
    reduce(0);
    for (std::thread& t : threads) t.join();
    bool left = false;
    for (size_t k = 0; k < n; ++k) left = left || pieces_[k]->left_out() > left_before[k];
    if (left) ++left_out_;
    // The first error, preferring what names the caller's mistake.
    const absl::Status* first = nullptr;
    for (const absl::Status& s : status) {
      if (s.ok()) continue;
      const auto mistake = [](const absl::Status& e) {
        return absl::IsInvalidArgument(e) || absl::IsFailedPrecondition(e);
      };
      if (first == nullptr || (mistake(s) && !mistake(*first))) {
        first = &s;
      }
    }
    if (first == nullptr) return absl::OkStatus();
    const size_t k = static_cast<size_t>(first - status.data());
    return absl::Status(first->code(),
                        absl::StrCat(first->message(), " (piece ", k + 1, " of ", n, ")"));
  }

  std::vector<std::unique_ptr<MlfabricAllReducer>> pieces_;
  int64_t left_out_ = 0;
};

uint64_t HostKey(const std::string& host) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : host) hash = (hash ^ c) * 1099511628211ull;
  return (hash >> 2) | 1;  // positive and never 0 (0 is "no rank here")
}

bool LocalReduceWanted(const AllReduceOptions& options) {
  const char* env = std::getenv("MLFABRIC_LOCAL_REDUCE");
  if (env != nullptr && std::string(env) == "0") return false;
  return options.local_reduce;
}

// Turns `flat` into a hierarchical reducer when some ranks share a daemon;
// returns `flat` unchanged when none do.
absl::StatusOr<std::unique_ptr<AllReducer>> MakeHierarchical(
    const AllReduceOptions& options, int rank, int size, const std::string& root,
    std::unique_ptr<MlfabricAllReducer> flat) {
  if (flat->daemon_host().empty()) return flat;
  std::vector<int64_t> seen(2 * static_cast<size_t>(size), 0);
  std::random_device random;
  const uint64_t nonce = ((uint64_t{random()} << 32) ^ random()) >> 1;
  seen[2 * rank] = static_cast<int64_t>(HostKey(flat->daemon_host()));
  seen[2 * rank + 1] = static_cast<int64_t>(nonce | 1);
  if (auto status = flat->AllReduce(seen.data(), seen.size(), DataType::kInt64); !status.ok()) {
    return absl::Status(status.code(), absl::StrCat("rank ", rank,
                                                    " could not learn which ranks share its host: ",
                                                    status.message()));
  }
  // Hosts in the order of their leaders; a host's leader is the root rank
  // if it is there, else its lowest rank.
  std::map<int64_t, std::vector<int>> by_host;
  for (int r = 0; r < size; ++r) by_host[seen[2 * r]].push_back(r);
  if (by_host.size() == static_cast<size_t>(size)) return flat;  // one rank per host
  std::vector<std::vector<int>> hosts;
  for (auto& [key, ranks] : by_host) {
    auto root_here = std::find(ranks.begin(), ranks.end(), options.root_rank);
    if (root_here != ranks.end()) std::rotate(ranks.begin(), root_here, root_here + 1);
    hosts.push_back(ranks);
  }
  std::sort(hosts.begin(), hosts.end(),
            [](const std::vector<int>& a, const std::vector<int>& b) { return a[0] < b[0]; });
  int host_index = -1, root_host = -1, member_index = -1;
  for (size_t h = 0; h < hosts.size(); ++h) {
    if (hosts[h][0] == options.root_rank) root_host = static_cast<int>(h);
    for (size_t m = 0; m < hosts[h].size(); ++m) {
      if (hosts[h][m] == rank) host_index = static_cast<int>(h), member_index = static_cast<int>(m);
    }
  }
  const std::vector<int>& mine = hosts[host_index];
  const uint64_t leader_nonce = static_cast<uint64_t>(seen[2 * mine[0] + 1]);
  const std::string name = absl::StrCat("/mlfabric-allreduce-", absl::Hex(seen[2 * rank]), "-",
                                        absl::Hex(leader_nonce));
  const double join_s = std::max(options.client.connect_timeout_s, 30.0);
  auto group = LocalReduceGroup::Join(name, member_index, static_cast<int>(mine.size()), rank,
                                      join_s);
  if (!group.ok()) {
    return absl::Status(group.status().code(),
                        absl::StrCat("rank ", rank, ": ", group.status().message()));
  }
  std::unique_ptr<MlfabricAllReducer> across_hosts;
  if (hosts.size() > 1 && member_index == 0) {
    AllReduceOptions leaders = options;
    leaders.rank = host_index;
    leaders.size = static_cast<int>(hosts.size());
    leaders.root_rank = root_host;
    leaders.root_server = root + "-hosts";
    leaders.local_reduce = false;
    leaders.pieces = 1;  // one root for the leaders: across_hosts is a flat reducer
    leaders.client.name = absl::StrCat(
        options.client.name.empty() ? absl::StrCat("rank", rank) : options.client.name, "-host");
    auto made = MakeMlfabricAllReducer(leaders, host_index, static_cast<int>(hosts.size()));
    if (!made.ok()) {
      return absl::Status(made.status().code(),
                          absl::StrCat("rank ", rank, ", leading its host's ranks: ",
                                       made.status().message()));
    }
    // A flat reducer: local_reduce is off for the leaders' own rounds.
    across_hosts.reset(static_cast<MlfabricAllReducer*>(made->release()));
  }
  return std::unique_ptr<AllReducer>(new HierarchicalAllReducer(
      rank, size, options.timeout_s, static_cast<int>(hosts.size()), std::move(*group),
      std::move(across_hosts), std::move(flat)));
}

// One flat reducer: its root server (on rank options.root_rank) and this
// rank's worker, once the root answers.
absl::StatusOr<std::unique_ptr<MlfabricAllReducer>> MakeFlat(const AllReduceOptions& options,
                                                             int rank, int size,
                                                             const std::string& root) {
  std::unique_ptr<RootServer> root_server;
  if (rank == options.root_rank) {
    ClientOptions server_options = options.client;
    server_options.name = root;
    server_options.round_size = size;
    server_options.backup_workers = options.backup_workers;
    auto server = Server::Connect(server_options);
    if (!server.ok()) {
      return absl::Status(server.status().code(),
                          absl::StrCat("rank ", rank, " cannot start the AllReduce root '", root,
                                       "': ", server.status().message()));
    }
    root_server = std::make_unique<RootServer>(std::move(*server), size - options.backup_workers);
  }
  ClientOptions worker_options = options.client;
  if (worker_options.name.empty()) worker_options.name = absl::StrCat("rank", rank);
  auto worker = Worker::Connect(worker_options);
  if (!worker.ok()) {
    return absl::Status(worker.status().code(),
                        absl::StrCat("rank ", rank, " cannot connect to its MLfabric daemon: ",
                                     worker.status().message()));
  }
  auto reducer = std::make_unique<MlfabricAllReducer>(rank, size, options.backup_workers, root,
                                                      options.timeout_s, options.root_linger_s,
                                                      std::move(*worker), std::move(root_server));
  reducer->set_exchange_client(options.client, worker_options.name);
  if (auto status = reducer->AwaitRoot(options.client.connect_timeout_s); !status.ok()) {
    return status;
  }
  return reducer;
}

// AllReduceOptions::pieces, after MLFABRIC_ALLREDUCE_PIECES; 0 = size.
absl::StatusOr<int> PiecesWanted(const AllReduceOptions& options, int size) {
  int pieces = options.pieces;
  if (const char* env = std::getenv("MLFABRIC_ALLREDUCE_PIECES"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long value = std::strtol(env, &end, 10);
    if (*end != '\0' || value < 0 || value > 1024) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MLFABRIC_ALLREDUCE_PIECES='", env, "' is not a count of pieces in [0, 1024]"));
    }
    pieces = static_cast<int>(value);
  }
  if (pieces < 0 || pieces > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("pieces ", pieces, " must be in [0, 1024] (0: one per rank)"));
  }
  return pieces == 0 ? size : pieces;
}

}  // namespace

absl::Status ReduceScatterAgreedBySum(AllReducer& reducer, const void* data, int64_t rows,
                                      int64_t row_elements, DataType dtype, ReduceOp op,
                                      void* out) {
  return ReduceScatterBySums(reducer, data, rows, row_elements, dtype, op, out, nullptr,
                             /*agree=*/false);
}

namespace {

// `fabric` as one of the mlfabric backend's reducers, or Internal naming
// `what` (the MPI wrapper hands its fabric reducer in).
absl::StatusOr<SumsAllReducer*> Sums(AllReducer& fabric, const char* what) {
  auto* sums = dynamic_cast<SumsAllReducer*>(&fabric);
  if (sums == nullptr) {
    return absl::InternalError(
        absl::StrCat(what, " by pushes needs an mlfabric reducer, not ", fabric.backend()));
  }
  return sums;
}

}  // namespace

absl::Status AlltoallAgreedByPushes(AllReducer& fabric, const SumWords& sum, const void* send,
                                    int64_t row_elements, const std::vector<int64_t>& send_rows,
                                    DataType dtype, const AlltoallRecvBuffer& recv_buffer,
                                    std::vector<int64_t>* recv_rows) {
  absl::StatusOr<SumsAllReducer*> sums = Sums(fabric, "Alltoall");
  if (!sums.ok()) return sums.status();
  return (*sums)->AlltoallByPushes(sum, send, row_elements, send_rows, dtype, recv_buffer,
                                   recv_rows);
}

absl::Status AllgatherAgreedByPushes(AllReducer& fabric, const SumWords& sum, const void* send,
                                     int64_t rows, int64_t row_elements, DataType dtype,
                                     const AlltoallRecvBuffer& recv_buffer,
                                     std::vector<int64_t>* recv_rows) {
  absl::StatusOr<SumsAllReducer*> sums = Sums(fabric, "Allgather");
  if (!sums.ok()) return sums.status();
  return (*sums)->AllgatherByPushes(sum, send, rows, row_elements, dtype, recv_buffer, recv_rows);
}

absl::Status BroadcastAgreedByPushes(AllReducer& fabric, const SumWords& sum, void* data,
                                     size_t count, DataType dtype, int root) {
  absl::StatusOr<SumsAllReducer*> sums = Sums(fabric, "Broadcast");
  if (!sums.ok()) return sums.status();
  return (*sums)->BroadcastByPushes(sum, data, count, dtype, root);
}

absl::Status ReduceAgreedByPushes(AllReducer& fabric, const SumWords& sum, void* data,
                                  size_t count, DataType dtype, ReduceOp op) {
  absl::StatusOr<SumsAllReducer*> sums = Sums(fabric, "AllReduce");
  if (!sums.ok()) return sums.status();
  return (*sums)->ReduceByPushes(sum, data, count, dtype, op);
}

absl::Status ReduceScatterAgreedByPushes(AllReducer& fabric, const SumWords& sum,
                                         const void* data, int64_t rows, int64_t row_elements,
                                         DataType dtype, ReduceOp op, void* out) {
  absl::StatusOr<SumsAllReducer*> sums = Sums(fabric, "ReduceScatter");
  if (!sums.ok()) return sums.status();
  return (*sums)->ReduceScatterByPushes(sum, data, rows, row_elements, dtype, op, out);
}

absl::StatusOr<std::unique_ptr<AllReducer>> MakeMlfabricAllReducer(const AllReduceOptions& options,
                                                                  int rank, int size) {
  if (options.root_rank < 0 || options.root_rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("root_rank ", options.root_rank, " is not a rank (size ", size, ")"));
  }
  const auto pieces = PiecesWanted(options, size);
  if (!pieces.ok()) return pieces.status();
  const std::string root = options.root_server.empty()
                               ? absl::StrCat(options.client.job, "-allreduce-root")
                               : options.root_server;
  auto flat = MakeFlat(options, rank, size, root);
  if (!flat.ok()) return flat.status();
  std::unique_ptr<AllReducer> reducer;
  if (size > 1 && options.backup_workers == 0 && LocalReduceWanted(options)) {
    auto made = MakeHierarchical(options, rank, size, root, std::move(*flat));
    if (!made.ok()) return made.status();
    reducer = std::move(*made);
  } else {
    reducer = std::move(*flat);
  }
  auto* first = dynamic_cast<MlfabricAllReducer*>(reducer.get());
  if (*pieces <= 1 || size == 1 || first == nullptr) return reducer;  // one root, or hosts shared
  std::vector<std::unique_ptr<MlfabricAllReducer>> parts;
  reducer.release();
  parts.emplace_back(first);
  for (int k = 1; k < *pieces; ++k) {
    AllReduceOptions piece = options;
    piece.root_rank = (options.root_rank + k) % size;
    piece.client.name = absl::StrCat(
        options.client.name.empty() ? absl::StrCat("rank", rank) : options.client.name, "-p", k);
    auto made = MakeFlat(piece, rank, size, absl::StrCat(root, "-p", k));
    if (!made.ok()) return made.status();
    parts.push_back(std::move(*made));
  }
  return std::unique_ptr<AllReducer>(new PiecesAllReducer(rank, size, std::move(parts)));
}

}  // namespace internal
}  // namespace mlfabric
