// allreduce_benchmark: one collective of one backend, one length, many
// repeats, run under mlfabric-run (which starts the scheduler and daemons):
//
//   bazel-bin/tools/run/mlfabric-run -np 4 bazel-bin/api/allreduce_benchmark
//       --backend=mlfabric --count=1048576 --repeats=50
//   (one command line; --ranks_per_host 4 puts the ranks on one host,
//   where the mlfabric backend sums in shared memory)
//
// --collective=allreduce (default) | allgather | broadcast | alltoall |
// reducescatter: Horovod's collectives. --op=sum (default) | min | max:
// AllReduce's and ReduceScatter's reduce op (the mlfabric backend sums in
// its daemons' rounds, and reduces min and max between hosts by exchanges
// of blocks; a float product depends on the order and is not offered
// here). --count is the float32 elements
// each rank holds: its AllReduce buffer, its part of the Allgather, the
// Broadcast buffer, its Alltoall send buffer (rows of one element, split
// over the ranks as ReduceScatterRows splits them), its ReduceScatter
// input. Broadcast's root is rank 0.
//
// Rank 0 prints milliseconds per call (mean, min and max over repeats)
// after --warmup untimed calls. A call's time is its slowest rank's: under
// mpirun every rank leaves an MPI_Barrier before it starts the call, and
// the ranks' times are reduced with MPI_MAX afterwards (as the OSU
// benchmarks time a collective), and no rank checks a result before every
// rank has left the call, so neither one rank's early return nor another's
// check counts in a call. Every call's result
// is compared element by element with what it must be (integer-valued
// floats, exact in any order); a difference fails the rank naming the call
// and the element.
// Meant for profiling one backend at a time (perf record -a while it
// runs); bench/collectives_one_host.sh and bench/allreduce_hosts.sh
// alternate the backends.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "api/allreduce.h"
#include "mpi.h"

namespace {

long FlagValue(int argc, char** argv, const char* name, long fallback) {
  const size_t n = std::strlen(name);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') return std::atol(argv[i] + n + 1);
  }
  return fallback;
}

std::string FlagString(int argc, char** argv, const char* name, const char* fallback) {
  const size_t n = std::strlen(name);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') return argv[i] + n + 1;
  }
  return fallback;
}

// Element i of rank r's input: integers, so that every sum is exact, and
// each rank's and position's own, so that a misplaced block shows.
float Input(int rank, size_t i) { return static_cast<float>((rank + 1) * (i % 1024 + 1)); }

// Element i of the sum (max, min) of Input over `size` ranks.
float SumOfInputs(int size, size_t i) {
  return static_cast<float>(size * (size + 1) / 2 * (i % 1024 + 1));
}
float ReducedInputs(mlfabric::ReduceOp op, int size, size_t i) {
  if (op == mlfabric::ReduceOp::kMax) return Input(size - 1, i);
  if (op == mlfabric::ReduceOp::kMin) return Input(0, i);
  return SumOfInputs(size, i);
}

// One collective: `prepare` (untimed) refills the buffers, `call` runs it,
// and element i of `*result` must then be `expected(i)`.
struct Collective {
  const char* name = nullptr;  // as the output line names it
  std::function<void()> prepare;
  std::function<absl::Status()> call;
  const std::vector<float>* result = nullptr;
  std::function<float(size_t)> expected;
};

// --collective's values.
constexpr const char* kCollectives[] = {"allreduce", "allgather", "broadcast", "alltoall",
                                        "reducescatter"};

