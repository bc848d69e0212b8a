// allreduce_check: run under mlfabric-run (tests/allreduce_mpirun_test.sh).
// Every rank checks that the mlfabric and mpi AllReduce backends (and nccl
// where a GPU makes it usable) return exactly what a direct MPI_Allreduce
// returns on integer-valued data of several dtypes and lengths, that
// Broadcast delivers rank 0's buffer, that int8/uint8/int16/uint16 under sum,
// min, max and product (and the older dtypes under min/max/product) equal
// the values computed here and MPI_Allreduce's, that bool is refused by
// AllReduce and broadcast exactly, that inputs (length, dtype, reduce op,
// broadcast root, and the tensor shape a call names in CallOptions) which
// differ across ranks are a FailedPrecondition on every rank naming both
// (no hang), that the mlfabric backend without MPI reduces every dtype
// under min/max/product exactly as MPI_Allreduce (across hosts by
// exchanges of blocks, on one host in shared memory), and that bad backend names and
// dtypes are errors naming the alternatives. Where nccl cannot run,
// MakeAllReducer must say why, and rank 0 prints
// "note: NCCL AllReduce not run: <why>" (only a missing GPU is a reason;
// a build or machine without the NCCL libraries is a missing prerequisite:
// "SKIPPED: ...", a failure under MLFABRIC_REQUIRE_PREREQS=1).
// Prints "allreduce_check rank R: OK" and per-backend timings on rank 0.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "api/allreduce.h"
#include "common/half.h"
#include "testing/prereq.h"

