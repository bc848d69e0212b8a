#include "eval/sim/sgd_task.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace mlfabric::sim {
namespace {

// Standard normal from two seeded uniforms (Box-Muller): portable, unlike
// std::normal_distribution whose output is implementation-defined.
double Gaussian(uint64_t key, uint64_t i) {
  const double u1 = std::max(UnitFromBits(MixSeed(key, i, 1)), 1e-300);
  const double u2 = UnitFromBits(MixSeed(key, i, 2));
  return std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
}

}  // namespace

SgdTask::SgdTask(const SgdConfig& config, uint64_t seed)
    : config_(config), seed_(seed), width_(config.features + 1) {
  means_.resize(static_cast<size_t>(config.classes) * config.features);
  const uint64_t mean_key = MixSeed(seed, 0x6d65616e73ULL);
  for (size_t i = 0; i < means_.size(); ++i) {
    means_[i] = config.class_separation * Gaussian(mean_key, i);
  }
  // Log-spaced feature scales from 1/sqrt(c) to sqrt(c): an ill-conditioned
  // problem, so SGD needs many steps (the class-mean direction alone, which
  // one step from zero finds, is far from optimal).
  scales_.resize(config.features);
  for (int j = 0; j < config.features; ++j) {
    const double f = config.features > 1 ? static_cast<double>(j) / (config.features - 1) : 0.5;
    scales_[j] = std::pow(config.conditioning, f - 0.5);
  }
  test_x_.resize(static_cast<size_t>(config.test_samples) * width_);
  test_y_.resize(config.test_samples);
  for (int i = 0; i < config.test_samples; ++i) {
    test_y_[i] = Sample(MixSeed(seed, 0x74657374ULL, i), &test_x_[static_cast<size_t>(i) * width_]);
  }
}

int SgdTask::Sample(uint64_t key, double* x) const {
  const int label = static_cast<int>(MixSeed(key, 0) % static_cast<uint64_t>(config_.classes));
  for (int j = 0; j < config_.features; ++j) {
    x[j] = scales_[j] *
           (means_[static_cast<size_t>(label) * config_.features + j] + Gaussian(key, 10 + j));
  }
  x[config_.features] = 1.0;
  return label;
}

Weights SgdTask::InitialWeights() const {
  return Weights(static_cast<size_t>(config_.classes) * width_, 0.0);
}

void SgdTask::Logits(const Weights& w, const double* x, double* logits) const {
  for (int k = 0; k < config_.classes; ++k) {
    const double* row = &w[static_cast<size_t>(k) * width_];
    double z = 0;
    for (int j = 0; j < width_; ++j) z += row[j] * x[j];
    logits[k] = z;
  }
}

Weights SgdTask::Gradient(const Weights& w, int worker, int64_t draw) const {
  Weights g(w.size(), 0.0);
  std::vector<double> x(width_), p(config_.classes);
  const uint64_t batch_key = MixSeed(seed_, 0x747261696eULL, static_cast<uint64_t>(worker),
                                     static_cast<uint64_t>(draw));
  for (int b = 0; b < config_.batch; ++b) {
    const int label = Sample(MixSeed(batch_key, b), x.data());
    Logits(w, x.data(), p.data());
    const double top = *std::max_element(p.begin(), p.end());
    double total = 0;
    for (double& v : p) total += (v = std::exp(v - top));
    for (int k = 0; k < config_.classes; ++k) {
      const double coeff = (p[k] / total - (k == label ? 1.0 : 0.0)) / config_.batch;
      double* row = &g[static_cast<size_t>(k) * width_];
      for (int j = 0; j < width_; ++j) row[j] += coeff * x[j];
    }
  }
  return g;
}

void SgdTask::Apply(const Weights& g, double scale, Weights* w) {
  for (size_t i = 0; i < w->size(); ++i) (*w)[i] += scale * g[i];
}

double SgdTask::TestAccuracy(const Weights& w) const {
  std::vector<double> logits(config_.classes);
  int correct = 0;
  for (int i = 0; i < config_.test_samples; ++i) {
    Logits(w, &test_x_[static_cast<size_t>(i) * width_], logits.data());
    const int guess =
        static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (guess == test_y_[i]) ++correct;
  }
  return static_cast<double>(correct) / config_.test_samples;
}

}  // namespace mlfabric::sim
