// The model zoo on the CPU: torchvision's VGG-16/19 (with and without batch norm),
// ResNet-34 and bottleneck ResNet-50/101/152, and the paper's MediumCNN(k) — parameter counts
// against torchvision's (or, for MediumCNN, a formula), layer names and knob layers, torchvision's
// init rules, and a forward and backward pass that reaches every parameter.
//
// The CPU reference convolution is slow, so the passes run batch 1 on 64x64 inputs (the smallest
// at which batch norm in training sees more than one value per channel at the last stage). VGG
// is not run by default: its classifier fixes the input at 224x224 (about 15.5 GFLOP forward,
// three times that with the backward: vgg16-bn at batch 1 took 133 s wall, 67 s CPU, on the
// 2-core build host), so by default VGG is checked at construction — counts, names, knobs, init —
// and for its input-shape check, which throws before any compute; the hidden test "[.vgg224]"
// at the end runs its forward and backward.
// Full-size VGGs hold about 550 MB of float32 weights; each is built alone and freed at once.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
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

using test::check_knobs_cover_params;
using test::count_kind;
using test::layer_of;
using test::spread_of;

// One training-mode forward and backward on batch 1; every parameter gets a finite gradient of
// its shape, every weight a nonzero one. (A conv bias right before batch norm has a zero
// gradient in exact arithmetic — the norm removes the mean — so biases are not asked for one.)
void check_forward_backward(const std::string& model, int side, int classes, int channels) {
  uint64_t seed = test::fresh_seed();
  INFO(model << " seed " << seed);
  Context ctx;
  auto net = make_net(ctx, {model, classes, channels});
  net->init(ctx, seed);
  net->begin_step(seed, 1);
  Tensor x = ctx.from_host(test::random_vec(std::size_t(channels) * side * side, seed), {1, channels, side, side});
  Var logits = net->forward(ctx, Var(x), true);
  REQUIRE(logits.shape() == Shape{1, classes});
  Var loss = softmax_cross_entropy(ctx, "loss", logits, ctx.from_host(std::vector<int32_t>{classes - 1}, {1}));
  ctx.tape().backward(ctx, loss);
  test::check_param_grads(*net, test::is_weight);
}

// torchvision's ResNet init beyond the convs: fc weight and bias uniform in +-1/sqrt(fc_in)
// (PyTorch's default Linear init), and every batch norm's gamma 1, beta 0.
void check_torchvision_resnet_init(Net& net, int fc_in) {
  const double bound = 1.0 / std::sqrt(double(fc_in));
  CHECK(spread_of(net, "fc.weight").most <= bound);
  CHECK(spread_of(net, "fc.weight").most > 0.9 * bound);
  CHECK(spread_of(net, "fc.bias").most <= bound);
  CHECK(spread_of(net, "fc.bias").most > 0);
  for (const auto& p : net.params())
    if (p.name.find("bn") != std::string::npos || p.name.find("downsample.1") != std::string::npos) {
      INFO(p.name);
      auto v = p.var.value().to_host_f32();
      const float want = p.name.back() == 't' ? 1.0f : 0.0f;  // weight (gamma) 1, bias (beta) 0
      CHECK(std::all_of(v.begin(), v.end(), [&](float g) { return g == want; }));
    }
}

// Each traced layer's output shape in one evaluation forward of zeros of shape x.
std::map<std::string, Shape> eval_output_shapes(Context& ctx, Net& net, const Shape& x) {
  SummaryTrace trace;
  NoGradGuard ng(ctx);
  net.forward(ctx, Var(ctx.zeros(x)), false, &trace);
  std::map<std::string, Shape> out;
  for (const auto& r : trace) out[r.name] = r.output;
  return out;
}

}  // namespace

TEST_CASE("zoo: every new model is known") {
  const auto& known = known_models();
  for (const char* m : {"vgg16", "vgg19", "vgg16-bn", "vgg19-bn", "resnet34", "resnet50", "resnet101", "resnet152",
                        "mediumcnn-k1", "mediumcnn-k3", "mediumcnn-k5", "mediumcnn-k7"}) {
    INFO(m);
    CHECK(std::find(known.begin(), known.end(), m) != known.end());
  }
  Context ctx;
  CHECK_THROWS_WITH(make_net(ctx, {"resnet51", 10, 3}), Contains("resnet152"));
}

