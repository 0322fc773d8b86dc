#include "nets/nets.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/error.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "nets/tasks.h"
#include "nets/zoo.h"

namespace ditto {
namespace {

Var traced(SummaryTrace* trace, const std::string& name, const std::string& op, Var y) {
  if (trace) trace->push_back({name, op, y.shape(), 0});
  return y;
}

// Weights by the layer's own rule from fans (in * kernel area, out * kernel area), bias zero.
void init_conv(Context& ctx, Conv2d& c, uint64_t seed) {
  const Shape& s = c.weight.value().shape();
  init_tensor(ctx, c.weight.value(), c.init(), s[1] * s[2] * s[3], s[0] * s[2] * s[3], seed, c.name() + ".weight");
  if (c.bias.defined()) init_tensor(ctx, c.bias.value(), Init::Zeros, 0, 0, seed, c.name() + ".bias");
}

// Glorot-uniform weights, bias zero.
void init_linear(Context& ctx, Linear& fc, uint64_t seed) {
  const Shape& s = fc.weight.value().shape();
  init_tensor(ctx, fc.weight.value(), Init::GlorotUniform, s[1], s[0], seed, fc.name() + ".weight");
  if (fc.bias.defined()) init_tensor(ctx, fc.bias.value(), Init::Zeros, 0, 0, seed, fc.name() + ".bias");
}

class SmallCnn : public Net {
 public:
  SmallCnn(Context& ctx, const NetConfig& cfg, bool bn)
      : bn_(bn),
        conv1_(ctx, "conv1", cfg.in_channels, 16, 3, 1, 1),
        conv2_(ctx, "conv2", 16, 32, 3, 1, 1),
        conv3_(ctx, "conv3", 32, 32, 3, 1, 1),
        pool1_("pool1", 2, 2),
        pool2_("pool2", 2, 2),
        pool3_("pool3", 2, 2),
        fc1_(ctx, "fc1", 32, 32),
        fc2_(ctx, "fc2", 32, cfg.num_classes) {
    if (bn_) {
      bns_.emplace_back(ctx, "bn1", 16);
      bns_.emplace_back(ctx, "bn2", 32);
      bns_.emplace_back(ctx, "bn3", 32);
    }
  }
  std::string name() const override { return bn_ ? "smallcnn-bn" : "smallcnn"; }

  Var forward(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = x;
    const Conv2d* convs[] = {&conv1_, &conv2_, &conv3_};
    const MaxPool2d* pools[] = {&pool1_, &pool2_, &pool3_};
    for (int i = 0; i < 3; ++i) {
      h = (*convs[i])(ctx, h, trace);
      if (bn_) h = bns_[i](ctx, h, training, trace);
      h = traced(trace, fmt::format("relu{}", i + 1), "relu", relu(ctx, h));
      h = (*pools[i])(ctx, h, trace);
    }
    h = traced(trace, "gap", "global_avg_pool", global_avg_pool(ctx, h));
    h = traced(trace, "relu4", "relu", relu(ctx, fc1_(ctx, h, trace)));
    return fc2_(ctx, h, trace);
  }

  std::vector<Param> params() override {
    std::vector<Param> p;
    conv1_.collect(p);
    if (bn_) bns_[0].collect(p);
    conv2_.collect(p);
    if (bn_) bns_[1].collect(p);
    conv3_.collect(p);
    if (bn_) bns_[2].collect(p);
    fc1_.collect(p);
    fc2_.collect(p);
    return p;
  }
  std::vector<Buffer> buffers() override {
    std::vector<Buffer> b;
    for (auto& bn : bns_) bn.collect(b);
    return b;
  }
  std::vector<std::pair<std::string, OpKind>> knob_layers() const override {
    std::vector<std::pair<std::string, OpKind>> l = {
        {"conv1", OpKind::Conv2d},    {"pool1", OpKind::MaxPool2d}, {"conv2", OpKind::Conv2d},
        {"pool2", OpKind::MaxPool2d}, {"conv3", OpKind::Conv2d},    {"pool3", OpKind::MaxPool2d},
        {"fc1", OpKind::Linear},      {"fc2", OpKind::Linear},      {"loss", OpKind::SoftmaxXent}};
    for (const auto& bn : bns_) l.push_back({bn.name(), OpKind::BatchNorm});
    return l;
  }
  void init(Context& ctx, uint64_t seed) override {
    for (Conv2d* c : {&conv1_, &conv2_, &conv3_}) init_conv(ctx, *c, seed);
    for (Linear* fc : {&fc1_, &fc2_}) init_linear(ctx, *fc, seed);
    for (auto& bn : bns_) reset_bn(ctx, bn);
  }

