// torchvision.models.inception_v3 (without the auxiliary head) and keras.applications.Xception
// (nets.h documents them).
#include <fmt/format.h>

#include <cmath>

#include "kernels/activation.h"
#include "kernels/concat.h"
#include "kernels/elementwise.h"
#include "nets/detail/families.h"
#include "nets/zoo.h"

namespace ditto::zoo {
namespace {

// ---- Inception-v3 ----

// torchvision's BasicConv2d: conv (no bias) "<name>.conv" → batch norm (eps 0.001) "<name>.bn" → relu.
struct BasicConv {
  Conv2d* conv = nullptr;
  BatchNorm2d* bn = nullptr;
  Var operator()(Context& ctx, const Var& x, bool training, SummaryTrace* trace) const {
    return relu(ctx, (*bn)(ctx, (*conv)(ctx, x, trace), training, trace));
  }
};

// F.avg_pool2d(x, kernel_size=3, stride=1, padding=1): count_include_pad=True, PyTorch's default
// and the divisor ditto's avg_pool2d always uses (9 at the border too).
Var avg_pool_3x3_same(Context& ctx, const Var& x) {
  PoolParams p;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 1;
  p.pad_h = p.pad_w = 1;
  return avg_pool2d(ctx, x, p);
}

class InceptionV3 : public ZooNet {
 public:
  static constexpr int kMinSide = 75;  // torchvision's minimum: Mixed_7a's stride-2 3x3 needs a 3x3 map

  InceptionV3(Context& ctx, const NetConfig& cfg)
      : ZooNet({cfg.in_channels, kMinSide, 0, "torchvision's minimum; 299x299 is its design size"}) {
    conv1a_ = basic(ctx, "Conv2d_1a_3x3", cfg.in_channels, 32, 3, 3, 2, 0, 0);
    conv2a_ = basic(ctx, "Conv2d_2a_3x3", 32, 32, 3, 3, 1, 0, 0);
    conv2b_ = basic(ctx, "Conv2d_2b_3x3", 32, 64, 3, 3, 1, 1, 1);
    maxpool1_ = &add_max_pool("maxpool1", 3, 2, 0);
    conv3b_ = basic(ctx, "Conv2d_3b_1x1", 64, 80, 1, 1, 1, 0, 0);
    conv4a_ = basic(ctx, "Conv2d_4a_3x3", 80, 192, 3, 3, 1, 0, 0);
    maxpool2_ = &add_max_pool("maxpool2", 3, 2, 0);
    mixed_a(ctx, "Mixed_5b", 192, 32);
    mixed_a(ctx, "Mixed_5c", 256, 64);
    mixed_a(ctx, "Mixed_5d", 288, 64);
    mixed_b(ctx, "Mixed_6a", 288);
    mixed_c(ctx, "Mixed_6b", 768, 128);
    mixed_c(ctx, "Mixed_6c", 768, 160);
    mixed_c(ctx, "Mixed_6d", 768, 160);
    mixed_c(ctx, "Mixed_6e", 768, 192);
    // torchvision's AuxLogits (InceptionAux on Mixed_6e) would sit here; see nets.h.
    mixed_d(ctx, "Mixed_7a", 768);
    mixed_e(ctx, "Mixed_7b", 1280);
    mixed_e(ctx, "Mixed_7c", 2048);
    dropout_ = &add_dropout("dropout", 0.5f);
    fc_ = &add_linear(ctx, "fc", 2048, cfg.num_classes, Init::GlorotUniform);
  }
  std::string name() const override { return "inception-v3"; }

