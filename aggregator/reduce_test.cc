#include "aggregator/reduce.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <random>
#include <vector>

namespace mlfabric::aggregator {
namespace {

TEST_CASE("Kernels use the best ISA available") {
  std::string isa = KernelIsa();
  INFO("isa=" << isa);
  CHECK((isa == "avx2" || isa == "baseline"));
}

TEMPLATE_TEST_CASE("Integer-valued sums are exact for every length and alignment", "",
                   float, double) {
  for (size_t n : {0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 100, 1023, 4099}) {
    for (size_t skew : {0, 1, 3}) {
      std::vector<TestType> dst(n + skew), src(n + skew);
      for (size_t i = 0; i < n + skew; ++i) {
        dst[i] = static_cast<TestType>(i % 1000);
        src[i] = static_cast<TestType>((i * 7) % 513) - 256;
      }
      WeightedSum(dst.data() + skew, src.data() + skew, TestType(1), n);
      for (size_t i = 0; i < n + skew; ++i) {
        TestType expected = static_cast<TestType>(i % 1000);
        if (i >= skew) expected += static_cast<TestType>((i * 7) % 513) - 256;
        REQUIRE(dst[i] == expected);
      }
    }
  }
}

TEMPLATE_TEST_CASE("Weighted sums equal the scalar reference bit for bit", "", float,
                   double) {
  const uint32_t seed = 17;
  INFO("seed=" << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-10, 10);
  const size_t n = 10007;
  std::vector<TestType> dst(n), src(n), expected(n);
  for (size_t i = 0; i < n; ++i) {
    dst[i] = static_cast<TestType>(dist(rng));
    src[i] = static_cast<TestType>(dist(rng));
  }
  const TestType w = static_cast<TestType>(0.37);
  for (size_t i = 0; i < n; ++i) {
    volatile TestType product = w * src[i];  // force separate rounding
    expected[i] = dst[i] + product;
  }
  WeightedSum(dst.data(), src.data(), w, n);
  for (size_t i = 0; i < n; ++i) REQUIRE(dst[i] == expected[i]);
  // Weights that are powers of two keep integer values exact.
  std::vector<TestType> a(64, TestType(3)), b(64, TestType(8));
  WeightedSum(a.data(), b.data(), TestType(0.25), a.size());
  for (TestType v : a) REQUIRE(v == TestType(5));
  Scale(a.data(), b.data(), TestType(-0.5), a.size());
  for (TestType v : a) REQUIRE(v == TestType(-4));
}

TEST_CASE("Span form rejects length mismatches") {
  std::vector<float> a(4), b(5);
  absl::Status status = WeightedSum(absl::MakeSpan(a), absl::MakeConstSpan(b), 1.0f);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(status.message().find("4") != std::string::npos);
  CHECK(status.message().find("5") != std::string::npos);
  std::vector<double> c(3, 1.0), d(3, 2.0);
  REQUIRE(WeightedSum(absl::MakeSpan(c), absl::MakeConstSpan(d), 2.0).ok());
  CHECK(c == std::vector<double>{5, 5, 5});
}

TEST_CASE("ParallelFor covers [0, n) exactly once") {
  ReduceThreadPool pool(3);
  for (size_t n : {0, 1, 10, 999, 100000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, 7, [&](size_t begin, size_t end) {
      REQUIRE(begin < end);
      for (size_t i = begin; i < end; ++i) hits[i]++;
    });
    for (size_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
  }
}

TEST_CASE("Parallel weighted sum equals single-threaded, bit for bit") {
  ReduceThreadPool pool(2);
  const size_t n = 5 * kMinParallelElements + 123;
  std::vector<float> src(n), single(n), parallel(n);
  for (size_t i = 0; i < n; ++i) {
    src[i] = static_cast<float>(i % 977) * 0.001f;
    single[i] = parallel[i] = static_cast<float>(i % 31);
  }
  WeightedSum(single.data(), src.data(), 0.3f, n);
  ParallelWeightedSum(&pool, parallel.data(), src.data(), 0.3f, n);
  REQUIRE(single == parallel);
  std::vector<double> d_src(n, 2.0), d_dst(n, 1.0);
  ParallelWeightedSum(&pool, d_dst.data(), d_src.data(), 4.0, n);
  for (double v : d_dst) REQUIRE(v == 9.0);
  ParallelWeightedSum(nullptr, d_dst.data(), d_src.data(), 1.0, n);  // no pool
  for (double v : d_dst) REQUIRE(v == 11.0);
}

TEST_CASE("A pool with no workers runs inline; concurrent callers are serialised") {
  ReduceThreadPool none(0);
  int calls = 0;
  none.ParallelFor(100, 1, [&](size_t b, size_t e) {
    calls++;
    CHECK(e - b == 100);
  });
  CHECK(calls == 1);
  ReduceThreadPool pool(1);
  const size_t n = 4 * kMinParallelElements;
  std::vector<float> a(n, 0.0f), b(n, 0.0f), one(n, 1.0f);
  std::thread t([&] {
    for (int i = 0; i < 50; ++i) ParallelWeightedSum(&pool, a.data(), one.data(), 1.0f, n);
  });
  for (int i = 0; i < 50; ++i) ParallelWeightedSum(&pool, b.data(), one.data(), 1.0f, n);
  t.join();
  for (size_t i = 0; i < n; ++i) REQUIRE((a[i] == 50.0f && b[i] == 50.0f));
}

}  // namespace
}  // namespace mlfabric::aggregator