  static void reset_bn(Context& ctx, BatchNorm2d& bn) {
    fill(ctx, bn.gamma.value(), 1.0f);
    fill(ctx, bn.beta.value(), 0.0f);
    fill(ctx, bn.state.running_mean, 0.0f);
    fill(ctx, bn.state.running_var, 1.0f);
  }

 private:
  bool bn_;
  Conv2d conv1_, conv2_, conv3_;
  MaxPool2d pool1_, pool2_, pool3_;
  Linear fc1_, fc2_;
  std::vector<BatchNorm2d> bns_;
};

// ResNet basic block: conv3x3 → bn → relu → conv3x3 → bn, plus identity or 1x1-conv+bn
// shortcut, then relu.
// Parameters and buffers of a network made of (conv, batch norm) pairs, which it enumerates
// with each_conv_bn(f), followed by a linear head: the ResNets.
template <class N>
std::vector<Param> conv_bn_params(N& net, const Linear& head) {
  std::vector<Param> p;
  net.each_conv_bn([&](Conv2d& c, BatchNorm2d& bn) {
    c.collect(p);
    bn.collect(p);
  });
  head.collect(p);
  return p;
}
template <class N>
std::vector<Buffer> conv_bn_buffers(N& net) {
  std::vector<Buffer> out;
  net.each_conv_bn([&](Conv2d&, BatchNorm2d& bn) { bn.collect(out); });
  return out;
}

struct BasicBlock {
  BasicBlock(Context& ctx, const std::string& name, int in, int out, int stride)
      : conv1(ctx, name + ".conv1", in, out, 3, stride, 1, false, Init::HeNormal),
        bn1(ctx, name + ".bn1", out),
        conv2(ctx, name + ".conv2", out, out, 3, 1, 1, false, Init::HeNormal),
        bn2(ctx, name + ".bn2", out),
        name(name) {
    if (stride != 1 || in != out) {
      down_conv = std::make_unique<Conv2d>(ctx, name + ".downsample.conv", in, out, 1, stride, 0, false, Init::HeNormal);
      down_bn = std::make_unique<BatchNorm2d>(ctx, name + ".downsample.bn", out);
    }
  }
  Var operator()(Context& ctx, const Var& x, bool training, SummaryTrace* trace) {
    Var h = relu(ctx, bn1(ctx, conv1(ctx, x, trace), training, trace));
    h = bn2(ctx, conv2(ctx, h, trace), training, trace);
    Var shortcut = down_conv ? (*down_bn)(ctx, (*down_conv)(ctx, x, trace), training, trace) : x;
    return traced(trace, name + ".out", "add+relu", relu(ctx, add(ctx, h, shortcut)));
  }
  Conv2d conv1;
  BatchNorm2d bn1;
  Conv2d conv2;
  BatchNorm2d bn2;
  std::unique_ptr<Conv2d> down_conv;
  std::unique_ptr<BatchNorm2d> down_bn;
  std::string name;
};

class ResNet18 : public Net {
 public:
  ResNet18(Context& ctx, const NetConfig& cfg, bool imagenet_stem)
      : imagenet_(imagenet_stem),
        conv1_(ctx, "conv1", cfg.in_channels, 64, imagenet_stem ? 7 : 3, imagenet_stem ? 2 : 1, imagenet_stem ? 3 : 1,
               false, Init::HeNormal),
        bn1_(ctx, "bn1", 64),
        pool1_("pool1", 3, 2, 1),
        fc_(ctx, "fc", 512, cfg.num_classes) {
    const int widths[] = {64, 128, 256, 512};
    int in = 64;
    for (int stage = 0; stage < 4; ++stage) {
      for (int b = 0; b < 2; ++b) {
        int stride = (stage > 0 && b == 0) ? 2 : 1;
        blocks_.push_back(std::make_unique<BasicBlock>(ctx, fmt::format("layer{}.{}", stage + 1, b), in, widths[stage], stride));
        in = widths[stage];
      }
    }
  }
  std::string name() const override { return imagenet_ ? "resnet18-imagenet" : "resnet18"; }

  Var forward(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = traced(trace, "relu1", "relu", relu(ctx, bn1_(ctx, conv1_(ctx, x, trace), training, trace)));
    if (imagenet_) h = pool1_(ctx, h, trace);
    for (auto& b : blocks_) h = (*b)(ctx, h, training, trace);
    h = traced(trace, "avgpool", "global_avg_pool", global_avg_pool(ctx, h));
    return fc_(ctx, h, trace);
  }

  template <class F>
  void each_conv_bn(F&& f) {
    f(conv1_, bn1_);
    for (auto& b : blocks_) {
      f(b->conv1, b->bn1);
      f(b->conv2, b->bn2);
      if (b->down_conv) f(*b->down_conv, *b->down_bn);
    }
  }