namespace {

int g_rank = 0;
int g_failures = 0;

#define EXPECT(cond, ...)                                          \
  do {                                                             \
    if (!(cond)) {                                                 \
      ++g_failures;                                                \
      std::fprintf(stderr, "rank %d: FAILED %s: ", g_rank, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                           \
      std::fprintf(stderr, "\n");                                  \
    }                                                              \
  } while (0)

template <typename T>
std::vector<T> Data(size_t count, int rank, int round) {
  std::mt19937 rng(1000 * rank + round);
  std::uniform_int_distribution<int> dist(-1000, 1000);
  std::vector<T> values(count);
  for (auto& v : values) v = static_cast<T>(dist(rng));
  return values;
}

template <typename T>
MPI_Datatype MpiTypeOf();
template <> MPI_Datatype MpiTypeOf<float>() { return MPI_FLOAT; }
template <> MPI_Datatype MpiTypeOf<double>() { return MPI_DOUBLE; }
template <> MPI_Datatype MpiTypeOf<int32_t>() { return MPI_INT32_T; }
template <> MPI_Datatype MpiTypeOf<int64_t>() { return MPI_INT64_T; }
template <> MPI_Datatype MpiTypeOf<int8_t>() { return MPI_INT8_T; }
template <> MPI_Datatype MpiTypeOf<uint8_t>() { return MPI_UINT8_T; }
template <> MPI_Datatype MpiTypeOf<int16_t>() { return MPI_INT16_T; }
template <> MPI_Datatype MpiTypeOf<uint16_t>() { return MPI_UINT16_T; }

MPI_Op MpiOpOf(mlfabric::ReduceOp op) {
  switch (op) {
    case mlfabric::ReduceOp::kSum: return MPI_SUM;
    case mlfabric::ReduceOp::kMin: return MPI_MIN;
    case mlfabric::ReduceOp::kMax: return MPI_MAX;
    case mlfabric::ReduceOp::kProduct: return MPI_PROD;
  }
  return MPI_SUM;
}

// op(a, b) as computed here: integers wrap modulo 2^width (two's
// complement, in uint64_t, so no signed overflow).
template <typename T>
T Apply(mlfabric::ReduceOp op, T a, T b) {
  using mlfabric::ReduceOp;
  if (op == ReduceOp::kMin) return std::min(a, b);
  if (op == ReduceOp::kMax) return std::max(a, b);
  if constexpr (std::is_integral_v<T>) {
    const uint64_t x = static_cast<uint64_t>(a), y = static_cast<uint64_t>(b);
    return static_cast<T>(op == ReduceOp::kProduct ? x * y : x + y);
  } else {
    return op == ReduceOp::kProduct ? a * b : a + b;
  }
}

// Every rank's Data<T>(count, r, round) reduced by `op`: computed in the
// test from every rank's (deterministic) input, and compared with both
// the backend's result and a direct MPI_Allreduce (Open MPI's wrap-around).
template <typename T>
void CheckOp(mlfabric::AllReducer& reducer, mlfabric::DataType dtype, mlfabric::ReduceOp op,
             size_t count, int round) {
  std::vector<T> mine = Data<T>(count, reducer.rank(), round);
  std::vector<T> expected = Data<T>(count, 0, round);
  for (int r = 1; r < reducer.size(); ++r) {
    const std::vector<T> theirs = Data<T>(count, r, round);
    for (size_t i = 0; i < count; ++i) expected[i] = Apply(op, expected[i], theirs[i]);
  }
  std::vector<T> by_mpi(count);
  MPI_Allreduce(mine.data(), by_mpi.data(), static_cast<int>(count), MpiTypeOf<T>(), MpiOpOf(op),
                MPI_COMM_WORLD);
  size_t at = 0;
  while (at < count && by_mpi[at] == expected[at]) ++at;
  // Open MPI 4.1's op/avx saturates 8- and 16-bit sums that overflow
  // (open-mpi/ompi#8045): the backends wrap, as C does, and are checked
  // against the values computed here only.
  const bool saturating_mpi = sizeof(T) <= 2 && std::is_integral_v<T> &&
                              op == mlfabric::ReduceOp::kSum;
  EXPECT(at == count || saturating_mpi,
         "MPI_Allreduce %s %s x %zu differs from the value computed here at [%zu]: %lld, "
         "expected %lld",
         mlfabric::ReduceOpName(op), mlfabric::DataTypeName(dtype), count, at,
         at < count ? static_cast<long long>(by_mpi[at]) : 0LL,
         at < count ? static_cast<long long>(expected[at]) : 0LL);
  absl::Status status = reducer.AllReduce(mine.data(), count, dtype, op);
  EXPECT(status.ok(), "%s %s %s x %zu: %s", reducer.backend(), mlfabric::ReduceOpName(op),
         mlfabric::DataTypeName(dtype), count, std::string(status.message()).c_str());
  EXPECT(mine == expected, "%s %s %s x %zu round %d: wrong result", reducer.backend(),
         mlfabric::ReduceOpName(op), mlfabric::DataTypeName(dtype), count, round);
}

// Every new dtype under every op, and the old ones under the new ops.
// Data values lie in [-1000, 1000], so 8-bit sums and every product wrap.
int CheckOps(mlfabric::AllReducer& reducer, int round) {
  using namespace mlfabric;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    CheckOp<int8_t>(reducer, DataType::kInt8, op, 1001, round++);
    CheckOp<uint8_t>(reducer, DataType::kUint8, op, 1001, round++);
    CheckOp<int16_t>(reducer, DataType::kInt16, op, 513, round++);
    CheckOp<uint16_t>(reducer, DataType::kUint16, op, 513, round++);
    CheckOp<int32_t>(reducer, DataType::kInt32, op, 257, round++);
    CheckOp<int64_t>(reducer, DataType::kInt64, op, 257, round++);
    CheckOp<double>(reducer, DataType::kFloat64, op, 257, round++);
  }
  CheckOp<float>(reducer, DataType::kFloat32, ReduceOp::kMax, 100003, round++);
  // bool is refused by AllReduce on this rank alone (no collective call).
  std::vector<uint8_t> flags(4, 1);
  absl::Status status = reducer.AllReduce(flags.data(), flags.size(), DataType::kBool);
  EXPECT(absl::IsInvalidArgument(status) && status.message().find("bool") != absl::string_view::npos,
         "%s bool AllReduce: %s", reducer.backend(), status.ToString().c_str());
  // ... but broadcast: rank 0's bytes.
  std::vector<uint8_t> b(33, 0);
  for (size_t i = 0; i < b.size(); ++i) b[i] = reducer.rank() == 0 ? (i % 3 == 0) : 0;
  status = reducer.Broadcast(b.data(), b.size(), DataType::kBool, 0);
  size_t wrong = 0;
  for (size_t i = 0; i < b.size(); ++i) wrong += b[i] != (i % 3 == 0 ? 1 : 0);
  EXPECT(status.ok() && wrong == 0, "%s bool broadcast: %s, %zu wrong", reducer.backend(),
         status.ToString().c_str(), wrong);
  return round;
}

// Ranks that pass different reduce ops or broadcast roots: FailedPrecondition
// on every rank, naming both values, and the collective still works after.
void CheckOpMismatch(mlfabric::AllReducer& reducer, int round) {
  using namespace mlfabric;
  std::vector<int32_t> v(16, 1);
  const ReduceOp op = reducer.rank() == reducer.size() - 1 ? ReduceOp::kMax : ReduceOp::kMin;
  absl::Status status = reducer.AllReduce(v.data(), v.size(), DataType::kInt32, op);
  EXPECT(absl::IsFailedPrecondition(status) &&
             status.message().find("Mismatched AllReduce reduce op") != absl::string_view::npos &&
             status.message().find("rank 0 passed min while rank") != absl::string_view::npos &&
             status.message().find("passed max") != absl::string_view::npos,
         "%s mismatched op: %s", reducer.backend(), status.ToString().c_str());
  std::vector<float> b(8, 1.0f);
  status = reducer.Broadcast(b.data(), b.size(), DataType::kFloat32,
                             reducer.rank() == reducer.size() - 1 ? 1 : 0);
  EXPECT(absl::IsFailedPrecondition(status) &&
             status.message().find("root rank") != absl::string_view::npos &&
             status.message().find("rank 0 passed root 0 while rank") != absl::string_view::npos,
         "%s mismatched broadcast root: %s", reducer.backend(), status.ToString().c_str());
  CheckOp<int32_t>(reducer, DataType::kInt32, ReduceOp::kMin, 64, round);
}

// Alltoall of every dtype with uneven blocks above the mlfabric backend's
// MPI threshold (64 KiB sent per rank), so that between hosts each block
// is a push to its destination's exchange server (api/push_exchange.h),
// under mpirun too: rank s sends 500 * (1 + (s + d) % 3) rows of 33
// elements to rank d, every byte naming its sender, destination and
// place, compared byte for byte.
void CheckLargeAlltoall(mlfabric::AllReducer& reducer) {
  using namespace mlfabric;
  const int size = reducer.size();
  const int64_t row_elements = 33;
  const auto rows_to = [](int from, int to) { return int64_t{500} * (1 + (from + to) % 3); };
  for (DataType dtype : {DataType::kInt8, DataType::kUint8, DataType::kInt16, DataType::kUint16,
                         DataType::kInt32, DataType::kInt64, DataType::kFloat16,
                         DataType::kFloat32, DataType::kFloat64, DataType::kBool}) {
    const size_t row_bytes = static_cast<size_t>(row_elements) * DataTypeSize(dtype);
    const auto byte = [dtype](int from, int to, size_t i) {
      const auto b = static_cast<uint8_t>((from * 31 + to * 7 + i * 13 + i / 251) & 0xff);
      return dtype == DataType::kBool ? static_cast<uint8_t>(b & 1) : b;
    };
    std::vector<int64_t> send_rows;
    std::vector<uint8_t> send;
    for (int d = 0; d < size; ++d) {
      send_rows.push_back(rows_to(g_rank, d));
      const size_t n = static_cast<size_t>(send_rows.back()) * row_bytes;
      for (size_t i = 0; i < n; ++i) send.push_back(byte(g_rank, d, i));
    }
    std::vector<uint8_t> recv;
    std::vector<int64_t> recv_rows;
    absl::Status status = reducer.Alltoall(
        send.data(), static_cast<int64_t>(send.size() / row_bytes), row_elements, send_rows, dtype,
        [&recv, row_bytes](const std::vector<int64_t>& rows) -> absl::StatusOr<void*> {
          int64_t total = 0;
          for (int64_t r : rows) total += r;
          recv.assign(static_cast<size_t>(total) * row_bytes, 0xee);
          return static_cast<void*>(recv.data());
        },
        &recv_rows);
    size_t wrong = 0, at = 0;
    for (int s = 0; s < size; ++s) {
      const size_t n = static_cast<size_t>(rows_to(s, g_rank)) * row_bytes;
      for (size_t i = 0; i < n && at + i < recv.size(); ++i) wrong += recv[at + i] != byte(s, g_rank, i);
      at += n;
    }
    EXPECT(status.ok() && at == recv.size() && wrong == 0 &&
               recv_rows.size() == static_cast<size_t>(size) && recv_rows[0] == rows_to(0, g_rank),
           "%s alltoall of %zu KB %s: %s, %zu wrong bytes", reducer.backend(), send.size() / 1000,
           DataTypeName(dtype), status.ToString().c_str(), wrong);
  }
  // Broadcast above the threshold from the last rank (between hosts: its
  // buffer pushed to every other rank's exchange server), float64 and bool.
  {
    std::vector<double> b(70001);
    for (size_t i = 0; i < b.size(); ++i) {
      b[i] = g_rank == size - 1 ? 0.5 * static_cast<double>(i) - 7.0 : -1.0;
    }
    absl::Status status = reducer.Broadcast(b.data(), b.size(), DataType::kFloat64, size - 1);
    size_t wrong = 0;
    for (size_t i = 0; i < b.size(); ++i) wrong += b[i] != 0.5 * static_cast<double>(i) - 7.0;
    EXPECT(status.ok() && wrong == 0, "%s broadcast of 560 KB from rank %d: %s, %zu wrong",
           reducer.backend(), size - 1, status.ToString().c_str(), wrong);
    std::vector<uint8_t> flags(70001);
    for (size_t i = 0; i < flags.size(); ++i) flags[i] = g_rank == size - 1 ? (i % 7 == 0) : 1;
    status = reducer.Broadcast(flags.data(), flags.size(), DataType::kBool, size - 1);
    wrong = 0;
    for (size_t i = 0; i < flags.size(); ++i) wrong += flags[i] != (i % 7 == 0 ? 1 : 0);
    EXPECT(status.ok() && wrong == 0, "%s bool broadcast of 70 KB: %s, %zu wrong",
           reducer.backend(), status.ToString().c_str(), wrong);
  }
  // The last rank has no receive buffer (its framework failed to allocate
  // one): it returns that error, every other rank fails naming it, none
  // waits; the next Alltoall works.
  std::vector<int64_t> send_rows(static_cast<size_t>(size), 2000);
  std::vector<float> send(static_cast<size_t>(size) * 2000 * 16, static_cast<float>(g_rank));
  std::vector<float> recv;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool refuse = attempt == 0 && g_rank == size - 1;
    absl::Status status = reducer.Alltoall(
        send.data(), static_cast<int64_t>(size) * 2000, 16, send_rows, DataType::kFloat32,
        [&](const std::vector<int64_t>& rows) -> absl::StatusOr<void*> {
          if (refuse) return absl::ResourceExhaustedError("no room for the rows, on purpose");
          recv.assign(static_cast<size_t>(rows.size()) * 2000 * 16, -1.0f);
          return static_cast<void*>(recv.data());
        },
        nullptr);
    if (attempt == 0) {
      const std::string named = absl::StrCat("rank ", size - 1);
      EXPECT(refuse ? absl::IsResourceExhausted(status)
                    : !status.ok() && status.message().find(named) != absl::string_view::npos,
             "%s alltoall, no receive buffer on the last rank: %s", reducer.backend(),
             status.ToString().c_str());
    } else {
      bool right = status.ok() && recv.size() == send.size();
      for (size_t i = 0; right && i < recv.size(); ++i) {
        right = recv[i] == static_cast<float>(i / (2000 * 16));
      }
      EXPECT(right, "%s alltoall after a failed one: %s", reducer.backend(),
             status.ToString().c_str());
    }
  }
}