// The collective `name` (one of kCollectives) on `count` float32 per rank,
// over `in` and `out`.
Collective MakeCollective(const std::string& name, mlfabric::ReduceOp op,
                          mlfabric::AllReducer& reducer, size_t count, std::vector<float>& in,
                          std::vector<float>& out) {
  using mlfabric::DataType;
  const int rank = reducer.rank(), size = reducer.size();
  // Alltoall's and ReduceScatter's rows per rank, and this rank's first.
  const std::vector<int64_t> split = mlfabric::ReduceScatterRows(static_cast<int64_t>(count), size);
  const size_t mine = static_cast<size_t>(split[static_cast<size_t>(rank)]);
  size_t before = 0;
  for (int r = 0; r < rank; ++r) before += static_cast<size_t>(split[static_cast<size_t>(r)]);
  Collective c;
  if (name == "allreduce") {
    c.name = "AllReduce";
    in.resize(count);
    c.prepare = [&in, rank] { for (size_t i = 0; i < in.size(); ++i) in[i] = Input(rank, i); };
    c.call = [&reducer, &in, op] {
      return reducer.AllReduce(in.data(), in.size(), DataType::kFloat32, op);
    };
    c.result = &in;
    c.expected = [op, size](size_t i) { return ReducedInputs(op, size, i); };
  } else if (name == "allgather") {
    c.name = "Allgather";
    in.resize(count);
    for (size_t i = 0; i < count; ++i) in[i] = Input(rank, i);
    out.resize(count * static_cast<size_t>(size));
    c.prepare = [&out] { std::fill(out.begin(), out.end(), -1.0f); };
    c.call = [&reducer, &in, &out] {
      return reducer.Allgather(
          in.data(), static_cast<int64_t>(in.size()), 1, DataType::kFloat32,
          [&out](const std::vector<int64_t>& rows) -> absl::StatusOr<void*> {
            int64_t total = 0;
            for (int64_t r : rows) total += r;
            if (total != static_cast<int64_t>(out.size())) {
              return absl::InternalError("Allgather: " + std::to_string(total) +
                                         " rows to receive, expected " +
                                         std::to_string(out.size()));
            }
            return static_cast<void*>(out.data());
          },
          nullptr);
    };
    c.result = &out;
    c.expected = [count](size_t i) { return Input(static_cast<int>(i / count), i % count); };
  } else if (name == "broadcast") {
    c.name = "Broadcast";
    in.resize(count);
    c.prepare = [&in, rank] {
      for (size_t i = 0; i < in.size(); ++i) in[i] = rank == 0 ? Input(0, i) : -1.0f;
    };
    c.call = [&reducer, &in] {
      return reducer.Broadcast(in.data(), in.size(), DataType::kFloat32, /*root=*/0);
    };
    c.result = &in;
    c.expected = [](size_t i) { return Input(0, i); };
  } else if (name == "alltoall") {
    c.name = "Alltoall";
    in.resize(count);
    for (size_t i = 0; i < count; ++i) in[i] = Input(rank, i);
    out.resize(mine * static_cast<size_t>(size));
    c.prepare = [&out] { std::fill(out.begin(), out.end(), -1.0f); };
    c.call = [&reducer, &in, &out, split] {
      return reducer.Alltoall(
          in.data(), static_cast<int64_t>(in.size()), 1, split, DataType::kFloat32,
          [&out](const std::vector<int64_t>& rows) -> absl::StatusOr<void*> {
            int64_t total = 0;
            for (int64_t r : rows) total += r;
            if (total != static_cast<int64_t>(out.size())) {
              return absl::InternalError("Alltoall: " + std::to_string(total) +
                                         " rows to receive, expected " +
                                         std::to_string(out.size()));
            }
            return static_cast<void*>(out.data());
          },
          /*recv_rows=*/nullptr);
    };
    c.result = &out;
    // Rank s's rows for this rank: its rows [before, before + mine).
    c.expected = [before, mine](size_t i) {
      return Input(static_cast<int>(i / mine), before + i % mine);
    };
  } else if (name == "reducescatter") {
    c.name = "ReduceScatter";
    in.resize(count);
    for (size_t i = 0; i < count; ++i) in[i] = Input(rank, i);
    out.resize(mine);
    c.prepare = [&out] { std::fill(out.begin(), out.end(), -1.0f); };
    c.call = [&reducer, &in, &out, op] {
      return reducer.ReduceScatter(in.data(), static_cast<int64_t>(in.size()), 1,
                                   DataType::kFloat32, op, out.data());
    };
    c.result = &out;
    c.expected = [op, size, before](size_t i) { return ReducedInputs(op, size, before + i); };
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mlfabric;
  AllReduceOptions options;
  options.backend = FlagString(argc, argv, "--backend", "mlfabric");
  if (const char* job = std::getenv("MLFABRIC_JOB")) options.client.job = job;
  if (const char* token = std::getenv("MLFABRIC_JOB_TOKEN")) options.client.job_token = token;
  const std::string collective = FlagString(argc, argv, "--collective", "allreduce");
  const size_t count = static_cast<size_t>(FlagValue(argc, argv, "--count", 1 << 20));
  const int repeats = static_cast<int>(FlagValue(argc, argv, "--repeats", 20));
  const int warmup = static_cast<int>(FlagValue(argc, argv, "--warmup", 3));
  if (std::find(std::begin(kCollectives), std::end(kCollectives), collective) ==
      std::end(kCollectives)) {
    std::fprintf(stderr, "allreduce_benchmark: unknown --collective=%s: use allreduce, "
                 "allgather, broadcast, alltoall or reducescatter\n", collective.c_str());
    return 1;
  }
  const std::string op_name = FlagString(argc, argv, "--op", "sum");
  const absl::StatusOr<ReduceOp> op = ParseReduceOp(op_name);
  if (!op.ok() || *op == ReduceOp::kProduct) {
    std::fprintf(stderr, "allreduce_benchmark: unknown --op=%s: use sum, min or max\n",
                 op_name.c_str());
    return 1;
  }
  auto reducer = MakeAllReducer(options);
  if (!reducer.ok()) {
    std::fprintf(stderr, "allreduce_benchmark: %s\n", reducer.status().ToString().c_str());
    return 1;
  }
  const int rank = (*reducer)->rank();
  std::vector<float> in, out;
  Collective c = MakeCollective(collective, *op, **reducer, count, in, out);
  std::vector<double> ms;
  // Under mpirun the reducer has initialised MPI (its ranks agree on each
  // call through it); a run without mpirun has one rank and no barrier.
  int mpi_ready = 0;
  MPI_Initialized(&mpi_ready);
  const bool synchronise = mpi_ready != 0 && (*reducer)->size() > 1;
  std::vector<float> want;  // every call's expected result, computed once
  for (int i = 0; i < warmup + repeats; ++i) {
    c.prepare();
    if (synchronise) MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = c.call();
    const double elapsed =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!status.ok()) {
      std::fprintf(stderr, "allreduce_benchmark: rank %d call %d: %s: %s\n", rank, i, c.name,
                   status.ToString().c_str());
      return 1;
    }
    // No rank checks while another is still in the call: the check is not
    // the collective's, and on shared cores it would slow the call down.
    if (synchronise) MPI_Barrier(MPI_COMM_WORLD);
    const std::vector<float>& result = *c.result;
    if (want.size() != result.size()) {
      want.resize(result.size());
      for (size_t e = 0; e < want.size(); ++e) want[e] = c.expected(e);
    }
    if (!want.empty() && std::memcmp(result.data(), want.data(), want.size() * sizeof(float)) != 0) {
      size_t e = 0;
      while (result[e] == want[e]) ++e;
      std::fprintf(stderr, "allreduce_benchmark: rank %d call %d: %s: element %zu of %zu is "
                   "%g, expected %g\n", rank, i, c.name, e, result.size(), result[e], want[e]);
      return 1;
    }
    if (i >= warmup) ms.push_back(elapsed);
  }
  if (synchronise && !ms.empty()) {
    std::vector<double> slowest(ms.size());
    MPI_Reduce(ms.data(), slowest.data(), static_cast<int>(ms.size()), MPI_DOUBLE, MPI_MAX, 0,
               MPI_COMM_WORLD);
    ms = std::move(slowest);
  }
  if (rank == 0 && !ms.empty()) {
    double total = 0;
    for (double m : ms) total += m;
    const bool reduces = collective == "allreduce" || collective == "reducescatter";
    std::printf("allreduce_benchmark: %s, %d ranks, %zu float32: %.3f ms per %s%s%s "
                "(min %.3f, max %.3f, %d repeats)\n",
                (*reducer)->backend(), (*reducer)->size(), count, total / ms.size(), c.name,
                reduces && *op != ReduceOp::kSum ? " " : "",
                reduces && *op != ReduceOp::kSum ? ReduceOpName(*op) : "",
                *std::min_element(ms.begin(), ms.end()), *std::max_element(ms.begin(), ms.end()),
                repeats);
  }
  reducer->reset();
  return 0;
}