  std::vector<Param> params() override { return conv_bn_params(*this, fc_); }
  std::vector<Buffer> buffers() override { return conv_bn_buffers(*this); }
  std::vector<std::pair<std::string, OpKind>> knob_layers() const override {
    auto* self = const_cast<ResNet18*>(this);
    std::vector<std::pair<std::string, OpKind>> l;
    self->each_conv_bn([&](Conv2d& c, BatchNorm2d& bn) {
      l.push_back({c.name(), OpKind::Conv2d});
      l.push_back({bn.name(), OpKind::BatchNorm});
    });
    if (imagenet_) l.push_back({"pool1", OpKind::MaxPool2d});
    l.push_back({"fc", OpKind::Linear});
    l.push_back({"loss", OpKind::SoftmaxXent});
    return l;
  }
  void init(Context& ctx, uint64_t seed) override {
    each_conv_bn([&](Conv2d& c, BatchNorm2d& bn) {
      init_conv(ctx, c, seed);
      fill(ctx, bn.gamma.value(), 1.0f);
      fill(ctx, bn.beta.value(), 0.0f);
      fill(ctx, bn.state.running_mean, 0.0f);
      fill(ctx, bn.state.running_var, 1.0f);
    });
    init_linear(ctx, fc_, seed);
  }

 private:
  bool imagenet_;
  Conv2d conv1_;
  BatchNorm2d bn1_;
  MaxPool2d pool1_;
  std::vector<std::unique_ptr<BasicBlock>> blocks_;
  Linear fc_;
};

// The smallest network with every kind of noisy kernel the noise lab studies: conv 3x3 16 →
// relu → max-pool 3x3 stride 2 (overlapping windows, so the pool's backward scatter can
// collide) → conv 3x3 32 → relu → global average pool → dense classes.
class TwoConv : public Net {
 public:
  TwoConv(Context& ctx, const NetConfig& cfg)
      : conv1_(ctx, "conv1", cfg.in_channels, 16, 3, 1, 1),
        pool1_("pool1", 3, 2, 1),
        conv2_(ctx, "conv2", 16, 32, 3, 1, 1),
        fc_(ctx, "fc", 32, cfg.num_classes) {}
  std::string name() const override { return "two-conv"; }
  Var forward(Context& ctx, const Var& x, bool, SummaryTrace* trace) override {
    Var h = traced(trace, "relu1", "relu", relu(ctx, conv1_(ctx, x, trace)));
    h = traced(trace, "relu2", "relu", relu(ctx, conv2_(ctx, pool1_(ctx, h, trace), trace)));
    return fc_(ctx, traced(trace, "gap", "global_avg_pool", global_avg_pool(ctx, h)), trace);
  }
  std::vector<Param> params() override {
    std::vector<Param> p;
    conv1_.collect(p);
    conv2_.collect(p);
    fc_.collect(p);
    return p;
  }
  std::vector<std::pair<std::string, OpKind>> knob_layers() const override {
    return {{"conv1", OpKind::Conv2d}, {"pool1", OpKind::MaxPool2d}, {"conv2", OpKind::Conv2d},
            {"fc", OpKind::Linear}, {"loss", OpKind::SoftmaxXent}};
  }
  void init(Context& ctx, uint64_t seed) override {
    for (Conv2d* c : {&conv1_, &conv2_}) init_conv(ctx, *c, seed);
    init_linear(ctx, fc_, seed);
  }

 private:
  Conv2d conv1_;
  MaxPool2d pool1_;
  Conv2d conv2_;
  Linear fc_;
};

// Keras's examples/mnist_cnn.py, layer for layer (see nets.h). Only a 28x28 input fits fc1.
class MnistCnn : public Net {
 public:
  static constexpr int kSide = 28;                         // input height and width
  static constexpr int kPooled = (kSide - 2 - 2) / 2;      // two valid 3x3 convs, then pool 2: 12
  MnistCnn(Context& ctx, const NetConfig& cfg)
      : in_channels_(cfg.in_channels),
        conv1_(ctx, "conv1", cfg.in_channels, 32, 3),  // padding 0: Keras's 'valid'
        conv2_(ctx, "conv2", 32, 64, 3),
        pool1_("pool1", 2, 2),
        dropout1_("dropout1", 0.25f),
        fc1_(ctx, "fc1", 64 * kPooled * kPooled, 128),
        dropout2_("dropout2", 0.5f),
        fc2_(ctx, "fc2", 128, cfg.num_classes) {}
  std::string name() const override { return "mnist-cnn"; }