  // torchvision Inception3.__init__ with init_weights (the default without pretrained weights):
  // every conv and linear weight trunc_normal_(std=0.1, a=-2, b=2), BN 1 / 0. fc's bias is left
  // at PyTorch's default nn.Linear init, uniform +-1/sqrt(2048). The bounds +-2 are 20 standard
  // deviations: ditto's Box-Muller draws from 32-bit uniforms never exceed 6.7 standard
  // deviations, so plain normal(0, 0.1) is the same rule.
  void init(Context& ctx, uint64_t seed) override {
    each_layer([&](Conv2d& c) { init_weight_normal(ctx, c.name() + ".weight", c.weight, 0.1, seed); },
               [&](BatchNorm2d& bn) { reset_bn(ctx, bn); },
               [&](Linear& fc) {
                 init_weight_normal(ctx, fc.name() + ".weight", fc.weight, 0.1, seed);
                 const double in = double(fc.weight.value().shape()[1]);
                 init_uniform(ctx, fc.name() + ".bias", fc.bias, 1.0 / std::sqrt(in), seed);
               });
  }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = conv1a_(ctx, x, training, trace);
    h = conv2a_(ctx, h, training, trace);
    h = conv2b_(ctx, h, training, trace);
    h = (*maxpool1_)(ctx, h, trace);
    h = conv3b_(ctx, h, training, trace);
    h = conv4a_(ctx, h, training, trace);
    h = (*maxpool2_)(ctx, h, trace);
    for (Mixed& m : mixed_) h = traced(trace, m.name, "concat", m.forward(ctx, h, training, trace));
    h = traced(trace, "avgpool", "global_avg_pool", global_avg_pool(ctx, h));
    h = (*dropout_)(ctx, h, training, seed_, step_, trace);
    return (*fc_)(ctx, h, trace);
  }

 private:
  // One Mixed_* block: its branches in torchvision's output order, each a chain of BasicConvs
  // (possibly after a pool) whose output is one group of channels, or two parallel convs on the
  // chain's output (InceptionE's 1x3 / 3x1 splits) giving two groups.
  struct Branch {
    enum class Pool { None, Avg3x3, Max3x3s2 } pool = Pool::None;
    MaxPool2d* max_pool = nullptr;
    std::vector<BasicConv> chain;
    std::vector<BasicConv> split;  // empty, or two convs applied to the chain's output
  };
  struct Mixed {
    std::string name;
    std::vector<Branch> branches;
    Var forward(Context& ctx, const Var& x, bool training, SummaryTrace* trace) const {
      std::vector<Var> outs;
      for (const Branch& b : branches) {
        Var h = x;
        if (b.pool == Branch::Pool::Avg3x3) h = avg_pool_3x3_same(ctx, h);
        if (b.pool == Branch::Pool::Max3x3s2) h = (*b.max_pool)(ctx, h, trace);
        for (const BasicConv& c : b.chain) h = c(ctx, h, training, trace);
        if (b.split.empty()) {
          outs.push_back(h);
        } else {
          // torchvision: torch.cat([branch_2a(h), branch_2b(h)], 1), then the next branch.
          Var first = b.split[0](ctx, h, training, trace);
          outs.push_back(concat_channels(ctx, {first, b.split[1](ctx, h, training, trace)}));
        }
      }
      return concat_channels(ctx, outs);
    }
  };

  BasicConv basic(Context& ctx, const std::string& name, int in, int out, int kh, int kw, int stride, int ph, int pw) {
    BasicConv c;
    c.conv = &add_conv(ctx, name + ".conv", in, out, kh, kw, stride, ph, pw, false, Init::HeNormal);
    c.bn = &add_bn(ctx, name + ".bn", out, 0.1f, 0.001f);
    return c;
  }
  BasicConv basic1x1(Context& ctx, const std::string& name, int in, int out) {
    return basic(ctx, name, in, out, 1, 1, 1, 0, 0);
  }