TEST_CASE("zoo: VGG parameter counts, names and knobs as torchvision's") {
  // torchvision.models VGG16_Weights / VGG19_Weights / VGG16_BN_Weights / VGG19_BN_Weights
  // meta["num_params"] (= sum(p.numel() for p in model.parameters()) at 1000 classes).
  const std::map<std::string, int64_t> reference = {
      {"vgg16", 138357544}, {"vgg19", 143667240}, {"vgg16-bn", 138365992}, {"vgg19-bn", 143678248}};
  for (const auto& [model, count] : reference) {
    INFO(model);
    Context ctx;
    auto net = make_net(ctx, {model, 1000, 3});  // freed at the end of this iteration
    CHECK(net->name() == model);
    CHECK(net->param_count() == count);
    CHECK(net->stochastic());
    const bool bn = model.find("-bn") != std::string::npos;
    const int convs = model.rfind("vgg16", 0) == 0 ? 13 : 16;
    CHECK(count_kind(*net, op::conv2d) == convs);
    CHECK(count_kind(*net, op::batchnorm) == (bn ? convs : 0));
    CHECK(count_kind(*net, op::maxpool2d) == 5);
    CHECK(count_kind(*net, op::linear) == 3);
    check_knobs_cover_params(*net);
    // torchvision's state_dict names: features.0 the first conv, features.1 its bn (or relu).
    auto params = net->params();
    CHECK(params.front().name == "features.0.weight");
    CHECK(params[1].name == "features.0.bias");
    CHECK(params[2].name == (bn ? "features.1.weight" : "features.2.weight"));
    CHECK(params.back().name == "classifier.6.bias");
    CHECK(params[params.size() - 6].var.value().shape() == Shape{4096, 25088});  // classifier.0.weight
    // The last conv of vgg16 is features.28 (features.40 with bn); of vgg19, features.34 / .49.
    const char* last_conv = model == "vgg16" ? "features.28" : model == "vgg19" ? "features.34"
                            : model == "vgg16-bn" ? "features.40" : "features.49";
    CHECK(params[params.size() - 7 - (bn ? 2 : 0)].name == std::string(last_conv) + ".bias");
    Policy ok = Policy::parse({std::string(last_conv) + ".bwd_filter=algo0", "classifier.6.bias_bwd=deterministic"});
    CHECK_NOTHROW(ok.check_layers(net->knob_layers()));
    // Not 224..255 a side: a ShapeError before any compute (the classifier needs a 7x7 map).
    CHECK_THROWS_AS(net->forward(ctx, Var(ctx.zeros({1, 3, 64, 64})), false), ShapeError);
    CHECK_THROWS_WITH(net->forward(ctx, Var(ctx.zeros({1, 1, 224, 224})), false), Contains("Nx3x224x224"));
  }
}

TEST_CASE("zoo: VGG honours classes and channels; torchvision's init rules") {
  Context ctx;
  auto net = make_net(ctx, {"vgg16", 10, 1});
  // torchvision's count less conv1's two missing input channels (2 * 64 * 3 * 3) and the last
  // linear's 990 missing classes (990 * 4096 weights + 990 biases).
  CHECK(net->param_count() == 138357544 - 2 * 64 * 9 - 990 * 4096 - 990);
  net->init(ctx, 11);
  // Convs: kaiming normal, fan_out, relu gain: std sqrt(2 / (out * 9)).
  CHECK(spread_of(*net, "features.28.weight").stddev == Approx(std::sqrt(2.0 / (512 * 9))).epsilon(0.01));
  CHECK(spread_of(*net, "features.0.weight").most > 0);
  // Linears: normal(0, 0.01); biases zero.
  CHECK(spread_of(*net, "classifier.0.weight").stddev == Approx(0.01).epsilon(0.01));
  CHECK(spread_of(*net, "classifier.3.weight").stddev == Approx(0.01).epsilon(0.01));
  CHECK(spread_of(*net, "classifier.0.bias").most == 0.0);
  CHECK(spread_of(*net, "features.0.bias").most == 0.0);
}