  Var forward(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    const Shape& s = x.shape();
    if (s.size() != 4 || s[1] != in_channels_ || s[2] != kSide || s[3] != kSide)
      throw ShapeError(fmt::format("mnist-cnn: input has shape {}; the network takes Nx{}x{}x{} (its fc1 is sized "
                                   "for {}x{} images)",
                                   shape_str(s), in_channels_, kSide, kSide, kSide, kSide));
    Var h = traced(trace, "relu1", "relu", relu(ctx, conv1_(ctx, x, trace)));
    h = traced(trace, "relu2", "relu", relu(ctx, conv2_(ctx, h, trace)));
    h = dropout1_(ctx, pool1_(ctx, h, trace), training, seed_, step_, trace);
    h = traced(trace, "flatten", "flatten", flatten(ctx, h));
    h = traced(trace, "relu3", "relu", relu(ctx, fc1_(ctx, h, trace)));
    return fc2_(ctx, dropout2_(ctx, h, training, seed_, step_, trace), trace);
  }
  void begin_step(uint64_t seed, int64_t step) override {
    seed_ = seed;
    step_ = step;
  }
  bool stochastic() const override { return true; }

  std::vector<Param> params() override {
    std::vector<Param> p;
    conv1_.collect(p);
    conv2_.collect(p);
    fc1_.collect(p);
    fc2_.collect(p);
    return p;
  }
  std::vector<std::pair<std::string, OpKind>> knob_layers() const override {
    return {{"conv1", OpKind::Conv2d}, {"conv2", OpKind::Conv2d}, {"pool1", OpKind::MaxPool2d},
            {"fc1", OpKind::Linear},   {"fc2", OpKind::Linear},   {"loss", OpKind::SoftmaxXent}};
  }
  void init(Context& ctx, uint64_t seed) override {
    for (Conv2d* c : {&conv1_, &conv2_}) init_conv(ctx, *c, seed);
    for (Linear* fc : {&fc1_, &fc2_}) init_linear(ctx, *fc, seed);
  }

 private:
  int in_channels_;
  Conv2d conv1_, conv2_;
  MaxPool2d pool1_;
  Dropout dropout1_;
  Linear fc1_;
  Dropout dropout2_;
  Linear fc2_;
  uint64_t seed_ = 0;  // from begin_step: the dropout masks' key with the step and layer name
  int64_t step_ = 0;
};


// ---- Model zoo: torchvision's VGG and bottleneck ResNets, the paper's MediumCNN(k) ----

// torchvision's conv init: kaiming_normal_(mode="fan_out", nonlinearity="relu"), i.e. normal with
// std sqrt(2 / (out * kernel area)); bias zero. Init::HeNormal draws std sqrt(2 / fan_in) from
// its fan_in argument, so passing the fan-out as that argument gives exactly this rule.
void init_conv_fan_out(Context& ctx, Conv2d& c, uint64_t seed) {
  const Shape& s = c.weight.value().shape();
  const int64_t fan_out = s[0] * s[2] * s[3];
  init_tensor(ctx, c.weight.value(), Init::HeNormal, fan_out, fan_out, seed, c.name() + ".weight");
  if (c.bias.defined()) init_tensor(ctx, c.bias.value(), Init::Zeros, 0, 0, seed, c.name() + ".bias");
}

// torchvision VGG's linear init: normal(0, 0.01), bias zero. The Init enum has no fixed-std
// normal; Init::HeNormal with fan_in 20000 has std sqrt(2 / 20000) = 0.01, the same rule.
void init_linear_normal_001(Context& ctx, Linear& fc, uint64_t seed) {
  init_tensor(ctx, fc.weight.value(), Init::HeNormal, 20000, 0, seed, fc.name() + ".weight");
  if (fc.bias.defined()) init_tensor(ctx, fc.bias.value(), Init::Zeros, 0, 0, seed, fc.name() + ".bias");
}

// PyTorch's default nn.Linear init, which torchvision's ResNet leaves on its fc: weight and bias
// uniform in +-1/sqrt(in_features). The Init enum has no such rule; Init::HeUniform's limit
// sqrt(6 / fan_in) with fan_in = 6 * in_features is exactly 1/sqrt(in_features).
void init_linear_torch_default(Context& ctx, Linear& fc, uint64_t seed) {
  const int64_t six_fan_in = 6 * fc.weight.value().shape()[1];
  init_tensor(ctx, fc.weight.value(), Init::HeUniform, six_fan_in, 0, seed, fc.name() + ".weight");
  if (fc.bias.defined()) init_tensor(ctx, fc.bias.value(), Init::HeUniform, six_fan_in, 0, seed, fc.name() + ".bias");
}

// Batch norm's start (torchvision's and PyTorch's): gamma 1, beta 0, running mean 0, variance 1.
void reset_bn_state(Context& ctx, BatchNorm2d& bn) {
  fill(ctx, bn.gamma.value(), 1.0f);
  fill(ctx, bn.beta.value(), 0.0f);
  fill(ctx, bn.state.running_mean, 0.0f);
  fill(ctx, bn.state.running_var, 1.0f);
}

// torchvision.models.vgg{16,19}{,_bn}, module for module. Names are torchvision's module paths:
// features.i counts every module of `features` (conv, bn, relu, pool), classifier.0/3/6 are the
// linears and classifier.2/5 the dropouts, so parameter names match torchvision's state_dict
// (less BN's num_batches_tracked). torchvision's AdaptiveAvgPool2d((7, 7)) between features and
// classifier is the identity when features end at 7x7, i.e. for inputs of 224..255 pixels a
// side (five floor-halving pools); any other input is a ShapeError, not a silent resize.
class Vgg : public Net {
 public:
  static constexpr int kM = 0;  // a max pool in the configuration list
  Vgg(Context& ctx, const NetConfig& cfg, int depth, bool bn)
      : depth_(depth),
        bn_(bn),
        in_channels_(cfg.in_channels),
        fc1_(ctx, "classifier.0", 512 * 7 * 7, 4096),
        drop1_("classifier.2", 0.5f),
        fc2_(ctx, "classifier.3", 4096, 4096),
        drop2_("classifier.5", 0.5f),
        fc3_(ctx, "classifier.6", 4096, cfg.num_classes) {
    // torchvision's cfgs "D" (vgg16) and "E" (vgg19).
    static const std::vector<int> d = {64, 64, kM, 128, 128, kM, 256, 256, 256, kM, 512, 512, 512, kM,
                                       512, 512, 512, kM};
    static const std::vector<int> e = {64,  64,  kM,  128, 128, kM,  256, 256, 256, 256, kM,
                                       512, 512, 512, 512, kM,  512, 512, 512, 512, kM};
    int in = cfg.in_channels, index = 0;
    for (int width : depth == 16 ? d : e) {
      Stage s;
      if (width == kM) {
        s.pool = std::make_unique<MaxPool2d>(fmt::format("features.{}", index++), 2, 2);
      } else {
        s.conv = std::make_unique<Conv2d>(ctx, fmt::format("features.{}", index++), in, width, 3, 1, 1, true,
                                          Init::HeNormal);
        if (bn_) s.bn = std::make_unique<BatchNorm2d>(ctx, fmt::format("features.{}", index++), width);
        s.relu_name = fmt::format("features.{}", index++);
        in = width;
      }
      features_.push_back(std::move(s));
    }
  }
  std::string name() const override { return fmt::format("vgg{}{}", depth_, bn_ ? "-bn" : ""); }

