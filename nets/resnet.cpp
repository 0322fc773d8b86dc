// ResNet-18 for CIFAR and ImageNet-size inputs, and torchvision's ResNet-34 (BasicBlocks) and
// bottleneck ResNet-50/101/152 (nets.h documents them).
#include <fmt/format.h>

#include <cmath>

#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "nets/detail/families.h"
#include "nets/zoo.h"

namespace ditto::zoo {
namespace {

// A residual block: each (conv, batch norm) pair of the path, with a relu after every pair but
// the last; the last pair's output plus the shortcut (the input, or a strided 1x1 conv + batch
// norm when the stride or the width changes), then relu. Two 3x3 pairs make torchvision's
// BasicBlock; 1x1 → 3x3 (the stride: ResNet v1.5) → 1x1 x4 its Bottleneck.
struct ResidualBlock {
  std::string name;
  std::vector<std::pair<Conv2d*, BatchNorm2d*>> path;
  Conv2d* down_conv = nullptr;  // none: identity shortcut
  BatchNorm2d* down_bn = nullptr;
  Var operator()(Context& ctx, const Var& x, bool training, SummaryTrace* trace) const {
    Var h = x;
    for (std::size_t i = 0; i < path.size(); ++i) {
      h = (*path[i].second)(ctx, (*path[i].first)(ctx, h, trace), training, trace);
      if (i + 1 < path.size()) h = relu(ctx, h);
    }
    Var shortcut = down_conv ? (*down_bn)(ctx, (*down_conv)(ctx, x, trace), training, trace) : x;
    return traced(trace, name + ".out", "add+relu", relu(ctx, add(ctx, h, shortcut)));
  }
};

// Residual blocks per stage (layer1..4) of each depth.
std::vector<int> blocks_per_stage(int depth) {
  switch (depth) {
    case 18: return {2, 2, 2, 2};
    case 34:
    case 50: return {3, 4, 6, 3};
    case 101: return {3, 4, 23, 3};
    default: return {3, 8, 36, 3};  // 152
  }
}

// Stem conv → bn → relu [→ max pool] → layer1..4 (widths 64, 128, 256, 512; the first block of
// layers 2-4 strides) → global average pool "avgpool" → fc. Two choices shape it: BasicBlocks or
// Bottlenecks (depth >= 50), and ResNet-18's own layer names and init or torchvision's (every
// depth but 18).
//   resnet18           3x3 stride-1 stem, no pool; BasicBlocks [2, 2, 2, 2] with shortcut layers
//                      "<block>.downsample.conv" / ".bn"; convs He-normal fan_in, fc Glorot-uniform.
//   resnet18-imagenet  the same with a 7x7 stride-2 stem and a 3x3 stride-2 max pool "pool1"
//                      (created after the blocks, so it is listed last among the knob layers).
//   resnet34           torchvision's: 7x7 stride-2 stem, max pool "maxpool", BasicBlocks [3, 4, 6,
//                      3] with "<block>.downsample.0" / ".1"; convs He-normal fan_out, fc
//                      PyTorch's default Linear init.
//   resnet50/101/152   torchvision's likewise, with Bottlenecks [3, 4, 6, 3] / [3, 4, 23, 3] /
//                      [3, 8, 36, 3].
class ResNet : public ZooNet {
 public:
  ResNet(Context& ctx, const NetConfig& cfg, int depth, bool imagenet_stem)
      : ZooNet({cfg.in_channels, 1, 0, ""}),
        depth_(depth),
        imagenet_(imagenet_stem),
        bottleneck_(depth >= 50),
        torchvision_(depth != 18) {
    const int stem_kernel = imagenet_ ? 7 : 3;
    conv1_ = &add_conv(ctx, "conv1", cfg.in_channels, 64, stem_kernel, imagenet_ ? 2 : 1, stem_kernel / 2, false,
                       Init::HeNormal);
    bn1_ = &add_bn(ctx, "bn1", 64);
    if (torchvision_) pool_ = &add_max_pool("maxpool", 3, 2, 1);
    const std::vector<int> blocks = blocks_per_stage(depth);
    const int widths[] = {64, 128, 256, 512};
    int in = 64;
    for (int stage = 0; stage < 4; ++stage)
      for (int b = 0; b < blocks[std::size_t(stage)]; ++b) {
        const int stride = (stage > 0 && b == 0) ? 2 : 1;
        blocks_.push_back(add_block(ctx, fmt::format("layer{}.{}", stage + 1, b), in, widths[stage], stride));
        in = widths[stage] * expansion();
      }
    if (!torchvision_ && imagenet_) pool_ = &add_max_pool("pool1", 3, 2, 1);
    fc_ = &add_linear(ctx, "fc", 512 * expansion(), cfg.num_classes, Init::GlorotUniform);
  }
  std::string name() const override {
    return depth_ == 18 ? (imagenet_ ? "resnet18-imagenet" : "resnet18") : fmt::format("resnet{}", depth_);
  }

