// torchvision.models.vgg16 / vgg19 / vgg16_bn / vgg19_bn (nets.h documents them).
#include <fmt/format.h>

#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "nets/detail/families.h"
#include "nets/zoo.h"

namespace ditto::zoo {
namespace {

// torchvision's VGG, module for module. Names are torchvision's module paths: features.i counts
// every module of `features` (conv, bn, relu, pool), classifier.0/3/6 are the linears and
// classifier.2/5 the dropouts, so parameter names match torchvision's state_dict (less BN's
// num_batches_tracked). torchvision's AdaptiveAvgPool2d((7, 7)) between features and classifier
// is the identity when features end at 7x7, i.e. for inputs of 224..255 pixels a side (five
// floor-halving pools); any other input is a ShapeError, not a silent resize.
class Vgg : public ZooNet {
 public:
  static constexpr int kM = 0;  // a max pool in the configuration list
  Vgg(Context& ctx, const NetConfig& cfg, int depth, bool bn)
      : ZooNet({cfg.in_channels, 224, 255,
                fmt::format("Nx{}x224x224 by design: the classifier is sized for a 7x7 feature map, and "
                            "torchvision's adaptive 7x7 average pool, the identity there, is not implemented",
                            cfg.in_channels)}),
        depth_(depth),
        bn_(bn) {
    // torchvision's cfgs "D" (vgg16) and "E" (vgg19).
    static const std::vector<int> d = {64, 64, kM, 128, 128, kM, 256, 256, 256, kM, 512, 512, 512, kM,
                                       512, 512, 512, kM};
    static const std::vector<int> e = {64,  64,  kM,  128, 128, kM,  256, 256, 256, 256, kM,
                                       512, 512, 512, 512, kM,  512, 512, 512, 512, kM};
    int in = cfg.in_channels, index = 0;
    for (int width : depth == 16 ? d : e) {
      Stage s;
      if (width == kM) {
        s.pool = &add_max_pool(fmt::format("features.{}", index++), 2, 2, 0);
      } else {
        s.conv = &add_conv(ctx, fmt::format("features.{}", index++), in, width, 3, 1, 1, true, Init::HeNormal);
        if (bn_) s.bn = &add_bn(ctx, fmt::format("features.{}", index++), width);
        s.relu_name = fmt::format("features.{}", index++);
        in = width;
      }
      features_.push_back(std::move(s));
    }
    fc1_ = &add_linear(ctx, "classifier.0", 512 * 7 * 7, 4096, Init::HeNormal);
    drop1_ = &add_dropout("classifier.2", 0.5f);
    fc2_ = &add_linear(ctx, "classifier.3", 4096, 4096, Init::HeNormal);
    drop2_ = &add_dropout("classifier.5", 0.5f);
    fc3_ = &add_linear(ctx, "classifier.6", 4096, cfg.num_classes, Init::HeNormal);
  }
  std::string name() const override { return fmt::format("vgg{}{}", depth_, bn_ ? "-bn" : ""); }

  // torchvision VGG._initialize_weights: convs kaiming-normal fan_out, bias 0; BN 1 / 0;
  // linears normal(0, 0.01), bias 0.
  void init(Context& ctx, uint64_t seed) override {
    each_layer([&](Conv2d& c) { init_conv_he_fan_out(ctx, c, seed); }, [&](BatchNorm2d& bn) { reset_bn(ctx, bn); },
               [&](Linear& fc) { init_linear_normal(ctx, fc, 0.01, seed); });
  }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = x;
    for (const Stage& st : features_) {
      if (st.pool) {
        h = (*st.pool)(ctx, h, trace);
        continue;
      }
      h = (*st.conv)(ctx, h, trace);
      if (st.bn) h = (*st.bn)(ctx, h, training, trace);
      h = traced(trace, st.relu_name, "relu", relu(ctx, h));
    }
    h = traced(trace, "flatten", "flatten", flatten(ctx, h));
    h = traced(trace, "classifier.1", "relu", relu(ctx, (*fc1_)(ctx, h, trace)));
    h = (*drop1_)(ctx, h, training, seed_, step_, trace);
    h = traced(trace, "classifier.4", "relu", relu(ctx, (*fc2_)(ctx, h, trace)));
    h = (*drop2_)(ctx, h, training, seed_, step_, trace);
    return (*fc3_)(ctx, h, trace);
  }

 private:
  // One entry of `features`: a max pool, or conv (+ bn) + relu.
  struct Stage {
    Conv2d* conv = nullptr;
    BatchNorm2d* bn = nullptr;
    MaxPool2d* pool = nullptr;
    std::string relu_name;
  };
  int depth_;
  bool bn_;
  std::vector<Stage> features_;
  Linear* fc1_ = nullptr;
  Dropout* drop1_ = nullptr;
  Linear* fc2_ = nullptr;
  Dropout* drop2_ = nullptr;
  Linear* fc3_ = nullptr;
};

}  // namespace

std::unique_ptr<Net> make_vgg(Context& ctx, const NetConfig& cfg, int depth, bool batch_norm) {
  return std::make_unique<Vgg>(ctx, cfg, depth, batch_norm);
}

}  // namespace ditto::zoo