  // The blocks' modules are created in torchvision's __init__ order (its state_dict order),
  // which is not always the forward's branch order, so branches are filled in afterwards.
  void mixed_a(Context& ctx, const std::string& n, int in, int pool_features) {
    Mixed m{n, std::vector<Branch>(4)};
    m.branches[0].chain = {basic1x1(ctx, n + ".branch1x1", in, 64)};
    m.branches[1].chain = {basic1x1(ctx, n + ".branch5x5_1", in, 48),
                           basic(ctx, n + ".branch5x5_2", 48, 64, 5, 5, 1, 2, 2)};
    m.branches[2].chain = {basic1x1(ctx, n + ".branch3x3dbl_1", in, 64),
                           basic(ctx, n + ".branch3x3dbl_2", 64, 96, 3, 3, 1, 1, 1),
                           basic(ctx, n + ".branch3x3dbl_3", 96, 96, 3, 3, 1, 1, 1)};
    m.branches[3].pool = Branch::Pool::Avg3x3;
    m.branches[3].chain = {basic1x1(ctx, n + ".branch_pool", in, pool_features)};
    mixed_.push_back(std::move(m));
  }
  void mixed_b(Context& ctx, const std::string& n, int in) {
    Mixed m{n, std::vector<Branch>(3)};
    m.branches[0].chain = {basic(ctx, n + ".branch3x3", in, 384, 3, 3, 2, 0, 0)};
    m.branches[1].chain = {basic1x1(ctx, n + ".branch3x3dbl_1", in, 64),
                           basic(ctx, n + ".branch3x3dbl_2", 64, 96, 3, 3, 1, 1, 1),
                           basic(ctx, n + ".branch3x3dbl_3", 96, 96, 3, 3, 2, 0, 0)};
    // torchvision's F.max_pool2d(x, kernel_size=3, stride=2), the forward's "branch_pool".
    m.branches[2].pool = Branch::Pool::Max3x3s2;
    m.branches[2].max_pool = &add_max_pool(n + ".branch_pool", 3, 2, 0);
    mixed_.push_back(std::move(m));
  }
  void mixed_c(Context& ctx, const std::string& n, int in, int c7) {
    Mixed m{n, std::vector<Branch>(4)};
    m.branches[0].chain = {basic1x1(ctx, n + ".branch1x1", in, 192)};
    m.branches[1].chain = {basic1x1(ctx, n + ".branch7x7_1", in, c7),
                           basic(ctx, n + ".branch7x7_2", c7, c7, 1, 7, 1, 0, 3),
                           basic(ctx, n + ".branch7x7_3", c7, 192, 7, 1, 1, 3, 0)};
    m.branches[2].chain = {basic1x1(ctx, n + ".branch7x7dbl_1", in, c7),
                           basic(ctx, n + ".branch7x7dbl_2", c7, c7, 7, 1, 1, 3, 0),
                           basic(ctx, n + ".branch7x7dbl_3", c7, c7, 1, 7, 1, 0, 3),
                           basic(ctx, n + ".branch7x7dbl_4", c7, c7, 7, 1, 1, 3, 0),
                           basic(ctx, n + ".branch7x7dbl_5", c7, 192, 1, 7, 1, 0, 3)};
    m.branches[3].pool = Branch::Pool::Avg3x3;
    m.branches[3].chain = {basic1x1(ctx, n + ".branch_pool", in, 192)};
    mixed_.push_back(std::move(m));
  }
  void mixed_d(Context& ctx, const std::string& n, int in) {
    Mixed m{n, std::vector<Branch>(3)};
    m.branches[0].chain = {basic1x1(ctx, n + ".branch3x3_1", in, 192),
                           basic(ctx, n + ".branch3x3_2", 192, 320, 3, 3, 2, 0, 0)};
    m.branches[1].chain = {basic1x1(ctx, n + ".branch7x7x3_1", in, 192),
                           basic(ctx, n + ".branch7x7x3_2", 192, 192, 1, 7, 1, 0, 3),
                           basic(ctx, n + ".branch7x7x3_3", 192, 192, 7, 1, 1, 3, 0),
                           basic(ctx, n + ".branch7x7x3_4", 192, 192, 3, 3, 2, 0, 0)};
    m.branches[2].pool = Branch::Pool::Max3x3s2;
    m.branches[2].max_pool = &add_max_pool(n + ".branch_pool", 3, 2, 0);
    mixed_.push_back(std::move(m));
  }
  void mixed_e(Context& ctx, const std::string& n, int in) {
    Mixed m{n, std::vector<Branch>(4)};
    m.branches[0].chain = {basic1x1(ctx, n + ".branch1x1", in, 320)};
    m.branches[1].chain = {basic1x1(ctx, n + ".branch3x3_1", in, 384)};
    m.branches[1].split = {basic(ctx, n + ".branch3x3_2a", 384, 384, 1, 3, 1, 0, 1),
                           basic(ctx, n + ".branch3x3_2b", 384, 384, 3, 1, 1, 1, 0)};
    m.branches[2].chain = {basic1x1(ctx, n + ".branch3x3dbl_1", in, 448),
                           basic(ctx, n + ".branch3x3dbl_2", 448, 384, 3, 3, 1, 1, 1)};
    m.branches[2].split = {basic(ctx, n + ".branch3x3dbl_3a", 384, 384, 1, 3, 1, 0, 1),
                           basic(ctx, n + ".branch3x3dbl_3b", 384, 384, 3, 1, 1, 1, 0)};
    m.branches[3].pool = Branch::Pool::Avg3x3;
    m.branches[3].chain = {basic1x1(ctx, n + ".branch_pool", in, 192)};
    mixed_.push_back(std::move(m));
  }

