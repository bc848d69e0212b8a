// The real learning problem behind "time to accuracy": softmax regression on
// a seeded synthetic Gaussian-mixture classification task.
//
// The simulated cluster moves ResNet-50-sized updates and spends ResNet-50
// compute times, but every update also carries a real gradient of this small
// model computed from the model version its worker last received, and the
// server really applies them (async: in commit order, each scaled by lr / N;
// sync: the mean, scaled by lr). So staleness, drops and aggregation act on
// convergence as they would, and the simulated time at which the test
// accuracy first reaches the target is measured, not assumed.
//
//   SgdTask task(config.sgd, config.seed);
//   Weights w = task.InitialWeights();
//   Weights g = task.Gradient(w, /*worker=*/3, /*draw=*/17);
//   task.Apply(g, -0.1, &w);
//   double accuracy = task.TestAccuracy(w);
//
// Data are drawn on demand: gradient `draw` of `worker` uses a fresh seeded
// mini-batch from the generative distribution (an endless data set, so no
// shard bookkeeping at 1000 workers). Thread safety: const methods only.
#ifndef MLFABRIC_EVAL_SIM_SGD_TASK_H_
#define MLFABRIC_EVAL_SIM_SGD_TASK_H_

#include <cstdint>
#include <vector>

#include "eval/sim/sim_config.h"

namespace mlfabric::sim {

using Weights = std::vector<double>;  // classes x (features + 1), row-major

class SgdTask {
 public:
  SgdTask(const SgdConfig& config, uint64_t seed);

  Weights InitialWeights() const;
  // Mean cross-entropy gradient over one mini-batch of `config.batch` samples.
  Weights Gradient(const Weights& w, int worker, int64_t draw) const;
  // *w += scale * g.
  static void Apply(const Weights& g, double scale, Weights* w);
  double TestAccuracy(const Weights& w) const;

 private:
  // One sample: features (with a trailing 1 for the bias) and its label.
  int Sample(uint64_t key, double* x) const;
  void Logits(const Weights& w, const double* x, double* logits) const;

  SgdConfig config_;
  uint64_t seed_;
  int width_;                  // features + 1
  std::vector<double> means_;  // classes x features
  std::vector<double> scales_; // per feature
  std::vector<double> test_x_;
  std::vector<int> test_y_;
};

}  // namespace mlfabric::sim

#endif  // MLFABRIC_EVAL_SIM_SGD_TASK_H_
