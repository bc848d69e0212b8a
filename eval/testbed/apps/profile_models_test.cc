#include "eval/testbed/apps/profile_models.h"

#include <catch2/catch.hpp>

namespace mlfabric::eval {
namespace {

TEST_CASE("parameter counts are the published totals") {
  CHECK(Vgg16().TotalParams() == 138357544);
  CHECK(ResNet50().TotalParams() == 25557032);
  CHECK(ResNet32().TotalParams() == 464154);
  CHECK(Vgg16().layers.size() == 16);
  CHECK(ResNet50().layers.size() == 18);  // stem, 16 blocks, fc
  CHECK(ResNet32().layers.size() == 17);  // stem, 15 blocks, fc
}

TEST_CASE("forward MACs match the usual figures") {
  // VGG-16: 15.47 GMACs; ResNet-50 v1.5: 4.09 GMACs (without BN/ReLU/pooling).
  CHECK(Vgg16().TotalMacs() == Approx(15.47e9).epsilon(0.01));
  CHECK(ResNet50().TotalMacs() == Approx(4.09e9).epsilon(0.02));
}

TEST_CASE("VGG-16's classifier holds most of the bytes, behind the convolutions") {
  const Profile vgg = Vgg16();
  CHECK(vgg.layers[13].name == "fc6");
  CHECK(vgg.layers[13].params > vgg.TotalParams() * 7 / 10);
}

TEST_CASE("Scale keeps the compute calibration and rounds bytes up to floats") {
  const Profile vgg = Vgg16();
  auto layers = Scale(vgg, 50, 1.0);
  double total = 0;
  uint64_t bytes = 0;
  for (const auto& l : layers) {
    total += l.forward_s + l.backward_s;
    bytes += l.bytes;
    CHECK(l.bytes % 4 == 0);
    CHECK(l.bytes >= 4);
    CHECK(l.backward_s == Approx(2 * l.forward_s));
  }
  CHECK(total == Approx(0.580));
  CHECK(bytes >= 138357544ull * 4 / 50);
  CHECK(bytes <= 138357544ull * 4 / 50 + 16 * 4);
  auto halved = Scale(vgg, 50, 0.5);
  CHECK(halved[3].forward_s == Approx(layers[3].forward_s / 2));
}

TEST_CASE("unknown model names are refused with the choices") {
  auto p = ProfileByName("alexnet");
  REQUIRE_FALSE(p.ok());
  CHECK(std::string(p.status().message()).find("vgg16") != std::string::npos);
  CHECK(ProfileByName("resnet50").ok());
}

}  // namespace
}  // namespace mlfabric::eval
