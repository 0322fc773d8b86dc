// keras.applications.MobileNet (v1), torchvision.models.mobilenet_v2 and efficientnet_b0 (nets.h
// documents them).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "engine/error.h"
#include "kernels/activation.h"
#include "kernels/concat.h"
#include "kernels/dropout.h"
#include "kernels/dropout_ref.h"
#include "kernels/elementwise.h"
#include "nets/detail/families.h"
#include "nets/zoo.h"

namespace ditto::zoo {
namespace {

enum class Act { None, Relu6, Silu };

Var activate(Context& ctx, Act act, const Var& x) {
  switch (act) {
    case Act::Relu6: return relu6(ctx, x);
    case Act::Silu: return silu(ctx, x);
    case Act::None: break;
  }
  return x;
}

// torchvision.ops.Conv2dNormActivation: conv (no bias, padding (k - 1) / 2) "<name>.0" → batch
// norm "<name>.1" → activation (module "<name>.2", no parameters).
struct ConvBnAct {
  Conv2d* conv = nullptr;
  BatchNorm2d* bn = nullptr;
  Act act = Act::None;
  Var operator()(Context& ctx, const Var& x, bool training, SummaryTrace* trace) const {
    return activate(ctx, act, (*bn)(ctx, (*conv)(ctx, x, trace), training, trace));
  }
};

// torchvision's _make_divisible (from the TensorFlow MobileNet code): round to the nearest
// multiple of 8, at least 8, never more than 10% below v.
int make_divisible(double v, int divisor = 8) {
  int rounded = std::max(divisor, static_cast<int>(v + divisor / 2.0) / divisor * divisor);
  if (rounded < 0.9 * v) rounded += divisor;
  return rounded;
}

// A net built of Conv2dNormActivation blocks; torchvision's default batch norm (eps 1e-5,
// momentum 0.1) for both MobileNet-v2 and EfficientNet-B0.
class MobileBase : public ZooNet {
 public:
  using ZooNet::ZooNet;

 protected:
  ConvBnAct conv_bn_act(Context& ctx, const std::string& name, int in, int out, int kernel, int stride, int groups,
                        Act act) {
    ConvBnAct c;
    c.conv = &add_conv(ctx, name + ".0", in, out, kernel, stride, (kernel - 1) / 2, false, Init::HeNormal, groups);
    c.bn = &add_bn(ctx, name + ".1", out);
    c.act = act;
    return c;
  }
};

// ---- MobileNet (v1) ----

// keras.applications.MobileNet(alpha=1.0, depth_multiplier=1, dropout=1e-3, include_top=True),
// layer for layer with Keras's layer names: conv1 (3x3/2, 32) + conv1_bn + ReLU6, then 13
// depthwise-separable blocks (conv_dw_i 3x3 depthwise + conv_dw_i_bn + ReLU6, conv_pw_i 1x1 +
// conv_pw_i_bn + ReLU6; blocks 2, 4, 6 and 12 stride 2), global average pool, dropout, conv_preds
// (a 1x1 conv with bias on the pooled 1x1 map) and Keras's reshape to [N, classes] (the softmax is
// in the loss). No conv has a bias but conv_preds. Batch norm as Keras's (kKerasBnMomentum,
// kKerasBnEps). nets.h states the padding deviation.
class MobileNetV1 : public ZooNet {
 public:
  static constexpr int kMinSide = 32;  // keras.applications.MobileNet's min_size

  MobileNetV1(Context& ctx, const NetConfig& cfg)
      : ZooNet({cfg.in_channels, kMinSide, 0, "Keras's minimum; 224x224 is its design size"}) {
    // (pointwise filters, stride) of _depthwise_conv_block 1..13.
    static const int blocks[13][2] = {{64, 1},  {128, 2}, {128, 1}, {256, 2}, {256, 1}, {512, 2},  {512, 1},
                                      {512, 1}, {512, 1}, {512, 1}, {512, 1}, {1024, 2}, {1024, 1}};
    stem_ = conv_bn(ctx, "conv1", cfg.in_channels, 32, 3, 2, 1);
    int in = 32;
    for (int i = 0; i < 13; ++i) {
      const int out = blocks[i][0], stride = blocks[i][1];
      Block b;
      b.dw = conv_bn(ctx, fmt::format("conv_dw_{}", i + 1), in, in, 3, stride, in);
      b.pw = conv_bn(ctx, fmt::format("conv_pw_{}", i + 1), in, out, 1, 1, 1);
      blocks_.push_back(std::move(b));
      in = out;
    }
    dropout_ = &add_dropout("dropout", 1e-3f);
    preds_ = &add_conv(ctx, "conv_preds", in, cfg.num_classes, 1, 1, 0, true, Init::GlorotUniform);
  }
  std::string name() const override { return "mobilenet"; }

