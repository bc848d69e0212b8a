// Weighted-sum reduction kernels for aggregation (docs/architecture.md §5; the
// "Aggregator" of mercury.md §IV-C, which must sum "much faster than the
// NIC" so packet-level aggregation is never the bottleneck).
//
//   WeightedSum(dst, src, w, n):  dst[i] += w * src[i]   for i < n
//   Scale(dst, src, w, n):        dst[i]  = w * src[i]   (first contribution)
//
// for float and double. Each element is one IEEE multiply then one add,
// rounded separately (never fused: the library is built with
// -ffp-contract=off and the AVX2 variant has no FMA), so every ISA variant
// and every thread split gives bit-identical results -- an aggregate does
// not depend on which host or how many threads computed it. With weight 1
// the multiply is exact, so integer-valued inputs sum exactly while the
// sum stays below 2^24 (float) / 2^53 (double).
//
// The loops are written for the auto-vectoriser and compiled twice: for the
// baseline ISA (SSE2 on x86-64) and with `target("avx2")`; the AVX2 one is
// picked at run time with __builtin_cpu_supports. Pointers must be aligned
// to the element size, and dst and src must not overlap.
//
// Large buffers can be split across a ReduceThreadPool the caller owns:
//
//   ReduceThreadPool pool(/*num_workers=*/1);   // + the calling thread
//   ParallelWeightedSum(&pool, dst, src, 0.5f, n);
//
// Thread safety: the kernels are reentrant (no state). ReduceThreadPool is
// thread-safe: concurrent ParallelFor calls are serialised.
#ifndef MLFABRIC_AGGREGATOR_REDUCE_H_
#define MLFABRIC_AGGREGATOR_REDUCE_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"

namespace mlfabric::aggregator {

void WeightedSum(float* dst, const float* src, float weight, size_t n);
void WeightedSum(double* dst, const double* src, double weight, size_t n);
void Scale(float* dst, const float* src, float weight, size_t n);
void Scale(double* dst, const double* src, double weight, size_t n);

// Span forms: InvalidArgument (naming both lengths) if the sizes differ.
absl::Status WeightedSum(absl::Span<float> dst, absl::Span<const float> src,
                         float weight);
absl::Status WeightedSum(absl::Span<double> dst, absl::Span<const double> src,
                         double weight);

// The instruction set the kernels use on this CPU: "avx2" or "baseline".
const char* KernelIsa();

// A fixed set of worker threads for splitting one large reduction. The
// calling thread works too, so num_workers = cores - 1 uses every core.
class ReduceThreadPool {
 public:
  explicit ReduceThreadPool(int num_workers);
  ~ReduceThreadPool();  // joins the workers
  ReduceThreadPool(const ReduceThreadPool&) = delete;
  ReduceThreadPool& operator=(const ReduceThreadPool&) = delete;

  int num_workers() const { return static_cast<int>(threads_.size()); }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), each at
  // least `min_chunk` long (except possibly the last), on the workers and
  // the caller; returns when all calls returned. Runs inline when n <
  // 2 * min_chunk or there are no workers.
  void ParallelFor(size_t n, size_t min_chunk,
                   absl::FunctionRef<void(size_t, size_t)> fn);

 private:
  void WorkerLoop();
  void RunChunks();

  std::mutex call_mu_;  // serialises ParallelFor callers
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  int workers_left_ = 0;
  // The current job; valid while a ParallelFor call is in progress.
  const absl::FunctionRef<void(size_t, size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  size_t chunk_ = 0;
  size_t num_chunks_ = 0;
  size_t next_chunk_ = 0;  // guarded by mu_
  std::vector<std::thread> threads_;
};

// Each thread gets at least this many elements; below twice this the
// parallel forms run single-threaded. Waking a worker costs tens of
// microseconds, more than summing 1 MiB in cache (2 cores, see
// //aggregator:reduce_benchmark: splitting 1 MiB halved throughput).
inline constexpr size_t kMinParallelElements = size_t{1} << 19;

// Multi-threaded forms (pool may be null: single-threaded).
void ParallelWeightedSum(ReduceThreadPool* pool, float* dst, const float* src,
                         float weight, size_t n);
void ParallelWeightedSum(ReduceThreadPool* pool, double* dst,
                         const double* src, double weight, size_t n);

}  // namespace mlfabric::aggregator

#endif  // MLFABRIC_AGGREGATOR_REDUCE_H_
