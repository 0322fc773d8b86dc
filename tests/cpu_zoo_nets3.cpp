// The overhead list's last two models on the CPU: torchvision's DenseNet-169 and
// Keras's MobileNet (v1) — parameter counts against the references', parameter names as their
// state_dict / layer names, knob layers, init rules, the input check, and a forward and backward
// pass at batch 2 on 32x32 inputs (the smallest side MobileNet takes; its last stage is then 1x1,
// where batch norm in training sees two values per channel) that reaches every parameter.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/policy.h"
#include "kernels/loss.h"
#include "nets/nets.h"
#include "net_support.h"
#include "support.h"

using namespace ditto;
using Catch::Matchers::Contains;

namespace {

using test::buffer_count;
using test::check_full_size;
using test::param_names;
using test::param_shape;
using test::spread_of;

std::map<std::string, Shape> forward_backward(const std::string& model, int side, int classes, int channels) {
  return test::forward_backward_shapes(model, side, classes, channels, test::fresh_seed(), test::is_weight);
}

}  // namespace

TEST_CASE("zoo3: DenseNet-169 and MobileNet are known") {
  const auto& known = known_models();
  for (const char* m : {"densenet169", "mobilenet"}) {
    INFO(m);
    CHECK(std::find(known.begin(), known.end(), m) != known.end());
  }
}

TEST_CASE("zoo3: DenseNet-169 count, names and knobs as torchvision's") {
  // torchvision.models DenseNet169_Weights.IMAGENET1K_V1 meta["num_params"] (sum of
  // p.numel() over model.parameters() at 1000 classes): 14,149,480. Blocks (6, 12, 32, 32): 82
  // dense layers of two convs, conv0, 3 transition convs; batch norms the same plus norm5.
  check_full_size("densenet169", {14149480, 1 + 2 * 82 + 3, 1 + 2 * 82 + 3 + 1, 1, 1, false, "features.conv0.weight",
                                  "classifier.bias"});
  Context ctx;
  auto net = make_net(ctx, {"densenet169", 1000, 3});
  // Block 3 ends at 256 + 32 * 32 = 1280 channels, halved by transition3 to 640; block 4 ends at
  // 640 + 32 * 32 = 1664, the classifier's input.
  CHECK(param_shape(*net, "features.denseblock3.denselayer32.conv1.weight") == Shape{128, 256 + 31 * 32, 1, 1});
  CHECK(param_shape(*net, "features.transition3.conv.weight") == Shape{640, 1280, 1, 1});
  CHECK(param_shape(*net, "features.denseblock4.denselayer32.norm1.weight") == Shape{640 + 31 * 32});
  CHECK(param_shape(*net, "features.norm5.weight") == Shape{1664});
  CHECK(param_shape(*net, "classifier.weight") == Shape{1000, 1664});
  Policy ok = Policy::parse({"features.pool0.bwd=gather", "features.denseblock4.denselayer32.conv2.bwd_filter=algo0"});
  CHECK_NOTHROW(ok.check_layers(net->knob_layers()));
  // torchvision's count less the stem's two missing input channels and 990 missing classes.
  auto small = make_net(ctx, {"densenet169", 10, 1});
  CHECK(small->param_count() == 14149480 - 2 * 64 * 49 - 990 * (1664 + 1));
}

