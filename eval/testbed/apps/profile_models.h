// Tensor profiles of real networks for the emulated-testbed experiments
// (workload (b)): per-layer parameter counts of VGG-16, ResNet-50
// and ResNet-32 (CIFAR-10, the TensorLights workload, tensorlights.md §III)
// and per-layer compute times derived from each layer's multiply-accumulate
// count.
//
// Parameter counts are exact (float32 weights + biases / batch-norm
// gamma and beta; totals 138,357,544 / 25,557,032 / 464,154, checked by
// profile_models_test). ResNets are grouped one "layer" per residual block
// (plus the stem and the classifier), the granularity at which a framework
// hands a block's gradients to the communication layer.
//
// Compute model: one GPU with a constant MAC rate, calibrated so that
// VGG-16's forward + backward pass at batch 32 takes 0.580 s, the GTX 1080Ti
// figure of mercury.md §II-A; backward = 2 x forward per layer. Times are
// then multiplied by a caller-chosen `compute_scale` and byte sizes divided
// by `byte_scale`, so a testbed link `byte_scale` times slower than 10 Gbit/s
// keeps the paper's communication/computation ratio when compute_scale = 1.
//
//   Profile p = ProfileByName("vgg16").value();
//   std::vector<ScaledLayer> layers = Scale(p, /*byte_scale=*/50, /*compute_scale=*/1);
//   layers[0].bytes;   // conv1_1's gradient bytes on the testbed
//
// Pure; thread-safe.
#ifndef MLFABRIC_EVAL_TESTBED_APPS_PROFILE_MODELS_H_
#define MLFABRIC_EVAL_TESTBED_APPS_PROFILE_MODELS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mlfabric::eval {

struct Layer {
  std::string name;
  int64_t params = 0;        // trainable float32 parameters
  double forward_macs = 0;   // multiply-accumulates of the forward pass, per sample
};

struct Profile {
  std::string name;
  int64_t batch = 32;        // local batch size the compute times are for
  std::vector<Layer> layers; // input side first (forward order)
  int64_t TotalParams() const;
  double TotalMacs() const;
};

// "vgg16", "resnet50" or "resnet32"; the error lists the names.
absl::StatusOr<Profile> ProfileByName(const std::string& name);
Profile Vgg16();
Profile ResNet50();
Profile ResNet32();

// MACs per second of the reference GPU (VGG-16 batch 32 in 0.580 s,
// mercury.md §II-A), with backward = 2 x forward.
double ReferenceMacsPerSecond();

struct ScaledLayer {
  std::string name;
  uint64_t bytes = 0;   // gradient bytes on the testbed: ceil(params*4/byte_scale), a multiple of 4
  double forward_s = 0;
  double backward_s = 0;
};

// byte_scale >= 1, compute_scale >= 0.
std::vector<ScaledLayer> Scale(const Profile& profile, double byte_scale, double compute_scale);

}  // namespace mlfabric::eval

#endif  // MLFABRIC_EVAL_TESTBED_APPS_PROFILE_MODELS_H_
