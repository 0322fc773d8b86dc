// torchvision.models.densenet121 / densenet169 / densenet201 (nets.h documents them).
#include <fmt/format.h>

#include <cmath>

#include "kernels/activation.h"
#include "kernels/concat.h"
#include "kernels/elementwise.h"
#include "nets/detail/families.h"
#include "nets/zoo.h"

namespace ditto::zoo {
namespace {

// torchvision's DenseNet(growth_rate=32, block_config, num_init_features=64, bn_size=4,
// drop_rate=0), module for module. Layer names are torchvision's module paths
// ("features.denseblock2.denselayer7.conv1", "features.transition1.norm", "classifier"), created in
// the order of its state_dict. drop_rate is 0 for all three, so there is no dropout and the
// net is not stochastic. torchvision's memory_efficient checkpointing changes memory, not values,
// and is not reproduced.
class DenseNet : public ZooNet {
 public:
  static constexpr int kGrowth = 32, kBnSize = 4, kInitFeatures = 64;

  // conv0 and pool0 halve the side (rounding up), each transition's pool halves it (rounding
  // down): 29 is the smallest side that leaves the last block a 1x1 map.
  static constexpr int kMinSide = 29;

  DenseNet(Context& ctx, const NetConfig& cfg, int depth)
      : ZooNet({cfg.in_channels, kMinSide, 0,
                "conv0, pool0 and the three transitions' 2x2 average pools must leave the last block 1x1"}),
        depth_(depth) {
    // torchvision's block_config per depth.
    const std::vector<int> blocks = depth == 121   ? std::vector<int>{6, 12, 24, 16}
                                    : depth == 169 ? std::vector<int>{6, 12, 32, 32}
                                                   : std::vector<int>{6, 12, 48, 32};  // 201
    conv0_ = &add_conv(ctx, "features.conv0", cfg.in_channels, kInitFeatures, 7, 2, 3, false, Init::HeNormal);
    norm0_ = &add_bn(ctx, "features.norm0", kInitFeatures);
    pool0_ = &add_max_pool("features.pool0", 3, 2, 1);
    int features = kInitFeatures;
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      Block block;
      for (int i = 0; i < blocks[b]; ++i) {
        const std::string name = fmt::format("features.denseblock{}.denselayer{}", b + 1, i + 1);
        const int in = features + i * kGrowth;
        DenseLayer l;
        l.name = name;
        l.norm1 = &add_bn(ctx, name + ".norm1", in);
        l.conv1 = &add_conv(ctx, name + ".conv1", in, kBnSize * kGrowth, 1, 1, 0, false, Init::HeNormal);
        l.norm2 = &add_bn(ctx, name + ".norm2", kBnSize * kGrowth);
        l.conv2 = &add_conv(ctx, name + ".conv2", kBnSize * kGrowth, kGrowth, 3, 1, 1, false, Init::HeNormal);
        block.layers.push_back(l);
      }
      block.name = fmt::format("features.denseblock{}", b + 1);
      features += blocks[b] * kGrowth;
      if (b + 1 != blocks.size()) {
        block.transition = fmt::format("features.transition{}", b + 1);
        block.trans_norm = &add_bn(ctx, block.transition + ".norm", features);
        block.trans_conv = &add_conv(ctx, block.transition + ".conv", features, features / 2, 1, 1, 0, false,
                                     Init::HeNormal);
        features /= 2;
      }
      blocks_.push_back(std::move(block));
    }
    norm5_ = &add_bn(ctx, "features.norm5", features);
    classifier_ = &add_linear(ctx, "classifier", features, cfg.num_classes, Init::GlorotUniform);
  }
  std::string name() const override { return fmt::format("densenet{}", depth_); }

  // torchvision DenseNet.__init__: convs kaiming_normal_ (fan_in, relu gain), BN 1 / 0, linear
  // bias 0 with the weight left at PyTorch's default nn.Linear init, uniform +-1/sqrt(in).
  void init(Context& ctx, uint64_t seed) override {
    each_layer([&](Conv2d& c) { init_conv_he_fan_in(ctx, c, seed); }, [&](BatchNorm2d& bn) { reset_bn(ctx, bn); },
               [&](Linear& fc) {
                 init_linear_uniform(ctx, fc, 1.0 / std::sqrt(double(fc.weight.value().shape()[1])), false, seed);
               });
  }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = (*norm0_)(ctx, (*conv0_)(ctx, x, trace), training, trace);
    h = traced(trace, "features.relu0", "relu", relu(ctx, h));
    h = (*pool0_)(ctx, h, trace);
    for (Block& block : blocks_) {
      // Each layer reads the concatenation of the block input and every earlier layer's output,
      // in that order (torchvision's torch.cat(inputs, 1)); the block returns all of them.
      std::vector<Var> feats = {h};
      for (DenseLayer& l : block.layers) {
        Var in = feats.size() == 1 ? feats[0] : concat_channels(ctx, feats);
        Var y = relu(ctx, (*l.norm1)(ctx, in, training, trace));
        y = relu(ctx, (*l.norm2)(ctx, (*l.conv1)(ctx, y, trace), training, trace));
        feats.push_back((*l.conv2)(ctx, y, trace));
      }
      h = traced(trace, block.name, "concat", concat_channels(ctx, feats));
      if (block.trans_conv) {
        h = (*block.trans_conv)(ctx, relu(ctx, (*block.trans_norm)(ctx, h, training, trace)), trace);
        PoolParams avg;  // AvgPool2d(kernel_size=2, stride=2)
        h = traced(trace, block.transition + ".pool", "avg_pool2d", avg_pool2d(ctx, h, avg));
      }
    }
    // forward(): features (ending at norm5) → F.relu → adaptive_avg_pool2d(1) → flatten → classifier.
    h = traced(trace, "relu", "relu", relu(ctx, (*norm5_)(ctx, h, training, trace)));
    h = traced(trace, "avgpool", "global_avg_pool", global_avg_pool(ctx, h));
    return (*classifier_)(ctx, h, trace);
  }

 private:
  struct DenseLayer {
    std::string name;
    BatchNorm2d* norm1 = nullptr;
    Conv2d* conv1 = nullptr;
    BatchNorm2d* norm2 = nullptr;
    Conv2d* conv2 = nullptr;
  };
  struct Block {
    std::string name, transition;
    std::vector<DenseLayer> layers;
    BatchNorm2d* trans_norm = nullptr;  // the transition after the block; none after the last
    Conv2d* trans_conv = nullptr;
  };
  int depth_;
  Conv2d* conv0_ = nullptr;
  BatchNorm2d* norm0_ = nullptr;
  MaxPool2d* pool0_ = nullptr;
  std::vector<Block> blocks_;
  BatchNorm2d* norm5_ = nullptr;
  Linear* classifier_ = nullptr;
};

}  // namespace

std::unique_ptr<Net> make_densenet(Context& ctx, const NetConfig& cfg, int depth) {
  return std::make_unique<DenseNet>(ctx, cfg, depth);
}

}  // namespace ditto::zoo
