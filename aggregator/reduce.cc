#include "aggregator/reduce.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mlfabric::aggregator {
namespace {

// Plain loops the vectoriser turns into packed mul + add. One body, two
// compilations (baseline and AVX2).
#define MLFABRIC_REDUCE_KERNELS(SUFFIX, ATTR)                                  \
  template <typename T>                                                        \
  ATTR void WeightedSum##SUFFIX(T* __restrict dst, const T* __restrict src,    \
                                T weight, size_t n) {                          \
    for (size_t i = 0; i < n; ++i) dst[i] += weight * src[i];                  \
  }                                                                            \
  template <typename T>                                                        \
  ATTR void Scale##SUFFIX(T* __restrict dst, const T* __restrict src,          \
                          T weight, size_t n) {                                \
    for (size_t i = 0; i < n; ++i) dst[i] = weight * src[i];                   \
  }

MLFABRIC_REDUCE_KERNELS(Baseline, )
#if defined(__x86_64__)
MLFABRIC_REDUCE_KERNELS(Avx2, __attribute__((target("avx2"))))
#endif
#undef MLFABRIC_REDUCE_KERNELS

bool HasAvx2() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

template <typename T>
void WeightedSumImpl(T* dst, const T* src, T weight, size_t n) {
#if defined(__x86_64__)
  if (HasAvx2()) return WeightedSumAvx2(dst, src, weight, n);
#endif
  WeightedSumBaseline(dst, src, weight, n);
}

template <typename T>
void ScaleImpl(T* dst, const T* src, T weight, size_t n) {
#if defined(__x86_64__)
  if (HasAvx2()) return ScaleAvx2(dst, src, weight, n);
#endif
  ScaleBaseline(dst, src, weight, n);
}

template <typename T>
absl::Status CheckedWeightedSum(absl::Span<T> dst, absl::Span<const T> src,
                                T weight) {
  if (dst.size() != src.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weighted sum length mismatch: dst has ", dst.size(),
                     " elements, src has ", src.size()));
  }
  WeightedSumImpl(dst.data(), src.data(), weight, dst.size());
  return absl::OkStatus();
}

template <typename T>
void ParallelWeightedSumImpl(ReduceThreadPool* pool, T* dst, const T* src,
                             T weight, size_t n) {
  if (pool == nullptr || n < 2 * kMinParallelElements) {
    WeightedSumImpl(dst, src, weight, n);
    return;
  }
  pool->ParallelFor(n, kMinParallelElements, [&](size_t begin, size_t end) {
    WeightedSumImpl(dst + begin, src + begin, weight, end - begin);
  });
}

}  // namespace

void WeightedSum(float* dst, const float* src, float weight, size_t n) {
  WeightedSumImpl(dst, src, weight, n);
}
void WeightedSum(double* dst, const double* src, double weight, size_t n) {
  WeightedSumImpl(dst, src, weight, n);
}
void Scale(float* dst, const float* src, float weight, size_t n) {
  ScaleImpl(dst, src, weight, n);
}
void Scale(double* dst, const double* src, double weight, size_t n) {
  ScaleImpl(dst, src, weight, n);
}
absl::Status WeightedSum(absl::Span<float> dst, absl::Span<const float> src,
                         float weight) {
  return CheckedWeightedSum(dst, src, weight);
}
absl::Status WeightedSum(absl::Span<double> dst, absl::Span<const double> src,
                         double weight) {
  return CheckedWeightedSum(dst, src, weight);
}

const char* KernelIsa() { return HasAvx2() ? "avx2" : "baseline"; }

void ParallelWeightedSum(ReduceThreadPool* pool, float* dst, const float* src,
                         float weight, size_t n) {
  ParallelWeightedSumImpl(pool, dst, src, weight, n);
}
void ParallelWeightedSum(ReduceThreadPool* pool, double* dst,
                         const double* src, double weight, size_t n) {
  ParallelWeightedSumImpl(pool, dst, src, weight, n);
}

ReduceThreadPool::ReduceThreadPool(int num_workers) {
  threads_.reserve(std::max(num_workers, 0));
  for (int i = 0; i < num_workers; ++i) {
    threads_.emplace_back([this] { WorkerLoop(); });
  }
}

ReduceThreadPool::~ReduceThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ReduceThreadPool::RunChunks() {
  for (;;) {
    size_t chunk;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_chunk_ >= num_chunks_) return;
      chunk = next_chunk_++;
    }
    const size_t begin = chunk * chunk_;
    (*fn_)(begin, std::min(n_, begin + chunk_));
  }
}

void ReduceThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunChunks();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--workers_left_ == 0) done_cv_.notify_one();
    }
  }
}

void ReduceThreadPool::ParallelFor(size_t n, size_t min_chunk,
                                   absl::FunctionRef<void(size_t, size_t)> fn) {
  min_chunk = std::max<size_t>(min_chunk, 1);
  if (threads_.empty() || n < 2 * min_chunk) {
    if (n > 0) fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  const size_t parties = threads_.size() + 1;
  // One chunk per party (memory-bound work splits evenly), but no chunk
  // below min_chunk.
  const size_t chunk = std::max(min_chunk, (n + parties - 1) / parties);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    num_chunks_ = (n + chunk - 1) / chunk;
    next_chunk_ = 0;
    workers_left_ = static_cast<int>(threads_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  RunChunks();
  std::unique_lock<std::mutex> lock(mu_);
  // Every worker checks in, so none still holds fn_ when we return.
  done_cv_.wait(lock, [&] { return workers_left_ == 0; });
  fn_ = nullptr;
}

}  // namespace mlfabric::aggregator
