// Logistic regression on a synthetic, seeded data set: the demo's model.
//
// Samples x ~ N(0, I) in `dim` dimensions and labels y ~ Bernoulli(sigmoid(
// w* . x + b*)) for a hidden w* drawn from the same seed, so every process
// that knows the seed can make its own shard without shipping data. Weights
// are float32, bias last, so a model is (dim + 1) floats on the wire.
#ifndef MLFABRIC_TOOLS_DEMO_LOGREG_H_
#define MLFABRIC_TOOLS_DEMO_LOGREG_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mlfabric::demo {

struct Dataset {
  int dim = 0;
  std::vector<float> x;  // rows of `dim`
  std::vector<float> y;  // 0 or 1
  size_t size() const { return y.size(); }
};

// `shard` selects an independent stream of samples from the same task.
Dataset MakeDataset(int dim, int samples, uint32_t task_seed, uint32_t shard);

struct Evaluation {
  double loss = 0;      // mean binary cross-entropy
  double accuracy = 0;  // fraction classified correctly
};

Evaluation Evaluate(const Dataset& data, const std::vector<float>& model);

// Mean gradient of the loss over rows [begin, begin + count) (wrapping).
std::vector<float> Gradient(const Dataset& data, const std::vector<float>& model, size_t begin,
                            size_t count);

}  // namespace mlfabric::demo

#endif  // MLFABRIC_TOOLS_DEMO_LOGREG_H_