// Allgather of every dtype, rank r passing 2100 * (r + 1) rows of 33
// elements but rank 1 none (above the backend's MPI threshold, so between
// hosts each rank's rows are pushes to every other rank's exchange
// server), byte for byte; then a row length that differs and a negative
// row count on one rank.
void CheckAllgather(mlfabric::AllReducer& reducer) {
  using namespace mlfabric;
  const int size = reducer.size();
  const int64_t row_elements = 33;
  const auto rows_of = [](int r) { return r == 1 ? int64_t{0} : int64_t{2100} * (r + 1); };
  for (DataType dtype : {DataType::kInt8, DataType::kUint8, DataType::kInt16, DataType::kUint16,
                         DataType::kInt32, DataType::kInt64, DataType::kFloat16,
                         DataType::kFloat32, DataType::kFloat64, DataType::kBool}) {
    const size_t row_bytes = static_cast<size_t>(row_elements) * DataTypeSize(dtype);
    const auto byte = [dtype](int from, size_t i) {
      const auto b = static_cast<uint8_t>((from * 29 + i * 11 + i / 509) & 0xff);
      return dtype == DataType::kBool ? static_cast<uint8_t>(b & 1) : b;
    };
    std::vector<uint8_t> send(static_cast<size_t>(rows_of(g_rank)) * row_bytes);
    for (size_t i = 0; i < send.size(); ++i) send[i] = byte(g_rank, i);
    std::vector<uint8_t> recv;
    std::vector<int64_t> recv_rows;
    absl::Status status = reducer.Allgather(
        send.data(), rows_of(g_rank), row_elements, dtype,
        [&recv, row_bytes](const std::vector<int64_t>& rows) -> absl::StatusOr<void*> {
          int64_t total = 0;
          for (int64_t r : rows) total += r;
          recv.assign(static_cast<size_t>(total) * row_bytes, 0xee);
          return static_cast<void*>(recv.data());
        },
        &recv_rows);
    size_t wrong = 0, at = 0;
    bool rows_right = recv_rows.size() == static_cast<size_t>(size);
    for (int s = 0; s < size; ++s) {
      const size_t n = static_cast<size_t>(rows_of(s)) * row_bytes;
      for (size_t i = 0; i < n && at + i < recv.size(); ++i) wrong += recv[at + i] != byte(s, i);
      at += n;
      rows_right = rows_right && recv_rows[static_cast<size_t>(s)] == rows_of(s);
    }
    EXPECT(status.ok() && at == recv.size() && wrong == 0 && rows_right,
           "%s allgather %s: %s, %zu wrong bytes", reducer.backend(), DataTypeName(dtype),
           status.ToString().c_str(), wrong);
  }
  std::vector<float> f(12, 1.0f);
  const auto any_buffer = [](const std::vector<int64_t>&) -> absl::StatusOr<void*> {
    static std::vector<float> room(1 << 12);
    return static_cast<void*>(room.data());
  };
  absl::Status status =
      reducer.Allgather(f.data(), 2, g_rank == 0 ? 6 : 4, DataType::kFloat32, any_buffer, nullptr);
  EXPECT(absl::IsFailedPrecondition(status) &&
             status.message().find("Mismatched Allgather") != absl::string_view::npos &&
             status.message().find("rank 0 passed 6 elements per row while rank 1 passed 4") !=
                 absl::string_view::npos,
         "%s allgather mismatch: %s", reducer.backend(), status.ToString().c_str());
  // The same row length in different row shapes ([1, 2, 6] on rank 0,
  // [1, 3, 4] elsewhere): every rank fails naming both; equal shapes gather.
  CallOptions call;
  call.shape = g_rank == 0 ? std::vector<int64_t>{1, 2, 6} : std::vector<int64_t>{1, 3, 4};
  status = reducer.Allgather(f.data(), 1, 12, DataType::kFloat32, any_buffer, nullptr, call);
  EXPECT(absl::IsFailedPrecondition(status) &&
             status.message().find("Mismatched Allgather tensor shapes: rank 0 passed shape "
                                   "[2, 6] while rank 1 passed shape [3, 4]") !=
                 absl::string_view::npos,
         "%s allgather row shape mismatch: %s", reducer.backend(), status.ToString().c_str());
  call.shape = std::vector<int64_t>{1, 3, 4};
  status = reducer.Allgather(f.data(), 1, 12, DataType::kFloat32, any_buffer, nullptr, call);
  EXPECT(status.ok(), "%s allgather, equal row shapes: %s", reducer.backend(),
         status.ToString().c_str());
  status = reducer.Allgather(f.data(), g_rank == size - 1 ? -1 : 2, 6, DataType::kFloat32,
                             any_buffer, nullptr);
  const std::string named = absl::StrCat("rank ", size - 1, " passed invalid arguments");
  EXPECT(g_rank == size - 1 ? absl::IsInvalidArgument(status)
                            : absl::IsFailedPrecondition(status) &&
                                  status.message().find(named) != absl::string_view::npos,
         "%s allgather, invalid on one rank: %s", reducer.backend(), status.ToString().c_str());
}