TEST_CASE("zoo: bottleneck ResNet parameter counts, names and knobs as torchvision's") {
  // torchvision.models ResNet50_Weights / ResNet101_Weights / ResNet152_Weights
  // meta["num_params"] at 1000 classes.
  const std::map<std::string, int64_t> reference = {
      {"resnet50", 25557032}, {"resnet101", 44549160}, {"resnet152", 60192808}};
  const std::map<std::string, int> blocks = {{"resnet50", 3 + 4 + 6 + 3}, {"resnet101", 3 + 4 + 23 + 3},
                                             {"resnet152", 3 + 8 + 36 + 3}};
  for (const auto& [model, count] : reference) {
    INFO(model);
    Context ctx;
    auto net = make_net(ctx, {model, 1000, 3});
    CHECK(net->name() == model);
    CHECK(net->param_count() == count);
    CHECK_FALSE(net->stochastic());
    // stem + 3 per block + 4 downsamples (the first block of each stage).
    const int64_t convs = 1 + 3 * blocks.at(model) + 4;
    CHECK(count_kind(*net, op::conv2d) == convs);
    CHECK(count_kind(*net, op::batchnorm) == convs);
    CHECK(count_kind(*net, op::maxpool2d) == 1);
    CHECK(count_kind(*net, op::linear) == 1);
    CHECK(net->buffers().size() == std::size_t(2 * convs));
    check_knobs_cover_params(*net);
    std::vector<std::string> head;
    for (const auto& p : net->params()) head.push_back(p.name);
    CHECK(std::vector<std::string>(head.begin(), head.begin() + 11) ==
          std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight",
                                   "layer1.0.bn1.weight", "layer1.0.bn1.bias", "layer1.0.conv2.weight",
                                   "layer1.0.bn2.weight", "layer1.0.bn2.bias", "layer1.0.conv3.weight",
                                   "layer1.0.bn3.weight"});
    CHECK(std::find(head.begin(), head.end(), "layer2.0.downsample.0.weight") != head.end());
    CHECK(std::find(head.begin(), head.end(), "layer2.0.downsample.1.bias") != head.end());
    CHECK(std::find(head.begin(), head.end(), "layer2.1.downsample.0.weight") == head.end());
    CHECK(head.back() == "fc.bias");
    Policy ok = Policy::parse({"maxpool.bwd=gather", "layer4.2.conv2.bwd_filter=algo0", "layer3.0.downsample.1.bwd=deterministic"});
    CHECK_NOTHROW(ok.check_layers(net->knob_layers()));
  }
}

TEST_CASE("zoo: ResNet-50 stride on the 3x3 (v1.5), classes and channels, torchvision's init") {
  Context ctx;
  auto net = make_net(ctx, {"resnet50", 10, 1});
  // torchvision's count less conv1's two missing input channels (2 * 64 * 7 * 7) and fc's 990
  // missing classes (990 * 2048 + 990).
  CHECK(net->param_count() == 25557032 - 2 * 64 * 49 - 990 * 2048 - 990);
  net->init(ctx, 4);
  // Convs: kaiming normal fan_out: std sqrt(2 / (out * kernel area)).
  CHECK(spread_of(*net, "layer4.1.conv2.weight").stddev == Approx(std::sqrt(2.0 / (512 * 9))).epsilon(0.02));
  CHECK(spread_of(*net, "layer3.0.conv3.weight").stddev == Approx(std::sqrt(2.0 / 1024)).epsilon(0.02));
  check_torchvision_resnet_init(*net, 2048);
  // The summary: at 64x64, layer2.0's conv1 keeps 16x16 and its conv2 halves it (v1.5).
  const auto out = eval_output_shapes(ctx, *net, {1, 1, 64, 64});
  CHECK(out.at("maxpool") == Shape{1, 64, 16, 16});
  CHECK(out.at("layer2.0.conv1") == Shape{1, 128, 16, 16});
  CHECK(out.at("layer2.0.conv2") == Shape{1, 128, 8, 8});
  CHECK(out.at("layer4.2.out") == Shape{1, 2048, 2, 2});
  CHECK(out.at("fc") == Shape{1, 10});
}