  // Keras's defaults: glorot_uniform kernels (Conv2D, DepthwiseConv2D's depthwise_kernel), zero
  // biases, BN gamma 1, beta 0, moving mean 0, moving variance 1.
  void init(Context& ctx, uint64_t seed) override { init_keras(ctx, seed); }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = traced(trace, "conv1_relu", "relu6", stem_(ctx, x, training, trace));
    for (const Block& b : blocks_) {
      h = traced(trace, b.dw.conv->name() + "_relu", "relu6", b.dw(ctx, h, training, trace));
      h = traced(trace, b.pw.conv->name() + "_relu", "relu6", b.pw(ctx, h, training, trace));
    }
    h = traced(trace, "global_average_pooling2d", "adaptive_avg_pool2d", adaptive_avg_pool2d(ctx, h, 1, 1));
    h = (*dropout_)(ctx, h, training, seed_, step_, trace);
    h = (*preds_)(ctx, h, trace);
    return traced(trace, "reshape_2", "flatten", flatten(ctx, h));
  }

 private:
  struct Block {
    ConvBnAct dw, pw;
  };
  // Keras's Conv2D / DepthwiseConv2D (no bias) "<name>" + BatchNormalization "<name>_bn" + ReLU6.
  ConvBnAct conv_bn(Context& ctx, const std::string& name, int in, int out, int kernel, int stride, int groups) {
    ConvBnAct c;
    c.conv = &add_conv(ctx, name, in, out, kernel, stride, (kernel - 1) / 2, false, Init::GlorotUniform, groups);
    c.bn = &add_bn(ctx, name + "_bn", out, kKerasBnMomentum, kKerasBnEps);
    c.act = Act::Relu6;
    return c;
  }
  ConvBnAct stem_;
  std::vector<Block> blocks_;
  Dropout* dropout_ = nullptr;
  Conv2d* preds_ = nullptr;
};

// ---- MobileNet-v2 ----

// torchvision's InvertedResidual: [1x1 expand ConvBnAct (ReLU6) when t != 1] → 3x3 depthwise
// ConvBnAct (ReLU6, stride) → 1x1 projection conv → batch norm (linear bottleneck), plus the
// input when stride 1 and in == out. Names "<block>.conv.<i>" as torchvision's nn.Sequential.
struct InvertedResidual {
  std::string name;
  std::vector<ConvBnAct> stages;  // expand (if any), depthwise
  Conv2d* project = nullptr;
  BatchNorm2d* project_bn = nullptr;
  bool residual = false;
};

class MobileNetV2 : public MobileBase {
 public:
  MobileNetV2(Context& ctx, const NetConfig& cfg) : MobileBase({cfg.in_channels, 1, 0, ""}) {
    // torchvision's inverted_residual_setting: expansion t, channels c, repeats n, stride s.
    static const int setting[7][4] = {{1, 16, 1, 1},  {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                                      {6, 96, 3, 1},  {6, 160, 3, 2}, {6, 320, 1, 1}};
    int in = make_divisible(32);
    const int last = make_divisible(1280);
    stem_ = conv_bn_act(ctx, "features.0", cfg.in_channels, in, 3, 2, 1, Act::Relu6);
    int index = 1;
    for (const auto& row : setting) {
      const int t = row[0], out = make_divisible(row[1]), n = row[2], s = row[3];
      for (int i = 0; i < n; ++i, ++index) {
        InvertedResidual b;
        b.name = fmt::format("features.{}", index);
        const int stride = i == 0 ? s : 1;
        const int hidden = static_cast<int>(std::lround(double(in) * t));
        int j = 0;
        if (t != 1)
          b.stages.push_back(
              conv_bn_act(ctx, fmt::format("{}.conv.{}", b.name, j++), in, hidden, 1, 1, 1, Act::Relu6));
        b.stages.push_back(
            conv_bn_act(ctx, fmt::format("{}.conv.{}", b.name, j++), hidden, hidden, 3, stride, hidden, Act::Relu6));
        b.project = &add_conv(ctx, fmt::format("{}.conv.{}", b.name, j++), hidden, out, 1, 1, 0, false, Init::HeNormal);
        b.project_bn = &add_bn(ctx, fmt::format("{}.conv.{}", b.name, j++), out);
        b.residual = stride == 1 && in == out;
        blocks_.push_back(std::move(b));
        in = out;
      }
    }
    head_ = conv_bn_act(ctx, fmt::format("features.{}", index), in, last, 1, 1, 1, Act::Relu6);
    dropout_ = &add_dropout("classifier.0", 0.2f);
    classifier_ = &add_linear(ctx, "classifier.1", last, cfg.num_classes, Init::GlorotUniform);
  }
  std::string name() const override { return "mobilenet-v2"; }

  // torchvision MobileNetV2.__init__: convs kaiming_normal_(mode="fan_out"), BN 1 / 0, linear
  // normal(0, 0.01) with bias 0.
  void init(Context& ctx, uint64_t seed) override {
    each_layer([&](Conv2d& c) { init_conv_he_fan_out(ctx, c, seed); }, [&](BatchNorm2d& bn) { reset_bn(ctx, bn); },
               [&](Linear& fc) { init_linear_normal(ctx, fc, 0.01, seed); });
  }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = stem_(ctx, x, training, trace);
    for (InvertedResidual& b : blocks_) {
      Var y = h;
      for (const ConvBnAct& st : b.stages) y = st(ctx, y, training, trace);
      y = (*b.project_bn)(ctx, (*b.project)(ctx, y, trace), training, trace);
      h = b.residual ? traced(trace, b.name, "add", add(ctx, h, y)) : y;
    }
    h = head_(ctx, h, training, trace);
    h = traced(trace, "avgpool", "global_avg_pool", global_avg_pool(ctx, h));
    h = (*dropout_)(ctx, h, training, seed_, step_, trace);
    return (*classifier_)(ctx, h, trace);
  }