// Alltoall with uneven and zero counts (rank r sends (r + d) % 3 rows of 2
// int32 to rank d, row values naming sender, destination and index) and
// ReduceScatter (Horovod's split of an uneven first dimension) under sum,
// min and product, against values computed here; then mismatches.
void CheckAlltoallAndScatter(mlfabric::AllReducer& reducer) {
  using namespace mlfabric;
  const int size = reducer.size();
  const auto rows_to = [](int from, int to) { return int64_t{(from + to) % 3}; };
  const auto value = [](int from, int to, int64_t i, int col) {
    return static_cast<int32_t>(1000 * from + 100 * to + 10 * i + col);
  };
  std::vector<int64_t> send_rows;
  std::vector<int32_t> send;
  for (int d = 0; d < size; ++d) {
    send_rows.push_back(rows_to(g_rank, d));
    for (int64_t i = 0; i < send_rows.back(); ++i) {
      for (int col = 0; col < 2; ++col) send.push_back(value(g_rank, d, i, col));
    }
  }
  std::vector<int32_t> recv;
  std::vector<int64_t> recv_rows;
  absl::Status status = reducer.Alltoall(
      send.data(), static_cast<int64_t>(send.size() / 2), 2, send_rows, DataType::kInt32,
      [&recv](const std::vector<int64_t>& rows) -> absl::StatusOr<void*> {
        int64_t total = 0;
        for (int64_t r : rows) total += r;
        recv.resize(static_cast<size_t>(total * 2));
        return static_cast<void*>(recv.data());
      },
      &recv_rows);
  std::vector<int32_t> want;
  std::vector<int64_t> want_rows;
  for (int s = 0; s < size; ++s) {
    want_rows.push_back(rows_to(s, g_rank));
    for (int64_t i = 0; i < want_rows.back(); ++i) {
      for (int col = 0; col < 2; ++col) want.push_back(value(s, g_rank, i, col));
    }
  }
  EXPECT(status.ok() && recv == want && recv_rows == want_rows, "%s alltoall: %s",
         reducer.backend(), status.ToString().c_str());
  CheckLargeAlltoall(reducer);
  CheckAllgather(reducer);

  const int64_t rows = 2 * size + 1;  // uneven: rank 0 gets one extra row
  const std::vector<int64_t> split = ReduceScatterRows(rows, size);
  EXPECT(split[0] == 3 && split[static_cast<size_t>(size - 1)] == 2, "split %lld .. %lld",
         static_cast<long long>(split[0]), static_cast<long long>(split.back()));
  int64_t begin = 0;
  for (int r = 0; r < g_rank; ++r) begin += split[static_cast<size_t>(r)];
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kProduct}) {
    std::vector<int64_t> in(static_cast<size_t>(rows * 3));
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int64_t>(i) - 7 + g_rank;
    std::vector<int64_t> out(static_cast<size_t>(split[static_cast<size_t>(g_rank)] * 3), -1);
    status = reducer.ReduceScatter(in.data(), rows, 3, DataType::kInt64, op, out.data());
    bool right = status.ok();
    for (size_t j = 0; j < out.size() && right; ++j) {
      const int64_t i = begin * 3 + static_cast<int64_t>(j);
      int64_t expect = op == ReduceOp::kProduct ? 1 : op == ReduceOp::kMin ? std::numeric_limits<int64_t>::max() : 0;
      for (int r = 0; r < size; ++r) {
        const int64_t v = i - 7 + r;
        expect = op == ReduceOp::kSum ? expect + v : op == ReduceOp::kMin ? std::min(expect, v)
                                                                          : expect * v;
      }
      right = out[j] == expect;
    }
    EXPECT(right, "%s reducescatter %s: %s", reducer.backend(), ReduceOpName(op),
           status.ToString().c_str());
  }
  // A large sum: above the mlfabric backend's MPI threshold (64 KiB), so
  // under mpirun too it goes through the scheduler's rounds.
  const int64_t big_rows = 40000;  // x 2 int32: 320 KB
  const std::vector<int64_t> big_split = ReduceScatterRows(big_rows, size);
  int64_t big_begin = 0;
  for (int r = 0; r < g_rank; ++r) big_begin += big_split[static_cast<size_t>(r)];
  std::vector<int32_t> big(static_cast<size_t>(big_rows * 2));
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<int32_t>(i % 1000) + g_rank;
  // Under max too: between hosts each rank's rows pushed to the rank that
  // reduces them.
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    std::vector<int32_t> part(static_cast<size_t>(big_split[static_cast<size_t>(g_rank)] * 2), -1);
    status = reducer.ReduceScatter(big.data(), big_rows, 2, DataType::kInt32, op, part.data());
    bool big_right = status.ok();
    for (size_t j = 0; j < part.size() && big_right; ++j) {
      const auto at = static_cast<int32_t>((static_cast<size_t>(big_begin * 2) + j) % 1000);
      big_right = part[j] == (op == ReduceOp::kSum ? size * at + size * (size - 1) / 2
                                                   : at + size - 1);
    }
    EXPECT(big_right, "%s reducescatter %s of 320 KB: %s", reducer.backend(), ReduceOpName(op),
           status.ToString().c_str());
  }
  std::vector<float> f(static_cast<size_t>(g_rank == 0 ? 8 : 6), 1.0f), g(8);
  status = reducer.ReduceScatter(f.data(), static_cast<int64_t>(f.size() / 2), 2,
                                 DataType::kFloat32, ReduceOp::kSum, g.data());
  EXPECT(absl::IsFailedPrecondition(status) &&
             status.message().find("Mismatched ReduceScatter length") != absl::string_view::npos,
         "%s reducescatter mismatch: %s", reducer.backend(), status.ToString().c_str());
  // The same rows and elements in different shapes ([2, 6] on rank 0,
  // [2, 2, 3] elsewhere; Horovod's test_horovod_reducescatter_error): every
  // rank fails naming both. Then a shape that is not the call's rows x
  // row_elements on the last rank: its InvalidArgument, FailedPrecondition
  // naming it elsewhere.
  {
    std::vector<float> in(12, 1.0f), out(12);
    CallOptions call;
    call.shape = g_rank == 0 ? std::vector<int64_t>{2, 6} : std::vector<int64_t>{2, 2, 3};
    status = reducer.ReduceScatter(in.data(), 2, 6, DataType::kFloat32, ReduceOp::kSum,
                                   out.data(), call);
    EXPECT(absl::IsFailedPrecondition(status) &&
               status.message().find("Mismatched ReduceScatter tensor shapes: rank 0 passed "
                                     "shape [2, 6] while rank 1 passed shape [2, 2, 3]") !=
                   absl::string_view::npos,
           "%s reducescatter shape mismatch: %s", reducer.backend(), status.ToString().c_str());
    call.shape = g_rank == size - 1 ? std::vector<int64_t>{3, 4} : std::vector<int64_t>{2, 6};
    status = reducer.ReduceScatter(in.data(), 2, 6, DataType::kFloat32, ReduceOp::kSum,
                                   out.data(), call);
    const std::string refused = absl::StrCat("rank ", size - 1, " passed invalid arguments");
    EXPECT(g_rank == size - 1
               ? absl::IsInvalidArgument(status) &&
                     status.message().find("shape [3, 4] is not 2 rows of 6 elements") !=
                         absl::string_view::npos
               : absl::IsFailedPrecondition(status) &&
                     status.message().find(refused) != absl::string_view::npos,
           "%s reducescatter, shape invalid on one rank: %s", reducer.backend(),
           status.ToString().c_str());
    call.shape = std::vector<int64_t>{2, 3, 2};
    status = reducer.ReduceScatter(in.data(), 2, 6, DataType::kFloat32, ReduceOp::kSum,
                                   out.data(), call);
    const bool gets_rows = ReduceScatterRows(2, size)[static_cast<size_t>(g_rank)] > 0;
    EXPECT(status.ok() && (!gets_rows || out[0] == static_cast<float>(size)),
           "%s reducescatter, equal shapes: %s", reducer.backend(), status.ToString().c_str());
  }
  status = reducer.Alltoall(
      f.data(), 0, g_rank == 0 ? 3 : 4, std::vector<int64_t>(static_cast<size_t>(size), 0),
      DataType::kFloat32, [](const std::vector<int64_t>&) -> absl::StatusOr<void*> {
        return nullptr;
      },
      nullptr);
  EXPECT(absl::IsFailedPrecondition(status) &&
             status.message().find("rank 0 passed 3 elements per row while rank 1 passed 4") !=
                 absl::string_view::npos,
         "%s alltoall mismatch: %s", reducer.backend(), status.ToString().c_str());
  // Invalid arguments on one rank only (a negative split on the last
  // rank): that rank's own InvalidArgument, FailedPrecondition naming it on
  // the others, and no rank left waiting.
  std::vector<int64_t> splits(static_cast<size_t>(size), 0);
  if (g_rank == size - 1) splits[0] = -1, splits[1] = 1;
  status = reducer.Alltoall(
      f.data(), 0, 2, splits, DataType::kFloat32,
      [](const std::vector<int64_t>&) -> absl::StatusOr<void*> { return nullptr; }, nullptr);
  const std::string named = absl::StrCat("rank ", size - 1, " passed invalid arguments");
  EXPECT(g_rank == size - 1 ? absl::IsInvalidArgument(status) &&
                                  status.message().find("is negative") != absl::string_view::npos
                            : absl::IsFailedPrecondition(status) &&
                                  status.message().find(named) != absl::string_view::npos,
         "%s alltoall, invalid on one rank: %s", reducer.backend(), status.ToString().c_str());
  status = reducer.ReduceScatter(f.data(), g_rank == size - 1 ? -1 : 2, 2, DataType::kFloat32,
                                 ReduceOp::kSum, g.data());
  EXPECT(g_rank == size - 1 ? absl::IsInvalidArgument(status)
                            : absl::IsFailedPrecondition(status) &&
                                  status.message().find(named) != absl::string_view::npos,
         "%s reducescatter, invalid on one rank: %s", reducer.backend(),
         status.ToString().c_str());
}