  // ResNet-18: He-normal (fan_in) convs, fc Glorot-uniform with bias 0. torchvision's
  // ResNet.__init__ (34/50/101/152): convs kaiming-normal fan_out, BN 1 / 0 (zero_init_residual
  // is off by default); fc keeps PyTorch's default Linear init, weight and bias uniform in
  // +-1/sqrt(in_features).
  void init(Context& ctx, uint64_t seed) override {
    each_layer(
        [&](Conv2d& c) { torchvision_ ? init_conv_he_fan_out(ctx, c, seed) : init_conv_he_fan_in(ctx, c, seed); },
        [&](BatchNorm2d& bn) { reset_bn(ctx, bn); },
        [&](Linear& fc) {
          if (torchvision_)
            init_linear_uniform(ctx, fc, 1.0 / std::sqrt(double(fc.weight.value().shape()[1])), true, seed);
          else
            init_linear_glorot(ctx, fc, seed);
        });
  }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = relu(ctx, (*bn1_)(ctx, (*conv1_)(ctx, x, trace), training, trace));
    h = traced(trace, torchvision_ ? "relu" : "relu1", "relu", h);
    if (pool_) h = (*pool_)(ctx, h, trace);
    for (const ResidualBlock& b : blocks_) h = b(ctx, h, training, trace);
    h = traced(trace, "avgpool", "global_avg_pool", global_avg_pool(ctx, h));
    return (*fc_)(ctx, h, trace);
  }

 private:
  int expansion() const { return bottleneck_ ? 4 : 1; }

  // One block of `width` (its output: width x expansion), its layers created in torchvision's
  // state_dict order: the path's (conv, bn) pairs, then the shortcut's when the stride or the
  // width changes.
  ResidualBlock add_block(Context& ctx, std::string name, int in, int width, int stride) {
    const int out = width * expansion();
    ResidualBlock blk;
    blk.name = std::move(name);
    auto pair = [&](int i, int cin, int cout, int kernel, int s) {
      Conv2d* c = &add_conv(ctx, fmt::format("{}.conv{}", blk.name, i), cin, cout, kernel, s, kernel / 2, false,
                            Init::HeNormal);
      blk.path.push_back({c, &add_bn(ctx, fmt::format("{}.bn{}", blk.name, i), cout)});
    };
    if (bottleneck_) {
      pair(1, in, width, 1, 1);
      pair(2, width, width, 3, stride);
      pair(3, width, out, 1, 1);
    } else {
      pair(1, in, out, 3, stride);
      pair(2, out, out, 3, 1);
    }
    if (stride != 1 || in != out) {
      const char* conv = torchvision_ ? "0" : "conv";
      const char* bn = torchvision_ ? "1" : "bn";
      blk.down_conv = &add_conv(ctx, fmt::format("{}.downsample.{}", blk.name, conv), in, out, 1, stride, 0, false,
                                Init::HeNormal);
      blk.down_bn = &add_bn(ctx, fmt::format("{}.downsample.{}", blk.name, bn), out);
    }
    return blk;
  }

  int depth_;
  bool imagenet_;
  bool bottleneck_;   // Bottleneck blocks (1x1 → 3x3 → 1x1 x4), else BasicBlocks (3x3 → 3x3)
  bool torchvision_;  // torchvision's layer names ("maxpool", "downsample.0" / ".1") and init
  Conv2d* conv1_ = nullptr;
  BatchNorm2d* bn1_ = nullptr;
  MaxPool2d* pool_ = nullptr;  // none for the CIFAR ResNet-18
  std::vector<ResidualBlock> blocks_;
  Linear* fc_ = nullptr;
};

}  // namespace

std::unique_ptr<Net> make_resnet18(Context& ctx, const NetConfig& cfg, bool imagenet_stem) {
  return std::make_unique<ResNet>(ctx, cfg, 18, imagenet_stem);
}

std::unique_ptr<Net> make_torchvision_resnet(Context& ctx, const NetConfig& cfg, int depth) {
  return std::make_unique<ResNet>(ctx, cfg, depth, true);
}

}  // namespace ditto::zoo