  Var forward(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    const Shape& s = x.shape();
    if (s.size() != 4 || s[1] != in_channels_ || s[2] / 32 != 7 || s[3] / 32 != 7)
      throw ShapeError(fmt::format("{}: input has shape {}; the network takes Nx{}x224x224 (224..255 a side: its "
                                   "classifier is sized for a 7x7 feature map, and torchvision's adaptive 7x7 "
                                   "average pool, the identity there, is not implemented)",
                                   name(), shape_str(s), in_channels_));
    Var h = x;
    for (auto& st : features_) {
      if (st.pool) {
        h = (*st.pool)(ctx, h, trace);
        continue;
      }
      h = (*st.conv)(ctx, h, trace);
      if (st.bn) h = (*st.bn)(ctx, h, training, trace);
      h = traced(trace, st.relu_name, "relu", relu(ctx, h));
    }
    h = traced(trace, "flatten", "flatten", flatten(ctx, h));
    h = traced(trace, "classifier.1", "relu", relu(ctx, fc1_(ctx, h, trace)));
    h = drop1_(ctx, h, training, seed_, step_, trace);
    h = traced(trace, "classifier.4", "relu", relu(ctx, fc2_(ctx, h, trace)));
    h = drop2_(ctx, h, training, seed_, step_, trace);
    return fc3_(ctx, h, trace);
  }
  void begin_step(uint64_t seed, int64_t step) override {
    seed_ = seed;
    step_ = step;
  }
  bool stochastic() const override { return true; }

  std::vector<Param> params() override {
    std::vector<Param> p;
    for (auto& st : features_) {
      if (st.conv) st.conv->collect(p);
      if (st.bn) st.bn->collect(p);
    }
    for (Linear* fc : {&fc1_, &fc2_, &fc3_}) fc->collect(p);
    return p;
  }
  std::vector<Buffer> buffers() override {
    std::vector<Buffer> b;
    for (auto& st : features_)
      if (st.bn) st.bn->collect(b);
    return b;
  }
  std::vector<std::pair<std::string, OpKind>> knob_layers() const override {
    std::vector<std::pair<std::string, OpKind>> l;
    for (const auto& st : features_) {
      if (st.conv) l.push_back({st.conv->name(), OpKind::Conv2d});
      if (st.bn) l.push_back({st.bn->name(), OpKind::BatchNorm});
      if (st.pool) l.push_back({st.pool->name(), OpKind::MaxPool2d});
    }
    for (const Linear* fc : {&fc1_, &fc2_, &fc3_}) l.push_back({fc->name(), OpKind::Linear});
    l.push_back({"loss", OpKind::SoftmaxXent});
    return l;
  }
  // torchvision VGG._initialize_weights: convs kaiming-normal fan_out, bias 0; BN 1 / 0;
  // linears normal(0, 0.01), bias 0.
  void init(Context& ctx, uint64_t seed) override {
    for (auto& st : features_) {
      if (st.conv) init_conv_fan_out(ctx, *st.conv, seed);
      if (st.bn) reset_bn_state(ctx, *st.bn);
    }
    for (Linear* fc : {&fc1_, &fc2_, &fc3_}) init_linear_normal_001(ctx, *fc, seed);
  }