 private:
  ConvBnAct stem_, head_;
  std::vector<InvertedResidual> blocks_;
  Dropout* dropout_ = nullptr;
  Linear* classifier_ = nullptr;
};

// ---- EfficientNet-B0 ----

// torchvision's MBConv: [1x1 expand ConvBnAct (SiLU) when the ratio is not 1] → kxk depthwise
// ConvBnAct (SiLU, stride) → SqueezeExcitation (avgpool → fc1 1x1 conv with bias → SiLU → fc2 1x1
// conv with bias → sigmoid → scale the input) → 1x1 projection ConvBnAct (no activation); with
// stride 1 and in == out, stochastic depth on the branch plus the input. Names
// "<block>.block.<i>" as torchvision's nn.Sequential, "<block>.stochastic_depth".
struct MBConv {
  std::string name;
  std::vector<ConvBnAct> pre;  // expand (if any), depthwise
  std::string se;
  Conv2d* se_fc1 = nullptr;
  Conv2d* se_fc2 = nullptr;
  ConvBnAct project;
  bool residual = false;
  float sd_prob = 0;
};

class EfficientNetB0 : public MobileBase {
 public:
  EfficientNetB0(Context& ctx, const NetConfig& cfg) : MobileBase({cfg.in_channels, 1, 0, ""}) {
    // torchvision's efficientnet_b0 MBConvConfig rows (width and depth multipliers 1.0):
    // expand ratio, kernel, stride, input channels, output channels, layers.
    static const int setting[7][6] = {{1, 3, 1, 32, 16, 1},   {6, 3, 2, 16, 24, 2},  {6, 5, 2, 24, 40, 2},
                                      {6, 3, 2, 40, 80, 3},   {6, 5, 1, 80, 112, 3}, {6, 5, 2, 112, 192, 4},
                                      {6, 3, 1, 192, 320, 1}};
    constexpr float kStochasticDepth = 0.2f;
    int total_blocks = 0;
    for (const auto& row : setting) total_blocks += row[5];
    stem_ = conv_bn_act(ctx, "features.0", cfg.in_channels, setting[0][3], 3, 2, 1, Act::Silu);
    int block_id = 0;
    for (int stage = 0; stage < 7; ++stage) {
      const auto& row = setting[stage];
      for (int i = 0; i < row[5]; ++i, ++block_id) {
        const int ratio = row[0], kernel = row[1], stride = i == 0 ? row[2] : 1;
        const int in = i == 0 ? row[3] : row[4], out = row[4];
        MBConv b;
        b.name = fmt::format("features.{}.{}", stage + 1, i);
        const int expanded = make_divisible(double(in) * ratio);
        int j = 0;
        if (expanded != in)
          b.pre.push_back(conv_bn_act(ctx, fmt::format("{}.block.{}", b.name, j++), in, expanded, 1, 1, 1, Act::Silu));
        b.pre.push_back(conv_bn_act(ctx, fmt::format("{}.block.{}", b.name, j++), expanded, expanded, kernel, stride,
                                    expanded, Act::Silu));
        const int squeeze = std::max(1, in / 4);
        b.se = fmt::format("{}.block.{}", b.name, j++);
        b.se_fc1 = &add_conv(ctx, b.se + ".fc1", expanded, squeeze, 1, 1, 0, true, Init::HeNormal);
        b.se_fc2 = &add_conv(ctx, b.se + ".fc2", squeeze, expanded, 1, 1, 0, true, Init::HeNormal);
        b.project = conv_bn_act(ctx, fmt::format("{}.block.{}", b.name, j++), expanded, out, 1, 1, 1, Act::None);
        b.residual = stride == 1 && in == out;
        // torchvision: stochastic_depth_prob * stage_block_id / total_stage_blocks, 0 .. 0.1875.
        b.sd_prob = kStochasticDepth * float(block_id) / float(total_blocks);
        blocks_.push_back(std::move(b));
      }
    }
    const int last_in = setting[6][4], last = 4 * last_in;  // lastconv_output_channels = 4 * 320
    head_ = conv_bn_act(ctx, "features.8", last_in, last, 1, 1, 1, Act::Silu);
    dropout_ = &add_dropout("classifier.0", 0.2f);
    classifier_ = &add_linear(ctx, "classifier.1", last, cfg.num_classes, Init::GlorotUniform);
    mark_stochastic();  // stochastic depth, besides classifier.0's dropout
  }
  std::string name() const override { return "efficientnet-b0"; }

