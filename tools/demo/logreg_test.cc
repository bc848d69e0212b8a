#include "tools/demo/logreg.h"

#include <catch2/catch.hpp>
#include <cmath>

namespace mlfabric::demo {
namespace {

TEST_CASE("Datasets are reproducible per seed and shard") {
  auto a = MakeDataset(8, 100, 42, 1);
  auto b = MakeDataset(8, 100, 42, 1);
  auto c = MakeDataset(8, 100, 42, 2);
  CHECK(a.x == b.x);
  CHECK(a.y == b.y);
  CHECK(a.x != c.x);
}

TEST_CASE("Gradient descent on the synthetic task lowers the loss") {
  auto data = MakeDataset(16, 4000, 7, 1);
  std::vector<float> model(17, 0.0f);
  const double initial = Evaluate(data, model).loss;
  CHECK(initial == Approx(std::log(2.0)).epsilon(1e-6));
  for (int step = 0; step < 200; ++step) {
    auto grad = Gradient(data, model, step * 64, 64);
    for (size_t j = 0; j < model.size(); ++j) model[j] -= 0.5f * grad[j];
  }
  const Evaluation after = Evaluate(data, model);
  CHECK(after.loss < initial - 0.1);
  CHECK(after.accuracy > 0.7);
}

}  // namespace
}  // namespace mlfabric::demo