 private:
  // One entry of `features`: a max pool, or conv (+ bn) + relu.
  struct Stage {
    std::unique_ptr<Conv2d> conv;
    std::unique_ptr<BatchNorm2d> bn;
    std::unique_ptr<MaxPool2d> pool;
    std::string relu_name;
  };
  int depth_;
  bool bn_;
  int in_channels_;
  std::vector<Stage> features_;
  Linear fc1_;
  Dropout drop1_;
  Linear fc2_;
  Dropout drop2_;
  Linear fc3_;
  uint64_t seed_ = 0;  // from begin_step: the dropout masks' key with the step and layer name
  int64_t step_ = 0;
};

// torchvision's Bottleneck (ResNet v1.5: the stride sits on the 3x3): conv1x1 → bn → relu →
// conv3x3 (stride) → bn → relu → conv1x1 (x4 channels) → bn, plus identity or downsample
// (1x1 conv with the stride + bn, torchvision's downsample.0 / downsample.1), then relu.
struct Bottleneck {
  static constexpr int kExpansion = 4;
  Bottleneck(Context& ctx, const std::string& name, int in, int width, int stride)
      : conv1(ctx, name + ".conv1", in, width, 1, 1, 0, false, Init::HeNormal),
        bn1(ctx, name + ".bn1", width),
        conv2(ctx, name + ".conv2", width, width, 3, stride, 1, false, Init::HeNormal),
        bn2(ctx, name + ".bn2", width),
        conv3(ctx, name + ".conv3", width, width * kExpansion, 1, 1, 0, false, Init::HeNormal),
        bn3(ctx, name + ".bn3", width * kExpansion),
        name(name) {
    if (stride != 1 || in != width * kExpansion) {
      down_conv = std::make_unique<Conv2d>(ctx, name + ".downsample.0", in, width * kExpansion, 1, stride, 0, false,
                                           Init::HeNormal);
      down_bn = std::make_unique<BatchNorm2d>(ctx, name + ".downsample.1", width * kExpansion);
    }
  }
  Var operator()(Context& ctx, const Var& x, bool training, SummaryTrace* trace) {
    Var h = relu(ctx, bn1(ctx, conv1(ctx, x, trace), training, trace));
    h = relu(ctx, bn2(ctx, conv2(ctx, h, trace), training, trace));
    h = bn3(ctx, conv3(ctx, h, trace), training, trace);
    Var shortcut = down_conv ? (*down_bn)(ctx, (*down_conv)(ctx, x, trace), training, trace) : x;
    return traced(trace, name + ".out", "add+relu", relu(ctx, add(ctx, h, shortcut)));
  }
  Conv2d conv1;
  BatchNorm2d bn1;
  Conv2d conv2;
  BatchNorm2d bn2;
  Conv2d conv3;
  BatchNorm2d bn3;
  std::unique_ptr<Conv2d> down_conv;
  std::unique_ptr<BatchNorm2d> down_bn;
  std::string name;
};

// torchvision.models.resnet{50,101,152}: 7x7 stride-2 stem "conv1" + "bn1" + relu, 3x3 stride-2
// "maxpool", stages layer1..layer4 of bottlenecks (widths 64, 128, 256, 512; the first block of
// layers 2-4 strides), global average pool "avgpool", "fc" 2048 → classes. Any input of at least
// 32x32 works (the last stage's map is the input / 32; batch norm in training needs more than
// one value per channel, so batch 1 needs 64x64).
class BottleneckResNet : public Net {
 public:
  BottleneckResNet(Context& ctx, const NetConfig& cfg, int depth)
      : depth_(depth),
        conv1_(ctx, "conv1", cfg.in_channels, 64, 7, 2, 3, false, Init::HeNormal),
        bn1_(ctx, "bn1", 64),
        maxpool_("maxpool", 3, 2, 1),
        fc_(ctx, "fc", 512 * Bottleneck::kExpansion, cfg.num_classes) {
    std::vector<int> blocks;
    if (depth == 50) blocks = {3, 4, 6, 3};
    else if (depth == 101) blocks = {3, 4, 23, 3};
    else blocks = {3, 8, 36, 3};  // 152
    const int widths[] = {64, 128, 256, 512};
    int in = 64;
    for (int stage = 0; stage < 4; ++stage) {
      for (int b = 0; b < blocks[stage]; ++b) {
        int stride = (stage > 0 && b == 0) ? 2 : 1;
        blocks_.push_back(
            std::make_unique<Bottleneck>(ctx, fmt::format("layer{}.{}", stage + 1, b), in, widths[stage], stride));
        in = widths[stage] * Bottleneck::kExpansion;
      }
    }
  }
  std::string name() const override { return fmt::format("resnet{}", depth_); }