  // torchvision EfficientNet.__init__: convs (the squeeze-excitation fc1 / fc2 included)
  // kaiming_normal_(mode="fan_out"), biases 0; BN 1 / 0; linear uniform +-1/sqrt(out_features),
  // bias 0.
  void init(Context& ctx, uint64_t seed) override {
    each_layer([&](Conv2d& c) { init_conv_he_fan_out(ctx, c, seed); }, [&](BatchNorm2d& bn) { reset_bn(ctx, bn); },
               [&](Linear& fc) {
                 init_linear_uniform(ctx, fc, 1.0 / std::sqrt(double(fc.weight.value().shape()[0])), false, seed);
               });
  }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = stem_(ctx, x, training, trace);
    for (MBConv& b : blocks_) {
      Var y = h;
      for (const ConvBnAct& st : b.pre) y = st(ctx, y, training, trace);
      Var s = traced(trace, b.se + ".avgpool", "adaptive_avg_pool2d", adaptive_avg_pool2d(ctx, y, 1, 1));
      s = silu(ctx, (*b.se_fc1)(ctx, s, trace));
      s = sigmoid(ctx, (*b.se_fc2)(ctx, s, trace));
      y = traced(trace, b.se, "channel_mul", channel_mul(ctx, y, s));
      y = b.project(ctx, y, training, trace);
      if (b.residual) {
        y = stochastic_depth(ctx, b.name + ".stochastic_depth", y, b.sd_prob, training, seed_, step_, trace);
        h = traced(trace, b.name, "add", add(ctx, y, h));
      } else {
        h = y;
      }
    }
    h = head_(ctx, h, training, trace);
    h = traced(trace, "avgpool", "global_avg_pool", global_avg_pool(ctx, h));
    h = (*dropout_)(ctx, h, training, seed_, step_, trace);
    return (*classifier_)(ctx, h, trace);
  }

 private:
  ConvBnAct stem_, head_;
  std::vector<MBConv> blocks_;
  Dropout* dropout_ = nullptr;
  Linear* classifier_ = nullptr;
};

}  // namespace

Var stochastic_depth(Context& ctx, const std::string& layer, const Var& x, float p, bool training, uint64_t seed,
                     int64_t step, SummaryTrace* trace) {
  if (!(p >= 0.0f && p < 1.0f))
    throw Error(fmt::format("stochastic depth layer '{}': p = {} is outside [0, 1)", layer, p));
  if (x.shape().size() != 4)
    throw ShapeError(fmt::format("stochastic depth layer '{}': input has shape {}; it takes NCHW", layer,
                                 shape_str(x.shape())));
  if (!training || p == 0.0f) return x;
  const Shape& s = x.shape();
  const int64_t n = s[0], c = s[1];
  const uint64_t key = dropout_key(seed, static_cast<uint64_t>(step), layer);
  const float scale = 1.0f / (1.0f - p);  // torchvision: noise.div_(survival_rate)
  std::vector<float> keep(static_cast<std::size_t>(n * c));
  for (int64_t i = 0; i < n; ++i)
    std::fill_n(keep.begin() + i * c, c, ref::dropout_dropped(key, i, p) ? 0.0f : scale);
  Var mask(ctx.from_host(keep, {n, c, 1, 1}), false);
  return traced(trace, layer, "stochastic_depth", channel_mul(ctx, x, mask));
}

std::unique_ptr<Net> make_mobilenet_v1(Context& ctx, const NetConfig& cfg) {
  return std::make_unique<MobileNetV1>(ctx, cfg);
}

std::unique_ptr<Net> make_mobilenet_v2(Context& ctx, const NetConfig& cfg) {
  return std::make_unique<MobileNetV2>(ctx, cfg);
}

std::unique_ptr<Net> make_efficientnet_b0(Context& ctx, const NetConfig& cfg) {
  return std::make_unique<EfficientNetB0>(ctx, cfg);
}

}  // namespace ditto::zoo