  BasicConv conv1a_, conv2a_, conv2b_, conv3b_, conv4a_;
  MaxPool2d* maxpool1_ = nullptr;
  MaxPool2d* maxpool2_ = nullptr;
  std::vector<Mixed> mixed_;
  Dropout* dropout_ = nullptr;
  Linear* fc_ = nullptr;
};

// ---- Xception ----

// Keras's SeparableConv2D(filters, 3, padding="same", use_bias=False): a 3x3 depthwise conv
// (groups = input channels, padding 1) "<name>.depthwise" then a 1x1 pointwise conv
// "<name>.pointwise" — Keras's depthwise_kernel and pointwise_kernel of layer <name>, as two
// ditto layers because each has its own convolution knobs.
struct SepConv {
  Conv2d* depthwise = nullptr;
  Conv2d* pointwise = nullptr;
  BatchNorm2d* bn = nullptr;  // the BatchNormalization "<name>_bn" that follows it
  Var operator()(Context& ctx, const Var& x, bool training, SummaryTrace* trace) const {
    return (*bn)(ctx, (*pointwise)(ctx, (*depthwise)(ctx, x, trace), trace), training, trace);
  }
};

class Xception : public ZooNet {
 public:
  static constexpr int kMinSide = 71;  // keras.applications.Xception's min_size

  Xception(Context& ctx, const NetConfig& cfg)
      : ZooNet({cfg.in_channels, kMinSide, 0, "Keras's minimum; 299x299 is its design size"}) {
    conv1_ = &add_conv(ctx, "block1_conv1", cfg.in_channels, 32, 3, 2, 0, false, Init::GlorotUniform);
    bn1_ = &bn(ctx, "block1_conv1_bn", 32);
    conv2_ = &add_conv(ctx, "block1_conv2", 32, 64, 3, 1, 0, false, Init::GlorotUniform);
    bn2_ = &bn(ctx, "block1_conv2_bn", 64);
    // Entry flow: blocks 2-4, each with a strided 1x1 conv + BN shortcut; Keras leaves those two
    // layers unnamed, so they carry its automatic names in a fresh session: conv2d, conv2d_1, ...
    // and batch_normalization, batch_normalization_1, ...
    int in = 64, auto_id = 0;
    for (int b = 2; b <= 4; ++b) {
      const int out = b == 2 ? 128 : b == 3 ? 256 : 728;
      Block blk;
      shortcut(ctx, blk, in, out, auto_id++);
      blk.seps.push_back(sep(ctx, fmt::format("block{}_sepconv1", b), in, out));
      blk.seps.push_back(sep(ctx, fmt::format("block{}_sepconv2", b), out, out));
      blk.pool = &add_max_pool(fmt::format("block{}_pool", b), 3, 2, 1);
      blk.relu_first = b != 2;  // block 2 follows block1_conv2_act directly
      blk.name = fmt::format("block{}", b);
      blocks_.push_back(std::move(blk));
      in = out;
    }
    // Middle flow: blocks 5-12, three relu → separable conv → BN each, identity shortcut.
    for (int b = 5; b <= 12; ++b) {
      Block blk;
      for (int i = 1; i <= 3; ++i) blk.seps.push_back(sep(ctx, fmt::format("block{}_sepconv{}", b, i), 728, 728));
      blk.relu_first = true;
      blk.name = fmt::format("block{}", b);
      blocks_.push_back(std::move(blk));
    }
    // Exit flow: block 13 (shortcut conv to 1024), then block 14 without a shortcut.
    Block b13;
    shortcut(ctx, b13, 728, 1024, auto_id++);
    b13.seps.push_back(sep(ctx, "block13_sepconv1", 728, 728));
    b13.seps.push_back(sep(ctx, "block13_sepconv2", 728, 1024));
    b13.pool = &add_max_pool("block13_pool", 3, 2, 1);
    b13.relu_first = true;
    b13.name = "block13";
    blocks_.push_back(std::move(b13));
    sep14_1_ = sep(ctx, "block14_sepconv1", 1024, 1536);
    sep14_2_ = sep(ctx, "block14_sepconv2", 1536, 2048);
    predictions_ = &add_linear(ctx, "predictions", 2048, cfg.num_classes, Init::GlorotUniform);
  }
  std::string name() const override { return "xception"; }