TEST_CASE("zoo3: MobileNet counts, names and knobs as Keras's") {
  // keras.applications.MobileNet(alpha=1.0, 224, 1000 classes) model.summary(): 4,253,864
  // parameters, of which 21,888 non-trainable: the batch norms' moving mean and variance
  // (2 x 10,944 channels). ditto counts the trainable ones, 4,231,976 (the statistics are its
  // buffers): params + buffers = Keras's total. From mobilenet.py: conv1 3*32*9; per block
  // depthwise 9*in + pointwise in*out; 4 per BN channel in Keras (2 here); conv_preds
  // 1024*1000 + 1000. Convs: conv1, 13 x (dw, pw), conv_preds = 28; batch norms 27; no pools,
  // no linear (conv_preds is Keras's 1x1 Conv2D).
  check_full_size("mobilenet", {4231976, 28, 27, 0, 0, true, "conv1.weight", "conv_preds.bias"});
  Context ctx;
  auto net = make_net(ctx, {"mobilenet", 1000, 3});
  CHECK(net->param_count() + buffer_count(*net) == 4253864);
  CHECK(buffer_count(*net) == 21888);
  auto names = param_names(*net);
  CHECK(std::vector<std::string>(names.begin(), names.begin() + 9) ==
        std::vector<std::string>{"conv1.weight", "conv1_bn.weight", "conv1_bn.bias", "conv_dw_1.weight",
                                 "conv_dw_1_bn.weight", "conv_dw_1_bn.bias", "conv_pw_1.weight", "conv_pw_1_bn.weight",
                                 "conv_pw_1_bn.bias"});
  CHECK(param_shape(*net, "conv1.weight") == Shape{32, 3, 3, 3});
  CHECK(param_shape(*net, "conv_dw_2.weight") == Shape{64, 1, 3, 3});  // depthwise: groups = channels
  CHECK(param_shape(*net, "conv_pw_2.weight") == Shape{128, 64, 1, 1});
  CHECK(param_shape(*net, "conv_pw_11.weight") == Shape{512, 512, 1, 1});
  CHECK(param_shape(*net, "conv_pw_13_bn.bias") == Shape{1024});
  CHECK(param_shape(*net, "conv_preds.weight") == Shape{1000, 1024, 1, 1});
  Policy ok = Policy::parse({"conv_dw_12.bwd_filter=algo0", "conv_pw_13_bn.bwd=deterministic",
                             "conv_preds.bias_bwd=deterministic"});
  CHECK_NOTHROW(ok.check_layers(net->knob_layers()));
  // Keras's minimum side, 32: a ShapeError naming the net before any op runs.
  NoGradGuard ng(ctx);
  CHECK_THROWS_AS(net->forward(ctx, Var(ctx.zeros({1, 3, 31, 32})), false), ShapeError);
  CHECK_THROWS_WITH(net->forward(ctx, Var(ctx.zeros({1, 3, 31, 32})), false),
                    Contains("mobilenet") && Contains(">= 32"));
  // Classes and channels: less the stem's two missing input channels and 990 missing classes.
  auto small = make_net(ctx, {"mobilenet", 10, 1});
  CHECK(small->param_count() == 4231976 - 2 * 32 * 9 - 990 * (1024 + 1));
}

TEST_CASE("zoo3: init rules as the references'") {
  Context ctx;
  {
    // DenseNet: kaiming_normal_ fan_in; classifier uniform +-1/sqrt(in), bias 0.
    auto net = make_net(ctx, {"densenet169", 10, 3});
    net->init(ctx, 3);
    CHECK(spread_of(*net, "features.denseblock3.denselayer20.conv1.weight").stddev ==
          Approx(std::sqrt(2.0 / (256 + 19 * 32))).epsilon(0.03));
    CHECK(spread_of(*net, "classifier.weight").most <= 1 / std::sqrt(1664.0));
    CHECK(spread_of(*net, "classifier.weight").most > 0.9 / std::sqrt(1664.0));
    CHECK(spread_of(*net, "classifier.bias").most == 0.0);
  }
  {
    // MobileNet: Keras's glorot_uniform, limit sqrt(6 / (fan_in + fan_out)); the depthwise
    // kernel's fans are 9 and 9 * channels; conv_preds' bias 0; BN 1 / 0.
    auto net = make_net(ctx, {"mobilenet", 10, 3});
    net->init(ctx, 4);
    const double dw = std::sqrt(6.0 / (9 + 9 * 512)), pw = std::sqrt(6.0 / (512 + 1024));
    CHECK(spread_of(*net, "conv_dw_12.weight").most <= dw);
    CHECK(spread_of(*net, "conv_dw_12.weight").most > 0.9 * dw);
    CHECK(spread_of(*net, "conv_pw_12.weight").most <= pw);
    CHECK(spread_of(*net, "conv_pw_12.weight").most > 0.9 * pw);
    CHECK(spread_of(*net, "conv_preds.bias").most == 0.0);
    CHECK(spread_of(*net, "conv_pw_13_bn.bias").most == 0.0);
  }
}

TEST_CASE("zoo3: forward and backward reach every parameter (batch 2, 32x32)") {
  SECTION("densenet169") {
    auto out = forward_backward("densenet169", 32, 10, 3);
    CHECK(out.at("features.denseblock3") == Shape{2, 1280, 2, 2});
    CHECK(out.at("features.denseblock4") == Shape{2, 1664, 1, 1});
  }
  SECTION("mobilenet") {
    // Strides 2 at conv1 and blocks 2, 4, 6, 12: 32 → 16 → 8 → 4 → 2 → 1.
    auto out = forward_backward("mobilenet", 32, 7, 3);
    CHECK(out.at("conv1") == Shape{2, 32, 16, 16});
    CHECK(out.at("conv_dw_2") == Shape{2, 64, 8, 8});
    CHECK(out.at("conv_pw_11_relu") == Shape{2, 512, 2, 2});
    CHECK(out.at("conv_dw_12") == Shape{2, 512, 1, 1});
    CHECK(out.at("global_average_pooling2d") == Shape{2, 1024, 1, 1});
    CHECK(out.at("conv_preds") == Shape{2, 7, 1, 1});
    CHECK(out.at("reshape_2") == Shape{2, 7});
  }
}
