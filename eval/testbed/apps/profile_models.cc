#include "eval/testbed/apps/profile_models.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mlfabric::eval {
namespace {

// VGG-16 (ImageNet, 224x224): 13 3x3 convolutions + 3 fully connected layers.
Layer Conv3x3(const std::string& name, int64_t in, int64_t out, int64_t resolution) {
  return {name, 9 * in * out + out, static_cast<double>(resolution * resolution * 9 * in * out)};
}

Layer Dense(const std::string& name, int64_t in, int64_t out) {
  return {name, in * out + out, static_cast<double>(in * out)};
}

}  // namespace

int64_t Profile::TotalParams() const {
  int64_t total = 0;
  for (const Layer& layer : layers) total += layer.params;
  return total;
}

double Profile::TotalMacs() const {
  double total = 0;
  for (const Layer& layer : layers) total += layer.forward_macs;
  return total;
}

Profile Vgg16() {
  Profile p{"vgg16", 32, {}};
  p.layers = {Conv3x3("conv1_1", 3, 64, 224),    Conv3x3("conv1_2", 64, 64, 224),
              Conv3x3("conv2_1", 64, 128, 112),  Conv3x3("conv2_2", 128, 128, 112),
              Conv3x3("conv3_1", 128, 256, 56),  Conv3x3("conv3_2", 256, 256, 56),
              Conv3x3("conv3_3", 256, 256, 56),  Conv3x3("conv4_1", 256, 512, 28),
              Conv3x3("conv4_2", 512, 512, 28),  Conv3x3("conv4_3", 512, 512, 28),
              Conv3x3("conv5_1", 512, 512, 14),  Conv3x3("conv5_2", 512, 512, 14),
              Conv3x3("conv5_3", 512, 512, 14),  Dense("fc6", 512 * 7 * 7, 4096),
              Dense("fc7", 4096, 4096),          Dense("fc8", 4096, 1000)};
  return p;
}

// ResNet-50 v1.5 (torchvision layout): stem, 16 bottleneck blocks (3, 4, 6,
// 3), classifier. A block's parameters: 1x1 reduce, 3x3 (stride here), 1x1
// expand, three batch norms (gamma, beta), and on the first block of each
// stage a 1x1 projection shortcut with its batch norm.
Profile ResNet50() {
  Profile p{"resnet50", 32, {}};
  p.layers.push_back({"stem", 7 * 7 * 3 * 64 + 2 * 64, 112.0 * 112 * 7 * 7 * 3 * 64});
  const int64_t widths[] = {64, 128, 256, 512};
  const int64_t blocks[] = {3, 4, 6, 3};
  int64_t in = 64, resolution = 56;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t w = widths[stage];
    for (int64_t b = 0; b < blocks[stage]; ++b) {
      const bool first = b == 0;
      const int64_t stride = (first && stage > 0) ? 2 : 1;
      const int64_t out_res = resolution / stride;
      int64_t params = in * w + 2 * w + 9 * w * w + 2 * w + w * 4 * w + 2 * 4 * w;
      double macs = static_cast<double>(resolution * resolution * in * w) +
                    static_cast<double>(out_res * out_res) * (9 * w * w + 4 * w * w);
      if (first) {
        params += in * 4 * w + 2 * 4 * w;
        macs += static_cast<double>(out_res * out_res * in * 4 * w);
      }
      p.layers.push_back({absl::StrCat("block", stage + 1, "_", b + 1), params, macs});
      in = 4 * w;
      resolution = out_res;
    }
  }
  p.layers.push_back(Dense("fc", 2048, 1000));
  return p;
}

// ResNet-32 for CIFAR-10 (He et al. §4.2): 3x3 stem, 3 stages of 5 basic
// blocks (16, 32, 64 filters), identity shortcuts with zero padding (no
// parameters), classifier. The TensorLights workload, local batch 4.
Profile ResNet32() {
  Profile p{"resnet32", 4, {}};
  p.layers.push_back({"stem", 9 * 3 * 16 + 2 * 16, 32.0 * 32 * 9 * 3 * 16});
  const int64_t widths[] = {16, 32, 64};
  int64_t in = 16, resolution = 32;
  for (int stage = 0; stage < 3; ++stage) {
    const int64_t w = widths[stage];
    for (int b = 0; b < 5; ++b) {
      const int64_t stride = (b == 0 && stage > 0) ? 2 : 1;
      const int64_t out_res = resolution / stride;
      const int64_t params = 9 * in * w + 2 * w + 9 * w * w + 2 * w;
      const double macs = static_cast<double>(out_res * out_res) * (9 * in * w + 9 * w * w);
      p.layers.push_back({absl::StrCat("block", stage + 1, "_", b + 1), params, macs});
      in = w;
      resolution = out_res;
    }
  }
  p.layers.push_back(Dense("fc", 64, 10));
  return p;
}

absl::StatusOr<Profile> ProfileByName(const std::string& name) {
  if (name == "vgg16") return Vgg16();
  if (name == "resnet50") return ResNet50();
  if (name == "resnet32") return ResNet32();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model '", name, "': use vgg16, resnet50 or resnet32"));
}

double ReferenceMacsPerSecond() {
  // Forward + backward (2 x forward) of VGG-16 at batch 32 in 0.580 s.
  static const double rate = 3.0 * Vgg16().TotalMacs() * 32 / 0.580;
  return rate;
}

std::vector<ScaledLayer> Scale(const Profile& profile, double byte_scale, double compute_scale) {
  std::vector<ScaledLayer> out;
  const double rate = ReferenceMacsPerSecond();
  for (const Layer& layer : profile.layers) {
    ScaledLayer s;
    s.name = layer.name;
    const double floats = std::ceil(static_cast<double>(layer.params) / byte_scale);
    s.bytes = static_cast<uint64_t>(std::max(1.0, floats)) * 4;
    s.forward_s = compute_scale * layer.forward_macs * static_cast<double>(profile.batch) / rate;
    s.backward_s = 2 * s.forward_s;
    out.push_back(s);
  }
  return out;
}

}  // namespace mlfabric::eval