  // Keras's defaults: glorot_uniform kernels (Conv2D, both SeparableConv2D kernels, Dense), zero
  // Dense bias, BN gamma 1, beta 0, moving mean 0, moving variance 1.
  void init(Context& ctx, uint64_t seed) override { init_keras(ctx, seed); }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = (*bn1_)(ctx, (*conv1_)(ctx, x, trace), training, trace);
    h = traced(trace, "block1_conv1_act", "relu", relu(ctx, h));
    h = traced(trace, "block1_conv2_act", "relu", relu(ctx, (*bn2_)(ctx, (*conv2_)(ctx, h, trace), training, trace)));
    for (const Block& b : blocks_) {
      Var residual = b.shortcut_conv ? (*b.shortcut_bn)(ctx, (*b.shortcut_conv)(ctx, h, trace), training, trace) : h;
      Var y = h;
      for (std::size_t i = 0; i < b.seps.size(); ++i) {
        // Keras applies "<block>_sepconv<i>_act" (relu) before every separable conv but block 2's first.
        if (i > 0 || b.relu_first) y = relu(ctx, y);
        y = b.seps[i](ctx, y, training, trace);
      }
      if (b.pool) y = (*b.pool)(ctx, y, trace);
      h = traced(trace, b.name + "_add", "add", add(ctx, y, residual));
    }
    h = traced(trace, "block14_sepconv1_act", "relu", relu(ctx, sep14_1_(ctx, h, training, trace)));
    h = traced(trace, "block14_sepconv2_act", "relu", relu(ctx, sep14_2_(ctx, h, training, trace)));
    h = traced(trace, "avg_pool", "global_avg_pool", global_avg_pool(ctx, h));
    return (*predictions_)(ctx, h, trace);  // Keras applies softmax here; ditto's loss takes logits
  }

 private:
  struct Block {
    std::string name;
    Conv2d* shortcut_conv = nullptr;  // none: identity shortcut
    BatchNorm2d* shortcut_bn = nullptr;
    std::vector<SepConv> seps;
    MaxPool2d* pool = nullptr;  // Keras's MaxPooling2D(3, strides=2, padding="same"); see nets.h
    bool relu_first = true;
  };
  BatchNorm2d& bn(Context& ctx, const std::string& name, int channels) {
    return add_bn(ctx, name, channels, kKerasBnMomentum, kKerasBnEps);
  }
  SepConv sep(Context& ctx, const std::string& name, int in, int out) {
    SepConv s;
    s.depthwise = &add_conv(ctx, name + ".depthwise", in, in, 3, 1, 1, false, Init::GlorotUniform, in);
    s.pointwise = &add_conv(ctx, name + ".pointwise", in, out, 1, 1, 0, false, Init::GlorotUniform);
    s.bn = &bn(ctx, name + "_bn", out);
    return s;
  }
  // Keras's Conv2D(out, 1, strides=2, padding="same", use_bias=False) + BatchNormalization: for a
  // 1x1 kernel "same" pads nothing, so padding 0 gives Keras's ceil(side / 2).
  void shortcut(Context& ctx, Block& blk, int in, int out, int auto_id) {
    const std::string suffix = auto_id == 0 ? "" : fmt::format("_{}", auto_id);
    blk.shortcut_conv = &add_conv(ctx, "conv2d" + suffix, in, out, 1, 2, 0, false, Init::GlorotUniform);
    blk.shortcut_bn = &bn(ctx, "batch_normalization" + suffix, out);
  }

  Conv2d* conv1_ = nullptr;
  BatchNorm2d* bn1_ = nullptr;
  Conv2d* conv2_ = nullptr;
  BatchNorm2d* bn2_ = nullptr;
  std::vector<Block> blocks_;
  SepConv sep14_1_, sep14_2_;
  Linear* predictions_ = nullptr;
};

}  // namespace

std::unique_ptr<Net> make_inception_v3(Context& ctx, const NetConfig& cfg) {
  return std::make_unique<InceptionV3>(ctx, cfg);
}

std::unique_ptr<Net> make_xception(Context& ctx, const NetConfig& cfg) { return std::make_unique<Xception>(ctx, cfg); }

}  // namespace ditto::zoo