  Var forward(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = traced(trace, "relu", "relu", relu(ctx, bn1_(ctx, conv1_(ctx, x, trace), training, trace)));
    h = maxpool_(ctx, h, trace);
    for (auto& b : blocks_) h = (*b)(ctx, h, training, trace);
    h = traced(trace, "avgpool", "global_avg_pool", global_avg_pool(ctx, h));
    return fc_(ctx, h, trace);
  }

  template <class F>
  void each_conv_bn(F&& f) {
    f(conv1_, bn1_);
    for (auto& b : blocks_) {
      f(b->conv1, b->bn1);
      f(b->conv2, b->bn2);
      f(b->conv3, b->bn3);
      if (b->down_conv) f(*b->down_conv, *b->down_bn);
    }
  }

  std::vector<Param> params() override { return conv_bn_params(*this, fc_); }
  std::vector<Buffer> buffers() override { return conv_bn_buffers(*this); }
  std::vector<std::pair<std::string, OpKind>> knob_layers() const override {
    auto* self = const_cast<BottleneckResNet*>(this);
    std::vector<std::pair<std::string, OpKind>> l;
    bool stem = true;
    self->each_conv_bn([&](Conv2d& c, BatchNorm2d& bn) {
      l.push_back({c.name(), OpKind::Conv2d});
      l.push_back({bn.name(), OpKind::BatchNorm});
      if (stem) l.push_back({"maxpool", OpKind::MaxPool2d});
      stem = false;
    });
    l.push_back({"fc", OpKind::Linear});
    l.push_back({"loss", OpKind::SoftmaxXent});
    return l;
  }
  // torchvision ResNet.__init__: convs kaiming-normal fan_out, BN 1 / 0 (zero_init_residual is
  // off by default); fc keeps PyTorch's default Linear init.
  void init(Context& ctx, uint64_t seed) override {
    each_conv_bn([&](Conv2d& c, BatchNorm2d& bn) {
      init_conv_fan_out(ctx, c, seed);
      reset_bn_state(ctx, bn);
    });
    init_linear_torch_default(ctx, fc_, seed);
  }

 private:
  int depth_;
  Conv2d conv1_;
  BatchNorm2d bn1_;
  MaxPool2d maxpool_;
  std::vector<std::unique_ptr<Bottleneck>> blocks_;
  Linear fc_;
};

// The paper's MediumCNN(k): six blocks of conv kxk (padding k/2, "same"; with bias, Keras's
// default) → bn → relu → maxpool 2, widths 16, 32, 64, 128, 256, 512; global average pool; dense
// classes. Layers conv1..6, bn1..6, pool1..6, fc. Glorot-uniform kernels, zero biases, as SmallCNN.
// Six halvings need at least 64x64 inputs (a 32x32 input reaches pool6 at 1x1 and is a ShapeError).
class MediumCnn : public Net {
 public:
  MediumCnn(Context& ctx, const NetConfig& cfg, int k) : k_(k), fc_(ctx, "fc", 512, cfg.num_classes) {
    const int widths[] = {16, 32, 64, 128, 256, 512};
    int in = cfg.in_channels;
    for (int i = 0; i < 6; ++i) {
      convs_.emplace_back(ctx, fmt::format("conv{}", i + 1), in, widths[i], k, 1, k / 2);
      bns_.emplace_back(ctx, fmt::format("bn{}", i + 1), widths[i]);
      pools_.emplace_back(fmt::format("pool{}", i + 1), 2, 2);
      in = widths[i];
    }
  }
  std::string name() const override { return fmt::format("mediumcnn-k{}", k_); }