// Tensor shapes in the mlfabric backend's own rounds (no MPI agreement):
// equal lengths in different shapes fail every rank with FailedPrecondition
// naming both shapes -- found by the root's scheduler, or by the shared
// memory of ranks on one host. The ranks of the lower half of the hosts
// pass [2, 6], the others [12] (all ranks on one host: half of them), so
// that ranks sharing a host (consecutive ranks) agree and their leaders'
// rounds differ at the root; then only the last rank differs, which its
// host's ranks (or the root) find. Equal shapes, and a rank naming none
// among them, sum exactly; the rounds go on.
void CheckShapesWithoutMpi(mlfabric::AllReducer& reducer, const char* what) {
  using namespace mlfabric;
  const int size = reducer.size();
  const int local = std::max(1, reducer.local_size());
  const int hosts = size / local;
  const int upper = hosts >= 2 ? hosts / 2 * local : size / 2;  // the first rank passing [12]
  std::vector<float> t(12, 1.0f);
  CallOptions call;
  call.shape = g_rank >= upper ? std::vector<int64_t>{12} : std::vector<int64_t>{2, 6};
  absl::Status status =
      reducer.AllReduce(t.data(), t.size(), DataType::kFloat32, ReduceOp::kSum, call);
  const auto names_both = [](const absl::Status& s) {
    const std::string m(s.message());
    return absl::IsFailedPrecondition(s) && m.find("[2, 6]") != std::string::npos &&
           m.find("[12]") != std::string::npos &&
           (m.find("differ across ranks") != std::string::npos ||
            m.find("Mismatched AllReduce tensor shapes") != std::string::npos);
  };
  EXPECT(names_both(status), "%s: [2, 6] against [12] without MPI: %s", what,
         status.ToString().c_str());
  call.shape = g_rank == size - 1 ? std::vector<int64_t>{12} : std::vector<int64_t>{2, 6};
  status = reducer.AllReduce(t.data(), t.size(), DataType::kFloat32, ReduceOp::kSum, call);
  EXPECT((absl::IsFailedPrecondition(status) &&
          status.message().find("differ across ranks") != absl::string_view::npos) ||
             names_both(status),
         "%s: the last rank's [12] against [2, 6] without MPI: %s", what,
         status.ToString().c_str());
  // Equal shapes sum exactly; rank 1 names none, which agrees with any.
  call.shape = std::vector<int64_t>{2, 6};
  std::vector<float> v(12);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i * (g_rank + 1));
  status = g_rank == 1 ? reducer.AllReduce(v.data(), v.size(), DataType::kFloat32)
                       : reducer.AllReduce(v.data(), v.size(), DataType::kFloat32,
                                           ReduceOp::kSum, call);
  size_t wrong = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    wrong += v[i] != static_cast<float>(i * size * (size + 1) / 2);
  }
  EXPECT(status.ok() && wrong == 0, "%s: equal shapes without MPI: %s, %zu wrong", what,
         status.ToString().c_str(), wrong);
}