TEST_CASE("zoo: ResNet-34 parameter count, names and knobs as torchvision's") {
  Context ctx;
  auto net = make_net(ctx, {"resnet34", 1000, 3});
  CHECK(net->name() == "resnet34");
  // torchvision.models ResNet34_Weights meta["num_params"] at 1000 classes.
  CHECK(net->param_count() == 21797672);
  CHECK_FALSE(net->stochastic());
  // stem + 2 per BasicBlock (3 + 4 + 6 + 3) + 3 downsamples (layer2.0, layer3.0, layer4.0).
  const int64_t convs = 1 + 2 * 16 + 3;
  CHECK(count_kind(*net, op::conv2d) == convs);
  CHECK(count_kind(*net, op::batchnorm) == convs);
  CHECK(count_kind(*net, op::maxpool2d) == 1);
  CHECK(count_kind(*net, op::linear) == 1);
  check_knobs_cover_params(*net);
  // torchvision's state_dict, less the batch-norm buffers, in its order: a BasicBlock registers
  // conv1, bn1, conv2, bn2, then downsample (0: conv, 1: bn) where the first block of a stage
  // strides; the stem's conv1, bn1 come first and fc last.
  std::vector<std::string> want = {"conv1.weight", "bn1.weight", "bn1.bias"};
  std::vector<std::string> want_buffers = {"bn1.running_mean", "bn1.running_var"};
  const int blocks[] = {3, 4, 6, 3};
  for (int stage = 1; stage <= 4; ++stage)
    for (int b = 0; b < blocks[stage - 1]; ++b) {
      const std::string blk = fmt::format("layer{}.{}.", stage, b);
      for (const char* bn : {"bn1", "bn2"}) {
        want.push_back(blk + (bn[2] == '1' ? "conv1" : "conv2") + ".weight");
        want.push_back(blk + bn + ".weight");
        want.push_back(blk + bn + ".bias");
        want_buffers.push_back(blk + bn + ".running_mean");
        want_buffers.push_back(blk + bn + ".running_var");
      }
      if (stage > 1 && b == 0) {
        for (const char* n : {"downsample.0.weight", "downsample.1.weight", "downsample.1.bias"}) want.push_back(blk + n);
        want_buffers.push_back(blk + "downsample.1.running_mean");
        want_buffers.push_back(blk + "downsample.1.running_var");
      }
    }
  want.push_back("fc.weight");
  want.push_back("fc.bias");
  std::vector<std::string> got, got_buffers;
  std::map<std::string, Shape> shape;
  for (const auto& p : net->params()) {
    got.push_back(p.name);
    shape[p.name] = p.var.value().shape();
  }
  for (const auto& b : net->buffers()) got_buffers.push_back(b.name);
  CHECK(got == want);
  CHECK(got_buffers == want_buffers);
  CHECK(shape.at("conv1.weight") == Shape{64, 3, 7, 7});
  CHECK(shape.at("layer1.0.conv1.weight") == Shape{64, 64, 3, 3});
  CHECK(shape.at("layer2.0.conv1.weight") == Shape{128, 64, 3, 3});
  CHECK(shape.at("layer2.0.downsample.0.weight") == Shape{128, 64, 1, 1});
  CHECK(shape.at("layer4.2.conv2.weight") == Shape{512, 512, 3, 3});
  CHECK(shape.at("fc.weight") == Shape{1000, 512});
  Policy ok = Policy::parse({"maxpool.bwd=gather", "layer4.2.conv2.bwd_filter=algo0", "layer3.0.downsample.1.bwd=deterministic"});
  CHECK_NOTHROW(ok.check_layers(net->knob_layers()));
}

TEST_CASE("zoo: ResNet-34 strides on conv1, honours classes and channels, torchvision's init") {
  Context ctx;
  auto net = make_net(ctx, {"resnet34", 10, 1});
  // torchvision's count less conv1's two missing input channels (2 * 64 * 7 * 7) and fc's 990
  // missing classes (990 * 512 + 990).
  CHECK(net->param_count() == 21797672 - 2 * 64 * 49 - 990 * 512 - 990);
  net->init(ctx, 4);
  // Convs: kaiming normal fan_out: std sqrt(2 / (out * kernel area)); layer2.0.conv1 (64 in, 128
  // out) tells it from fan_in's sqrt(2 / (64 * 9)).
  CHECK(spread_of(*net, "layer2.0.conv1.weight").stddev == Approx(std::sqrt(2.0 / (128 * 9))).epsilon(0.02));
  CHECK(spread_of(*net, "layer4.0.downsample.0.weight").stddev == Approx(std::sqrt(2.0 / 512)).epsilon(0.02));
  check_torchvision_resnet_init(*net, 512);
  // Initial weights are drawn from streams keyed by (seed, parameter name), so under resnet50's
  // rules every parameter the two nets share by name and shape starts with the same bits: the
  // stem, and the 3x3 conv2 of all 16 blocks (both nets have [3, 4, 6, 3] blocks of those widths).
  // Not fc.bias: its bound is 1/sqrt(in_features), 512 here and 2048 there.
  auto r50 = make_net(ctx, {"resnet50", 10, 1});
  r50->init(ctx, 4);
  std::map<std::string, Tensor> r50_params;
  for (const auto& p : r50->params()) r50_params.emplace(p.name, p.var.value());
  int shared = 0;
  for (const auto& p : net->params()) {
    auto it = r50_params.find(p.name);
    if (it == r50_params.end() || it->second.shape() != p.var.value().shape() || p.name == "fc.bias") continue;
    INFO(p.name);
    CHECK(it->second.fingerprint() == p.var.value().fingerprint());
    shared += p.name.find(".conv2.weight") != std::string::npos;
  }
  CHECK(shared == 16);
  // The summary: at 64x64 a BasicBlock strides on its first 3x3 (layer2.0.conv1 halves 16x16).
  const auto out = eval_output_shapes(ctx, *net, {1, 1, 64, 64});
  CHECK(out.at("relu") == Shape{1, 64, 32, 32});
  CHECK(out.at("maxpool") == Shape{1, 64, 16, 16});
  CHECK(out.at("layer1.2.out") == Shape{1, 64, 16, 16});
  CHECK(out.at("layer2.0.conv1") == Shape{1, 128, 8, 8});
  CHECK(out.at("layer2.0.downsample.0") == Shape{1, 128, 8, 8});
  CHECK(out.at("layer4.2.out") == Shape{1, 512, 2, 2});
  CHECK(out.at("fc") == Shape{1, 10});
}