  Var forward(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = x;
    for (int i = 0; i < 6; ++i) {
      h = bns_[i](ctx, convs_[i](ctx, h, trace), training, trace);
      h = traced(trace, fmt::format("relu{}", i + 1), "relu", relu(ctx, h));
      h = pools_[i](ctx, h, trace);
    }
    h = traced(trace, "gap", "global_avg_pool", global_avg_pool(ctx, h));
    return fc_(ctx, h, trace);
  }
  std::vector<Param> params() override {
    std::vector<Param> p;
    for (int i = 0; i < 6; ++i) {
      convs_[i].collect(p);
      bns_[i].collect(p);
    }
    fc_.collect(p);
    return p;
  }
  std::vector<Buffer> buffers() override {
    std::vector<Buffer> b;
    for (auto& bn : bns_) bn.collect(b);
    return b;
  }
  std::vector<std::pair<std::string, OpKind>> knob_layers() const override {
    std::vector<std::pair<std::string, OpKind>> l;
    for (int i = 0; i < 6; ++i) {
      l.push_back({convs_[i].name(), OpKind::Conv2d});
      l.push_back({bns_[i].name(), OpKind::BatchNorm});
      l.push_back({pools_[i].name(), OpKind::MaxPool2d});
    }
    l.push_back({"fc", OpKind::Linear});
    l.push_back({"loss", OpKind::SoftmaxXent});
    return l;
  }
  void init(Context& ctx, uint64_t seed) override {
    for (auto& c : convs_) init_conv(ctx, c, seed);
    for (auto& bn : bns_) reset_bn_state(ctx, bn);
    init_linear(ctx, fc_, seed);
  }

 private:
  int k_;
  std::vector<Conv2d> convs_;
  std::vector<BatchNorm2d> bns_;
  std::vector<MaxPool2d> pools_;
  Linear fc_;
};

}  // namespace

const std::vector<std::string>& known_models() {
  static const std::vector<std::string> m = {"smallcnn", "smallcnn-bn", "two-conv", "resnet18", "resnet18-imagenet",
                                             "mnist-cnn", "vgg16", "vgg19", "vgg16-bn", "vgg19-bn",
                                             "resnet50", "resnet101", "resnet152", "mediumcnn-k1",
                                             "mediumcnn-k3", "mediumcnn-k5", "mediumcnn-k7", "densenet121",
                                             "densenet201", "mobilenet-v2", "efficientnet-b0", "inception-v3",
                                             "xception",
                                             // the other task kinds (nets/tasks.h)
                                             "unet-small", "stn", "ctc-cnn", "embedding-bag"};
  return m;
}

std::unique_ptr<Net> make_net(Context& ctx, const NetConfig& cfg) {
  if (cfg.num_classes < 2) throw Error(fmt::format("model {}: need at least 2 classes, got {}", cfg.model, cfg.num_classes));
  if (cfg.model == "smallcnn") return std::make_unique<SmallCnn>(ctx, cfg, false);
  if (cfg.model == "smallcnn-bn") return std::make_unique<SmallCnn>(ctx, cfg, true);
  if (cfg.model == "two-conv") return std::make_unique<TwoConv>(ctx, cfg);
  if (cfg.model == "resnet18") return std::make_unique<ResNet18>(ctx, cfg, false);
  if (cfg.model == "resnet18-imagenet") return std::make_unique<ResNet18>(ctx, cfg, true);
  if (cfg.model == "mnist-cnn") return std::make_unique<MnistCnn>(ctx, cfg);
  if (cfg.model == "vgg16") return std::make_unique<Vgg>(ctx, cfg, 16, false);
  if (cfg.model == "vgg19") return std::make_unique<Vgg>(ctx, cfg, 19, false);
  if (cfg.model == "vgg16-bn") return std::make_unique<Vgg>(ctx, cfg, 16, true);
  if (cfg.model == "vgg19-bn") return std::make_unique<Vgg>(ctx, cfg, 19, true);
  if (cfg.model == "resnet50") return std::make_unique<BottleneckResNet>(ctx, cfg, 50);
  if (cfg.model == "resnet101") return std::make_unique<BottleneckResNet>(ctx, cfg, 101);
  if (cfg.model == "resnet152") return std::make_unique<BottleneckResNet>(ctx, cfg, 152);
  for (int k : {1, 3, 5, 7})
    if (cfg.model == fmt::format("mediumcnn-k{}", k)) return std::make_unique<MediumCnn>(ctx, cfg, k);
  if (cfg.model == "densenet121") return zoo::make_densenet(ctx, cfg, 121);
  if (cfg.model == "densenet201") return zoo::make_densenet(ctx, cfg, 201);
  if (cfg.model == "mobilenet-v2") return zoo::make_mobilenet_v2(ctx, cfg);
  if (cfg.model == "efficientnet-b0") return zoo::make_efficientnet_b0(ctx, cfg);
  if (cfg.model == "inception-v3") return zoo::make_inception_v3(ctx, cfg);
  if (cfg.model == "xception") return zoo::make_xception(ctx, cfg);
  if (auto net = tasks::make_task_net(ctx, cfg)) return net;
  throw Error(fmt::format("unknown model '{}'; known models: {}", cfg.model, fmt::join(known_models(), ", ")));
}

}  // namespace ditto