void CheckOpsWithoutMpi(mlfabric::AllReduceOptions options, int size) {
  using namespace mlfabric;
  options.backend = "mlfabric";
  options.root_server = options.client.job + "-no-mpi-root";
  auto made = internal::MakeMlfabricAllReducer(options, g_rank, size);
  EXPECT(made.ok(), "mlfabric reducer without MPI: %s", made.status().ToString().c_str());
  if (!made.ok()) return;
  AllReducer& reducer = **made;
  // Every dtype under min, max and product, exactly as MPI_Allreduce (on
  // one host in shared memory, across hosts by exchanges of blocks), and
  // ranks that pass different ops fail naming both.
  int round = CheckOps(reducer, 500);
  absl::Status status;
  if (reducer.local_size() != size) {
    CheckOpMismatch(reducer, round);
  } else {
    // Shared memory compares the ops in its own words.
    std::vector<int32_t> w(16, 1);
    status = reducer.AllReduce(w.data(), w.size(), DataType::kInt32,
                               g_rank == size - 1 ? ReduceOp::kMax : ReduceOp::kMin);
    EXPECT(absl::IsFailedPrecondition(status) &&
               status.message().find("rank 0 passes 16 int32 (min)") != absl::string_view::npos &&
               status.message().find("16 int32 (max)") != absl::string_view::npos,
           "mismatched op in shared memory: %s", status.ToString().c_str());
  }
  std::vector<int16_t> v(100, static_cast<int16_t>(g_rank + 1));
  // Alltoall and ReduceScatter built from the rounds' sums (in place too),
  // exact, with the same agreement errors as through MPI.
  std::vector<float> out(100, 1.0f);
  status = reducer.ReduceScatter(out.data(), 100, 1, DataType::kFloat32, ReduceOp::kSum,
                                 out.data());
  const int64_t mine = ReduceScatterRows(100, size)[static_cast<size_t>(g_rank)];
  EXPECT(status.ok() && out[0] == static_cast<float>(size) &&
             out[static_cast<size_t>(mine - 1)] == static_cast<float>(size),
         "reducescatter in place without MPI: %s, %f", status.ToString().c_str(), out[0]);
  CheckAlltoallAndScatter(reducer);
  // Rank 0 asks for min, the others for sum: rank 0's agreement meets the
  // others' sum in one round, which fails on every rank; none hangs.
  status = reducer.AllReduce(v.data(), v.size(), DataType::kInt16,
                             g_rank == 0 ? ReduceOp::kMin : ReduceOp::kSum);
  EXPECT(absl::IsFailedPrecondition(status), "min against sum without MPI: %s",
         status.ToString().c_str());
  // A length that differs, found by the root's scheduler (or the host's
  // shared memory): FailedPrecondition on every rank.
  std::vector<int8_t> odd(g_rank == size - 1 ? 12 : 10, 1);
  status = reducer.AllReduce(odd.data(), odd.size(), DataType::kInt8);
  EXPECT(absl::IsFailedPrecondition(status) &&
             status.message().find("differ across ranks") != absl::string_view::npos,
         "mismatched length without MPI: %s", status.ToString().c_str());
  CheckShapesWithoutMpi(reducer, "one root");
  // The rounds go on, summing the new types.
  std::vector<uint8_t> u(5000, 200);
  status = reducer.AllReduce(u.data(), u.size(), DataType::kUint8);
  const uint8_t want = static_cast<uint8_t>(200 * size);
  EXPECT(status.ok() && u[0] == want && u[4999] == want, "uint8 sum without MPI: %s, %d",
         status.ToString().c_str(), u[0]);
  // A root per rank (pieces; ranks sharing a host keep one root): every
  // piece's round names the whole tensor's shape.
  options.pieces = 0;
  options.root_server = options.client.job + "-no-mpi-pieces";
  auto pieces = internal::MakeMlfabricAllReducer(options, g_rank, size);
  EXPECT(pieces.ok(), "mlfabric reducer in pieces without MPI: %s",
         pieces.status().ToString().c_str());
  if (pieces.ok()) {
    CheckShapesWithoutMpi(**pieces, "pieces");
    status = (*pieces)->AllReduce(u.data(), u.size(), DataType::kUint8);
    EXPECT(status.ok() && u[0] == static_cast<uint8_t>(want * size),
           "uint8 sum in pieces without MPI: %s, %d", status.ToString().c_str(), u[0]);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

template <typename T>
void CheckExact(mlfabric::AllReducer& reducer, mlfabric::DataType dtype, size_t count, int round) {
  std::vector<T> mine = Data<T>(count, reducer.rank(), round);
  std::vector<T> expected(count);
  MPI_Allreduce(mine.data(), expected.data(), static_cast<int>(count), MpiTypeOf<T>(), MPI_SUM,
                MPI_COMM_WORLD);
  absl::Status status = reducer.AllReduce(mine.data(), count, dtype);
  EXPECT(status.ok(), "%s %s x %zu: %s", reducer.backend(), mlfabric::DataTypeName(dtype), count,
         std::string(status.message()).c_str());
  EXPECT(std::memcmp(mine.data(), expected.data(), count * sizeof(T)) == 0,
         "%s %s x %zu round %d differs from MPI_Allreduce", reducer.backend(),
         mlfabric::DataTypeName(dtype), count, round);
}

// float16 (the fp16 AllReduce): integer values in [-250, 250], so every
// partial sum of up to 8 ranks is an integer below 2048 and exact in half,
// whatever order a backend adds in. The expected sum is computed from every
// rank's (deterministic) data.
void CheckHalf(mlfabric::AllReducer& reducer, size_t count, int round) {
  auto values = [&](int rank) {
    std::mt19937 rng(1000 * rank + round);
    std::uniform_int_distribution<int> dist(-250, 250);
    std::vector<float> v(count);
    for (auto& x : v) x = static_cast<float>(dist(rng));
    return v;
  };
  std::vector<float> expected(count, 0.0f);
  for (int r = 0; r < reducer.size(); ++r) {
    const std::vector<float> theirs = values(r);
    for (size_t i = 0; i < count; ++i) expected[i] += theirs[i];
  }
  const std::vector<float> mine_f = values(reducer.rank());
  std::vector<uint16_t> mine(count);
  for (size_t i = 0; i < count; ++i) mine[i] = mlfabric::FloatToHalf(mine_f[i]);
  absl::Status status = reducer.AllReduce(mine.data(), count, mlfabric::DataType::kFloat16);
  EXPECT(status.ok(), "%s float16 x %zu: %s", reducer.backend(), count,
         std::string(status.message()).c_str());
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += mlfabric::HalfToFloat(mine[i]) != expected[i];
  EXPECT(wrong == 0, "%s float16 x %zu round %d: %zu of %zu sums differ from the exact sum",
         reducer.backend(), count, round, wrong, count);
}

// AllReduce with the tensor's shape (CallOptions): equal shapes sum; equal
// element counts in different shapes ([2, 6] against [12], [] against
// [1]) fail every rank with FailedPrecondition naming the ranks and both
// shapes; a shape that does not hold the call's count fails this rank
// with InvalidArgument and the others naming it; a call without a shape
// agrees with any. Then the collective still sums.
void CheckShapes(mlfabric::AllReducer& reducer, int round) {
  using namespace mlfabric;
  const bool last = reducer.rank() == reducer.size() - 1;
  std::vector<float> v(12, 1.0f);
  CallOptions call;
  call.shape = std::vector<int64_t>{2, 6};
  absl::Status status = reducer.AllReduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum,
                                          call);
  EXPECT(status.ok() && v[11] == static_cast<float>(reducer.size()), "%s equal shapes: %s",
         reducer.backend(), status.ToString().c_str());
  call.shape = last ? std::vector<int64_t>{12} : std::vector<int64_t>{2, 6};
  status = reducer.AllReduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, call);
  const std::string want = absl::StrCat("Mismatched AllReduce tensor shapes: rank 0 passed shape "
                                        "[2, 6] while rank ", reducer.size() - 1,
                                        " passed shape [12]");
  EXPECT(absl::IsFailedPrecondition(status) &&
             status.message().find(want) != absl::string_view::npos,
         "%s mismatched shapes: %s", reducer.backend(), status.ToString().c_str());
  float one = 1.0f;
  call.shape = last ? std::vector<int64_t>{1} : std::vector<int64_t>{};
  status = reducer.AllReduce(&one, 1, DataType::kFloat32, ReduceOp::kMax, call);
  EXPECT(absl::IsFailedPrecondition(status) &&
             status.message().find("rank 0 passed shape [] while rank") !=
                 absl::string_view::npos,
         "%s scalar against [1]: %s", reducer.backend(), status.ToString().c_str());
  call.shape = last ? std::vector<int64_t>{3, 5} : std::vector<int64_t>{3, 4};
  status = reducer.AllReduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, call);
  if (last) {
    EXPECT(absl::IsInvalidArgument(status) &&
               status.message().find("shape [3, 5] holds 15 elements but the call passes 12") !=
                   absl::string_view::npos,
           "%s shape not holding the count: %s", reducer.backend(), status.ToString().c_str());
  } else {
    EXPECT(absl::IsFailedPrecondition(status) &&
               status.message().find("passed invalid arguments") != absl::string_view::npos,
           "%s another rank's invalid shape: %s", reducer.backend(), status.ToString().c_str());
  }
  call.shape = std::vector<int64_t>{12};
  status = last ? reducer.AllReduce(v.data(), v.size(), DataType::kFloat32)
                : reducer.AllReduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, call);
  EXPECT(status.ok(), "%s a call without shape against [12]: %s", reducer.backend(),
         status.ToString().c_str());
  CheckExact<float>(reducer, DataType::kFloat32, 64, round);
}