TEST_CASE("zoo: MediumCNN(k) parameter count by formula, names and knobs") {
  // MediumCNN(k), c0 = in_channels, widths c1..c6 = 16, 32, 64, 128, 256, 512:
  //   sum over blocks i of  k*k*c(i-1)*c(i) + c(i)   (conv weight + bias)
  //                       + 2*c(i)                   (batch norm gamma + beta)
  //   + 512*classes + classes                        (fc)
  // For k = 3, 3 channels, 10 classes: 480 + 4,704 + 18,624 + 74,112 + 295,680 + 1,181,184 +
  // 5,130 = 1,579,914.
  const int widths[] = {16, 32, 64, 128, 256, 512};
  for (int channels : {3, 1}) {
    for (int k : {1, 3, 5, 7}) {
      const int classes = channels == 3 ? 10 : 1000;
      int64_t want = 0, in = channels;
      for (int c : widths) {
        want += int64_t(k) * k * in * c + c + 2 * c;
        in = c;
      }
      want += 512 * classes + classes;
      const std::string model = fmt::format("mediumcnn-k{}", k);
      INFO(model << " channels " << channels);
      Context ctx;
      auto net = make_net(ctx, {model, classes, channels});
      CHECK(net->name() == model);
      CHECK(net->param_count() == want);
      if (k == 3 && channels == 3) CHECK(want == 1579914);
      CHECK(count_kind(*net, op::conv2d) == 6);
      CHECK(count_kind(*net, op::batchnorm) == 6);
      CHECK(count_kind(*net, op::maxpool2d) == 6);
      CHECK(count_kind(*net, op::linear) == 1);
      check_knobs_cover_params(*net);
      CHECK(net->params()[0].var.value().shape() == Shape{16, channels, k, k});
    }
  }
  // 'same' padding keeps each map until its pool; at 64x64 block 6 pools 2x2 to 1x1.
  Context ctx;
  auto net = make_net(ctx, {"mediumcnn-k5", 10, 3});
  net->init(ctx, 1);
  const auto out = eval_output_shapes(ctx, *net, {1, 3, 64, 64});
  CHECK(out.at("conv1") == Shape{1, 16, 64, 64});
  CHECK(out.at("conv6") == Shape{1, 512, 2, 2});
  CHECK(out.at("pool6") == Shape{1, 512, 1, 1});
  CHECK(out.at("fc") == Shape{1, 10});
  // 32x32 runs out of pixels at pool6 (1x1 input to a 2x2 pool).
  NoGradGuard ng(ctx);
  CHECK_THROWS(net->forward(ctx, Var(ctx.zeros({1, 3, 32, 32})), false));
}

TEST_CASE("zoo: forward and backward reach every parameter (batch 1, 64x64)") {
  for (const char* model : {"mediumcnn-k1", "mediumcnn-k3", "mediumcnn-k5", "mediumcnn-k7"})
    check_forward_backward(model, 64, 5, 3);
  check_forward_backward("resnet34", 64, 5, 3);
  check_forward_backward("resnet50", 64, 7, 3);
  check_forward_backward("resnet101", 64, 3, 1);
  check_forward_backward("resnet152", 64, 4, 3);
}

// Hidden (run it with `cpu_zoo_nets "[.vgg224]"`): VGG at its only input size, 224x224, batch 1.
// On the CPU reference this takes far longer than the rest of the file, so CI skips it.
TEST_CASE("zoo: VGG-16 forward and backward at 224x224 (slow on the CPU)", "[.vgg224]") {
  check_forward_backward("vgg16-bn", 224, 5, 3);
}
