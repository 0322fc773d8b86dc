#include "nets/nets.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/error.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"

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

  std::vector<Param> params() override {
    std::vector<Param> p;
    each_conv_bn([&](Conv2d& c, BatchNorm2d& bn) {
      c.collect(p);
      bn.collect(p);
    });
    fc_.collect(p);
    return p;
  }
  std::vector<Buffer> buffers() override {
    std::vector<Buffer> out;
    each_conv_bn([&](Conv2d&, BatchNorm2d& bn) { bn.collect(out); });
    return out;
  }
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

}  // namespace

const std::vector<std::string>& known_models() {
  static const std::vector<std::string> m = {"smallcnn", "smallcnn-bn", "two-conv", "resnet18", "resnet18-imagenet",
                                             "mnist-cnn"};
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
  throw Error(fmt::format("unknown model '{}'; known models: {}", cfg.model, fmt::join(known_models(), ", ")));
}

}  // namespace ditto