// Backup workers (mlfabric backend, one backup): the last rank starts each
// phase only after rank 0 tells it (MPI) that the others are done, so it is
// late every round by construction, not by timing. Phase 1: 3 rounds; every
// rank, the late one included, gets the others' sum. Phase 2: the others
// run 6 rounds first, so the late rank is more than --rounds_kept (4)
// rounds behind for its first two: those fail as gone, the rest succeed.
// `pieces`: AllReduceOptions::pieces (0: a root per rank, each late piece
// left out on its own).
void CheckBackupWorkers(mlfabric::AllReduceOptions options, int pieces) {
  using namespace mlfabric;
  options.backend = "mlfabric";
  options.root_server = options.client.job + (pieces == 1 ? "-backup-root" : "-backup-pieces");
  options.backup_workers = 1;
  options.pieces = pieces;
  auto made = MakeAllReducer(options);
  EXPECT(made.ok(), "backup reducer: %s", made.status().ToString().c_str());
  if (!made.ok()) return;
  AllReducer& reducer = **made;
  const int size = reducer.size(), late = size - 1;
  EXPECT(reducer.summed() == size - 1, "summed() %d with one backup of %d", reducer.summed(),
         size);
  // A broadcast built from such a sum could leave the root out: every rank
  // is refused, before any data moves, and its buffer is untouched.
  std::vector<float> broadcast(8, static_cast<float>(g_rank + 1));
  absl::Status refused = reducer.Broadcast(broadcast.data(), broadcast.size(),
                                           DataType::kFloat32, 0);
  EXPECT(absl::IsUnimplemented(refused) &&
             refused.message().find("Broadcast needs every rank's part") !=
                 absl::string_view::npos &&
             broadcast[7] == static_cast<float>(g_rank + 1),
         "Broadcast with a backup worker: %s", refused.ToString().c_str());
  float others = 0;
  for (int r = 0; r < late; ++r) others += std::pow(10.0f, static_cast<float>(r));
  auto signal_late = [&] {
    int token = 1;
    if (g_rank == 0) MPI_Send(&token, 1, MPI_INT, late, 7, MPI_COMM_WORLD);
    if (g_rank == late) MPI_Recv(&token, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  };
  // Phase 1.
  if (g_rank == late) signal_late();
  for (int round = 0; round < 3; ++round) {
    std::vector<float> v(100, std::pow(10.0f, static_cast<float>(g_rank)) * (round + 1));
    absl::Status status = reducer.AllReduce(v.data(), v.size(), DataType::kFloat32);
    EXPECT(status.ok() && v[0] == others * (round + 1) && v[99] == v[0],
           "backup round %d: %s, sum %g, expected %g (every rank but the late one)", round,
           status.ToString().c_str(), v[0], others * (round + 1));
  }
  if (g_rank == late) {
    EXPECT(reducer.left_out() == 3, "the late rank's left_out() %lld after 3 late rounds",
           static_cast<long long>(reducer.left_out()));
  }
  if (g_rank == 0) signal_late();
  MPI_Barrier(MPI_COMM_WORLD);
  // Phase 2.
  if (g_rank == late) signal_late();
  for (int round = 0; round < 6; ++round) {
    std::vector<float> v(100, 1.0f);
    absl::Status status = reducer.AllReduce(v.data(), v.size(), DataType::kFloat32);
    if (g_rank == late && round < 2) {
      EXPECT(!status.ok() && status.message().find("is gone") != absl::string_view::npos,
             "a rank 5 rounds behind: %s", status.ToString().c_str());
    } else {
      EXPECT(status.ok() && v[0] == static_cast<float>(size - 1),
             "backup phase 2 round %d: %s, sum %g", round, status.ToString().c_str(), v[0]);
    }
  }
  if (g_rank == 0) signal_late();
  MPI_Barrier(MPI_COMM_WORLD);
  // Phase 3: the others' last round, then rank 0 (the root) shuts its
  // reducer down; the late rank's last round comes only after that, and
  // still gets the sum while the root lingers (AllReduceOptions::
  // root_linger_s).
  if (g_rank != late) {
    std::vector<float> v(100, 1.0f);
    absl::Status status = reducer.AllReduce(v.data(), v.size(), DataType::kFloat32);
    EXPECT(status.ok() && v[0] == static_cast<float>(size - 1), "backup last round: %s, sum %g",
           status.ToString().c_str(), v[0]);
  }
  if (g_rank == 0) {
    signal_late();
    made->reset();  // returns once the root has lingered
  }
  if (g_rank == late) {
    signal_late();
    std::vector<float> v(100, 1.0f);
    absl::Status status = reducer.AllReduce(v.data(), v.size(), DataType::kFloat32);
    EXPECT(status.ok() && v[0] == static_cast<float>(size - 1),
           "the late rank's last round after the root finished: %s, sum %g",
           status.ToString().c_str(), v[0]);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The sums every backend must get exactly right, whatever it is built on:
// float32 of several lengths (twice each), float64, int32, int64, float16,
// an empty buffer, and Broadcast from rank 0. Returns the next round number.
int CheckSums(mlfabric::AllReducer& reducer) {
  using namespace mlfabric;
  int round = 0;
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{100003}}) {
    CheckExact<float>(reducer, DataType::kFloat32, count, round++);
    CheckExact<float>(reducer, DataType::kFloat32, count, round++);
  }
  CheckExact<double>(reducer, DataType::kFloat64, 513, round++);
  CheckExact<int32_t>(reducer, DataType::kInt32, 513, round++);
  CheckExact<int64_t>(reducer, DataType::kInt64, 513, round++);
  CheckHalf(reducer, 5000, round++);
  CheckExact<float>(reducer, DataType::kFloat32, 0, round++);

  std::vector<float> b = Data<float>(300, reducer.rank(), 77);
  const std::vector<float> root = Data<float>(300, 0, 77);
  absl::Status status = reducer.Broadcast(b.data(), b.size(), DataType::kFloat32, 0);
  EXPECT(status.ok() && b == root, "%s broadcast: %s", reducer.backend(),
         std::string(status.message()).c_str());
  return round;
}

// The nccl backend. Where every rank can use it, its sums are checked like
// the other backends' (CheckSums). Where it cannot run, MakeAllReducer must
// refuse, naming why and the backends to use instead. The ranks agree on
// whether NCCL is usable before any makes an nccl reducer: making one is a
// collective (the NCCL id is broadcast over MPI), so a rank that made one
// alone would wait for the others forever.
void CheckNccl(mlfabric::AllReduceOptions options) {
  using namespace mlfabric;
  std::string why_not;
  const int usable_here = internal::NcclUsable(&why_not) ? 1 : 0;
  int usable_everywhere = 0, usable_somewhere = 0;
  MPI_Allreduce(&usable_here, &usable_everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&usable_here, &usable_somewhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT(usable_everywhere == usable_somewhere, "NCCL is usable on some ranks only (here: %s)",
         usable_here ? "usable" : why_not.c_str());
  const std::vector<std::string> available = AvailableAllReduceBackends();
  const bool listed =
      std::find(available.begin(), available.end(), "nccl") != available.end();
  EXPECT(listed == (usable_here == 1), "AvailableAllReduceBackends() %s nccl, NcclUsable says %s",
         listed ? "lists" : "does not list", usable_here ? "usable" : why_not.c_str());
  options.backend = "nccl";
  if (usable_everywhere) {
    auto nccl = MakeAllReducer(options);
    EXPECT(nccl.ok(), "nccl backend on a machine where NCCL is usable: %s",
           nccl.status().ToString().c_str());
    if (!nccl.ok()) return;
    EXPECT(std::string((*nccl)->backend()) == "nccl", "backend() %s", (*nccl)->backend());
    EXPECT((*nccl)->rank() == g_rank, "nccl rank %d", (*nccl)->rank());
    CheckSums(**nccl);
    if (g_rank == 0) std::printf("nccl backend: AllReduce sums checked\n");
    return;
  }
  if (usable_here) return;  // the others cannot join: reported above
  auto nccl = MakeAllReducer(options);
  EXPECT(!nccl.ok() && nccl.status().message().find(why_not) != absl::string_view::npos &&
             nccl.status().message().find("\"mlfabric\" or \"mpi\"") != absl::string_view::npos,
         "nccl where it cannot run (%s): %s", why_not.c_str(), nccl.status().ToString().c_str());
  // Only a missing GPU is a reason not to run NCCL's AllReduce: a build
  // without nccl.h or a machine without libnccl/libcudart lacks what
  // tools/bootstrap installs, which CI treats as a defect (testing/prereq.h).
  const bool no_gpu = why_not.find("no GPU") != std::string::npos;
  if (!no_gpu && testing::PrerequisitesRequired()) {
    EXPECT(no_gpu, "missing prerequisite (required under CI, MLFABRIC_REQUIRE_PREREQS=1): "
                   "NCCL AllReduce cannot run: %s", why_not.c_str());
  }
  if (g_rank == 0) {
    std::printf("%s %s\n", no_gpu ? "note: NCCL AllReduce not run:" : "SKIPPED: NCCL AllReduce:",
                why_not.c_str());
  }
}

double TimeAllReduce(mlfabric::AllReducer& reducer, size_t count, int repeats) {
  std::vector<float> values(count, 1.0f);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) (void)reducer.AllReduce(values.data(), count, mlfabric::DataType::kFloat32);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return 1000.0 * s / repeats;
}

}  // namespace

