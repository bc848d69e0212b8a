#include "tools/demo/logreg.h"

#include <cmath>
#include <random>

namespace mlfabric::demo {
namespace {

double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

double Score(const float* row, const std::vector<float>& model, int dim) {
  double z = model[dim];
  for (int j = 0; j < dim; ++j) z += double(row[j]) * model[j];
  return z;
}

}  // namespace

Dataset MakeDataset(int dim, int samples, uint32_t task_seed, uint32_t shard) {
  std::mt19937 task(task_seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> truth(dim + 1);
  for (float& w : truth) w = normal(task) * 3.0f / std::sqrt(static_cast<float>(dim));
  std::mt19937 rng(task_seed * 7919u + shard * 104729u + 1u);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  Dataset data;
  data.dim = dim;
  data.x.resize(static_cast<size_t>(samples) * dim);
  data.y.resize(samples);
  for (int i = 0; i < samples; ++i) {
    float* row = &data.x[static_cast<size_t>(i) * dim];
    for (int j = 0; j < dim; ++j) row[j] = normal(rng);
    data.y[i] = coin(rng) < Sigmoid(Score(row, truth, dim)) ? 1.0f : 0.0f;
  }
  return data;
}

Evaluation Evaluate(const Dataset& data, const std::vector<float>& model) {
  Evaluation result;
  for (size_t i = 0; i < data.size(); ++i) {
    const double p = Sigmoid(Score(&data.x[i * data.dim], model, data.dim));
    const double eps = 1e-12;
    result.loss -= data.y[i] > 0.5f ? std::log(p + eps) : std::log(1 - p + eps);
    result.accuracy += (p > 0.5) == (data.y[i] > 0.5f);
  }
  result.loss /= static_cast<double>(data.size());
  result.accuracy /= static_cast<double>(data.size());
  return result;
}

std::vector<float> Gradient(const Dataset& data, const std::vector<float>& model, size_t begin,
                            size_t count) {
  std::vector<double> grad(data.dim + 1, 0.0);
  for (size_t k = 0; k < count; ++k) {
    const size_t i = (begin + k) % data.size();
    const float* row = &data.x[i * data.dim];
    const double error = Sigmoid(Score(row, model, data.dim)) - data.y[i];
    for (int j = 0; j < data.dim; ++j) grad[j] += error * row[j];
    grad[data.dim] += error;
  }
  std::vector<float> out(grad.size());
  for (size_t j = 0; j < grad.size(); ++j) out[j] = static_cast<float>(grad[j] / count);
  return out;
}

}  // namespace mlfabric::demo