int main() {
  using namespace mlfabric;
  AllReduceOptions options;
  options.backend = "mpi";
  auto mpi = MakeAllReducer(options);
  if (!mpi.ok()) {
    std::fprintf(stderr, "mpi backend: %s\n", std::string(mpi.status().message()).c_str());
    return 1;
  }
  g_rank = (*mpi)->rank();
  const int size = (*mpi)->size();
  // A rank that returns an error from main while the others wait in a
  // collective for it ends the job (api/allreduce_mpi.cc, FinalizeOrAbort)
  // instead of hanging it in MPI_Finalize.
  if (const char* fail = std::getenv("ALLREDUCE_CHECK_FAIL_RANK")) {
    if (g_rank == std::atoi(fail)) {
      std::fprintf(stderr, "allreduce_check rank %d: returns 3 on purpose\n", g_rank);
      return 3;
    }
    std::vector<float> x(8, 1.0f);
    absl::Status status = (*mpi)->AllReduce(x.data(), x.size(), DataType::kFloat32);
    std::printf("allreduce_check rank %d: passed a collective the failed rank never joined (%s)\n",
                g_rank, status.ToString().c_str());
    return 1;
  }
  options.backend = "mlfabric";
  if (const char* job = std::getenv("MLFABRIC_JOB")) options.client.job = job;
  if (const char* token = std::getenv("MLFABRIC_JOB_TOKEN")) options.client.job_token = token;
  options.timeout_s = 60;
  // Every call through the scheduler's rounds (the checks below are of
  // that path); `small_via_mpi` below is the default, small calls by MPI.
  options.mpi_below_bytes = 0;
  auto fabric = MakeAllReducer(options);
  if (!fabric.ok()) {
    std::fprintf(stderr, "rank %d: mlfabric backend: %s\n", g_rank,
                 std::string(fabric.status().message()).c_str());
    return 1;
  }
  EXPECT((*fabric)->rank() == g_rank && (*fabric)->size() == size, "rank/size from the launcher");
  // Ranks given the same daemon (mlfabric-run --ranks_per_host K, or the
  // slots of one host in a hostfile) share a host, and the mlfabric
  // backend sums among them in shared memory.
  {
    const char* socket = std::getenv("MLFABRIC_DAEMON_SOCKET");
    const uint64_t mine = std::hash<std::string>()(socket != nullptr ? socket : "");
    std::vector<uint64_t> all(size);
    MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
    const int expected_local = static_cast<int>(std::count(all.begin(), all.end(), mine));
    EXPECT((*fabric)->local_size() == expected_local, "local_size %d, expected %d",
           (*fabric)->local_size(), expected_local);
  }

  // One root per rank (AllReduceOptions::pieces = 0): each call summed as
  // `size` pieces by `size` roots at once. Ranks sharing a host keep one
  // root for their leaders (then this is the hierarchical reducer again).
  options.pieces = 0;
  options.root_server = options.client.job + "-pieces-root";
  auto pieces = MakeAllReducer(options);
  options.pieces = 1;
  options.root_server.clear();
  if (!pieces.ok()) {
    std::fprintf(stderr, "rank %d: mlfabric backend in pieces: %s\n", g_rank,
                 std::string(pieces.status().message()).c_str());
    return 1;
  }
  // The default under mpirun: calls below 64 KiB through MPI_Allreduce, the
  // rest through the scheduler (its own root), one agreement first.
  options.mpi_below_bytes = AllReduceOptions().mpi_below_bytes;
  options.root_server = options.client.job + "-hybrid-root";
  auto small_via_mpi = MakeAllReducer(options);
  options.mpi_below_bytes = 0;
  options.root_server.clear();
  if (!small_via_mpi.ok()) {
    std::fprintf(stderr, "rank %d: mlfabric backend with small calls by MPI: %s\n", g_rank,
                 std::string(small_via_mpi.status().message()).c_str());
    return 1;
  }

  for (AllReducer* reducer :
       {mpi->get(), fabric->get(), pieces->get(), small_via_mpi->get()}) {
    int round = CheckSums(*reducer);

    // Inputs that differ across ranks: an error on every rank, no hang.
    std::vector<float> odd(g_rank == size - 1 ? 11 : 10, 1.0f);
    absl::Status status = reducer->AllReduce(odd.data(), odd.size(), DataType::kFloat32);
    EXPECT(absl::IsFailedPrecondition(status) &&
               status.message().find("differ across ranks") != absl::string_view::npos,
           "%s mismatched length: %s", reducer->backend(), status.ToString().c_str());
    // Fewer elements than pieces, and differing: a rank's empty piece
    // meets another's element there (no rank waits for a skipped round).
    std::vector<float> few(g_rank == size - 1 ? 2 : 3, 1.0f);
    status = reducer->AllReduce(few.data(), few.size(), DataType::kFloat32);
    EXPECT(absl::IsFailedPrecondition(status) &&
               status.message().find("differ across ranks") != absl::string_view::npos,
           "%s mismatched short length: %s", reducer->backend(), status.ToString().c_str());
    // One rank's buffer large, the others' small: with small calls by MPI
    // the two sizes would take different paths; all ranks agree first.
    std::vector<float> uneven(g_rank == size - 1 ? 100000 : 10, 1.0f);
    status = reducer->AllReduce(uneven.data(), uneven.size(), DataType::kFloat32);
    EXPECT(absl::IsFailedPrecondition(status) &&
               status.message().find("differ across ranks") != absl::string_view::npos,
           "%s mismatched large and small length: %s", reducer->backend(),
           status.ToString().c_str());
    std::vector<double> as_double(10, 1.0);
    void* mixed = g_rank == 0 ? static_cast<void*>(as_double.data()) : odd.data();
    status = reducer->AllReduce(mixed, 10, g_rank == 0 ? DataType::kFloat64 : DataType::kFloat32);
    EXPECT(absl::IsFailedPrecondition(status) &&
               status.message().find("rank 0 passed float64 while rank 1 passed float32") !=
                   absl::string_view::npos,
           "%s mismatched dtype: %s", reducer->backend(), status.ToString().c_str());
    // And the collective still works afterwards.
    CheckExact<float>(*reducer, DataType::kFloat32, 64, round++);
    round = CheckOps(*reducer, round);
    CheckOpMismatch(*reducer, round++);
    CheckShapes(*reducer, round++);
    CheckAlltoallAndScatter(*reducer);
  }

  auto bad = ParseDataType("bfloat16");
  EXPECT(!bad.ok() && bad.status().message().find("float32") != absl::string_view::npos,
         "bfloat16: %s", bad.status().ToString().c_str());
  CheckOpsWithoutMpi(options, size);
  CheckBackupWorkers(options, 1);
  CheckBackupWorkers(options, 0);
  options.backend = "mpi";
  options.backup_workers = 1;
  auto mpi_backup = MakeAllReducer(options);
  EXPECT(!mpi_backup.ok() && mpi_backup.status().message().find("mlfabric backend") !=
                                 absl::string_view::npos,
         "backup workers on mpi: %s", mpi_backup.status().ToString().c_str());
  options.backup_workers = 0;
  options.backend = "gloo";
  auto unknown = MakeAllReducer(options);
  EXPECT(!unknown.ok() && unknown.status().message().find("mlfabric, mpi, nccl") !=
                              absl::string_view::npos,
         "unknown backend: %s", unknown.status().ToString().c_str());
  // Not among the backends above: nccl's AllReduce does not yet check that
  // the ranks agree on dtype and length, so the mismatch cases would hang it.
  CheckNccl(options);

  for (size_t count : {size_t{1024}, size_t{1} << 20}) {
    const int repeats = count > 100000 ? 10 : 50;
    const double mpi_ms = TimeAllReduce(**mpi, count, repeats);
    const double fabric_ms = TimeAllReduce(**fabric, count, repeats);
    const double pieces_ms = TimeAllReduce(**pieces, count, repeats);
    const double hybrid_ms = TimeAllReduce(**small_via_mpi, count, repeats);
    if (g_rank == 0) {
      std::printf("timing: %d ranks, %zu float32: mpi %.3f ms, mlfabric %.3f ms, "
                  "mlfabric in pieces %.3f ms, mlfabric with small calls by MPI %.3f ms "
                  "per AllReduce\n",
                  size, count, mpi_ms, fabric_ms, pieces_ms, hybrid_ms);
    }
  }
  int failures = g_failures, total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  fabric->reset();
  pieces->reset();
  small_via_mpi->reset();
  if (total == 0) std::printf("allreduce_check rank %d: OK\n", g_rank);
  std::fflush(stdout);
  return total == 0 ? 0 : 1;
}
